"""`ProfilerCallback` in the real `TrainLoop` (single process, a small torch step): the trace
holds exactly the window's iterations under their own numbers, from the first step on, and a
run resumed inside the window traces only what is left of it;
a run that ends before the window, or resumes after it, says that nothing was profiled."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from megatron.training.loop.profiling import ProfilerCallback, ProfileSettings
from megatron.training.loop.train_loop import TrainLoop, TrainState


class _Steps:
    step_applied = True

    def __init__(self):
        self.model = torch.nn.Linear(16, 16)

    def train(self, batches) -> torch.Tensor:
        loss = self.model(torch.randn(4, 16)).square().mean()
        loss.backward()
        return loss.detach()


class _Loggers:
    def __init__(self):
        self.lines: list[str] = []

    def log_text(self, text: str) -> None:
        self.lines.append(text)


def _run(tmp_path: Path, done: int, train_iters: int, start: int, stop: int) -> list[str]:
    settings = ProfileSettings(start, stop, tmp_path / "profile", None)
    loggers = _Loggers()
    TrainLoop(
        steps=_Steps(),
        engine=None,
        lr_scheduler=None,
        batches=None,
        state=TrainState(iteration=done),
        train_iters=train_iters,
        global_batch=4,
        guard=None,
        loggers=loggers,
        callbacks=[ProfilerCallback(settings, rank=3, on_cuda=False)],
    ).run()
    return loggers.lines


@pytest.mark.parametrize(
    "done, start, stop, first, last",
    [(3, 2, 6, 4, 5), (0, 1, 3, 1, 2), (0, 3, 5, 3, 4)],
    ids=["resumed-inside", "from-the-first-step", "fresh"],
)
def test_trace_holds_the_window_this_run_covers(tmp_path, done, start, stop, first, last):
    assert _run(tmp_path, done=done, train_iters=8, start=start, stop=stop) == []
    (trace,) = (tmp_path / "profile").iterdir()
    assert trace.name == f"rank3.iters{first}-{last}.pt.trace.json"
    events = json.loads(trace.read_text())["traceEvents"]
    steps = {e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")}
    assert steps == {f"ProfilerStep#{i}" for i in range(first, last + 1)}
    assert any(e.get("name") == "aten::addmm" for e in events)  # the step's own work


def test_window_never_reached_is_reported(tmp_path):
    before = _run(tmp_path, done=0, train_iters=2, start=5, stop=7)
    after = _run(tmp_path, done=7, train_iters=8, start=2, stop=4)
    assert not (tmp_path / "profile").exists()
    assert len(before) == 1 and "before profile_step_start 5" in before[0]
    assert len(after) == 1 and "nothing is profiled" in after[0]
