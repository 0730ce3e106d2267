"""`profile` and `memory_profiling`: the PyTorch profiler and memory records over a window of
iterations, as a training-loop callback.

The window is iterations [`profile_step_start`, `profile_step_stop`), numbered as in the
training log (iteration 1 is the first step of a run). Every rank writes its own files, named
`rank{R}.iters{A}-{B}...` with A..B the iterations they cover:

- `profile`: a Chrome trace of the window (`{log_dir}/profile/rank{R}.iters{A}-{B}.pt.trace.json`),
  which TensorBoard's profiler plugin and Perfetto (ui.perfetto.dev) open. Each iteration is a
  `ProfilerStep#N` span with N the iteration's number. The iteration before the window, when
  there is one, warms the profiler up unrecorded (its first recorded step would otherwise carry
  the profiler's own start-up cost).
- `memory_profiling` on a GPU: the CUDA caching allocator's history over the window, dumped as a
  snapshot (`{memory_profiling_path}/rank{R}.iters{A}-{B}.pickle`, for pytorch.org/memory_viz).
- `memory_profiling` on CPU, where that allocator history does not exist: the profiler records
  every allocation and free (`profile_memory`), written as its own trace
  (`{memory_profiling_path}/rank{R}.iters{A}-{B}.memory.pt.trace.json`; TensorBoard's memory
  view, or Perfetto's memory counters).

A run resumed inside the window profiles what is left of it; one resumed after it says so in
the log and profiles nothing.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.profiler import ProfilerAction, ProfilerActivity

from megatron.training.loop.callbacks import Callback

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProfileSettings:
    """What to profile, from `cfg.logging` (`from_config`)."""

    start: int
    stop: int
    trace_dir: Path | None  # None: no trace (`profile: false`)
    memory_dir: Path | None  # None: no memory record (`memory_profiling: false`)

    @classmethod
    def from_config(cls, cfg) -> ProfileSettings | None:
        lg = cfg.logging
        if not (lg.profile or lg.memory_profiling):
            return None
        return cls(
            start=lg.profile_step_start,
            stop=lg.profile_step_stop,
            trace_dir=Path(lg.log_dir) / "profile" if lg.profile else None,
            memory_dir=Path(lg.memory_profiling_path) if lg.memory_profiling else None,
        )


class WindowSchedule:
    """The profiler's schedule: step N is iteration N (`ProfilerCallback` sets the count)."""

    def __init__(self, start: int, stop: int):
        self.start, self.stop = start, stop

    def __call__(self, step: int) -> ProfilerAction:
        if step == self.start - 1:
            return ProfilerAction.WARMUP
        if self.start <= step < self.stop - 1:
            return ProfilerAction.RECORD
        if step == self.stop - 1:
            return ProfilerAction.RECORD_AND_SAVE
        return ProfilerAction.NONE


class ProfilerCallback(Callback):
    """Starts and steps the profiler and the CUDA memory history around the window."""

    def __init__(self, settings: ProfileSettings, rank: int, on_cuda: bool | None = None):
        self.settings = settings
        self.rank = rank
        self.on_cuda = torch.cuda.is_available() if on_cuda is None else on_cuda
        self.cuda_memory = settings.memory_dir is not None and self.on_cuda
        self.cpu_memory = settings.memory_dir is not None and not self.on_cuda
        self.profiler = None
        self.first = settings.start  # first and last iteration of the window this run covers
        self.last = settings.stop - 1
        self.recording_memory = False

    def _name(self, suffix: str) -> str:
        return f"rank{self.rank}.iters{self.first}-{self.last}{suffix}"

    def on_start(self, loop):
        s = self.settings
        next_iteration = loop.state.iteration + 1
        if next_iteration >= s.stop:
            loop.loggers.log_text(
                f"profiling: iterations {s.start}-{s.stop - 1} were run before this (resumed) "
                "run started; nothing is profiled"
            )
            return
        self.first = max(s.start, next_iteration)
        if s.trace_dir is not None or self.cpu_memory:
            self.profiler = self._make_profiler()
            # Count steps as iterations (ProfilerStep#N is iteration N); the profiler asked
            # its schedule about step 0 when it was made, so ask again for this step.
            self.profiler.step_num = next_iteration
            self.profiler.current_action = self.profiler.schedule(next_iteration)
            self.profiler.start()
        self._before(next_iteration)

    def after_step(self, loop):
        if self.profiler is not None:
            self.profiler.step()
        self._before(loop.state.iteration + 1)

    def on_end(self, loop, stopped):
        it, start = loop.state.iteration, self.settings.start
        if it < start:  # the window was still ahead: say so
            loop.loggers.log_text(
                f"profiling: training ended at iteration {it}, before profile_step_start "
                f"{start}; nothing was profiled"
            )
        self._finish(it + 1)

    def on_abort(self, loop, error):
        self._finish(loop.state.iteration + 1)

    def _make_profiler(self):
        activities = [ProfilerActivity.CPU]
        if self.on_cuda:
            activities.append(ProfilerActivity.CUDA)
        return torch.profiler.profile(
            activities=activities,
            schedule=WindowSchedule(self.settings.start, self.settings.stop),
            on_trace_ready=self._write_traces,
            record_shapes=True,
            with_flops=True,
            profile_memory=self.cpu_memory,
        )

    def _write_traces(self, profiler) -> None:
        s, written = self.settings, []
        if s.trace_dir is not None:
            written.append(s.trace_dir / self._name(".pt.trace.json"))
        if self.cpu_memory:
            written.append(s.memory_dir / self._name(".memory.pt.trace.json"))
        written[0].parent.mkdir(parents=True, exist_ok=True)
        profiler.export_chrome_trace(str(written[0]))
        for path in written[1:]:  # the same trace, which holds the memory events too
            path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(written[0], path)
        log.info("profiler traces written: %s", ", ".join(map(str, written)))

    def _before(self, iteration: int) -> None:
        """Called before `iteration` runs: the CUDA memory history spans the window."""
        if not self.cuda_memory:
            return
        if iteration == self.first and not self.recording_memory:
            torch.cuda.memory._record_memory_history(max_entries=1_000_000)
            self.recording_memory = True
        elif iteration == self.settings.stop:
            self._dump_memory()

    def _dump_memory(self) -> None:
        if not self.recording_memory:
            return
        path = self.settings.memory_dir / self._name(".pickle")
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.cuda.memory._dump_snapshot(str(path))
        torch.cuda.memory._record_memory_history(enabled=None)
        self.recording_memory = False
        log.info("CUDA memory snapshot written: %s", path)

    def _finish(self, next_iteration: int) -> None:
        """Training ended, possibly inside the window: keep what was recorded."""
        self.last = min(self.last, next_iteration - 1)
        if self.profiler is not None:
            self.profiler.stop()  # inside the window this writes the partial trace
            self.profiler = None
        self._dump_memory()
