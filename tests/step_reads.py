"""Host reads per optimizer step of the real trainer (`pretrain`), counted on the CPU.

`count_runs(rank, world_size, runs)` (a `run_distributed` worker) trains each run's flat config
keys with `pretrain`, the one assembly `train.py` uses, so whatever a config switches on
(logging callbacks, the checkpoint time policy, the curriculum, the reference model of DPO and
KTO) is in what is counted. A callback appended after the run's own counts, with
`tests/device_costs.py::HostReads`, the `STEPS` whole iterations that follow `WARMUP` ones
(the warm-up builds what later steps reuse): the train step, every callback and the loop's
stop question. Then it ends the run (`Counted`), so no end-of-run evaluation or save is paid.

Torch optimizers keep their step counters on the host on every device; those are exempt, as in
`tests/unit/training/test_host_syncs.py`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from tests.device_costs import HostReads

WARMUP, STEPS = 1, 2
_SITE_PACKAGES = str(Path(torch.__file__).parents[1]) + "/"


class Counted(Exception):
    """Ends a run once its steps are counted."""


def step_counters(optimizer) -> list[torch.Tensor]:
    """The `step` tensors of `optimizer` and of the optimizers it wraps (`.optimizer`)."""
    found, seen = [], set()
    while optimizer is not None and id(optimizer) not in seen:
        seen.add(id(optimizer))
        state = getattr(optimizer, "state", None)
        for entry in state.values() if isinstance(state, dict) else ():
            if isinstance(entry, dict) and torch.is_tensor(entry.get("step")):
                found.append(entry["step"])
        optimizer = getattr(optimizer, "optimizer", None)
    return found


def _counting_callback():
    from megatron.training.loop.callbacks import Callback

    class CountSteps(Callback):
        """Counts from the end of iteration `WARMUP` to the end of `WARMUP + STEPS`."""

        reads, counting = None, False

        def after_step(self, loop):
            if loop.state.iteration == WARMUP:
                self.reads = HostReads(exempt=step_counters(loop.engine.optimizer))
                self.reads.__enter__()
                self.counting = True
            elif loop.state.iteration == WARMUP + STEPS:
                self.stop()
                raise Counted

        def stop(self):
            if self.counting:
                self.reads.__exit__(None, None, None)
                self.counting = False

    return CountSteps()


def _per_step(reads: HostReads) -> dict:
    """Reads and synchronisations per step, and the places that read, most first (DeepSpeed's
    files named from the package, not the environment)."""
    syncs = reads.kinds["synchronize"]
    where = reads.report().replace(_SITE_PACKAGES, "")
    return dict(reads=(reads.count - syncs) / STEPS, syncs=syncs / STEPS, where=where)


def count_run(settings: dict, world_size: int) -> dict:
    """`_per_step` of a `pretrain` run of the flat config keys `settings`."""
    from megatron.training import pretrain
    from tests.tiny import resolve

    module = sys.modules["megatron.training.pretrain"]
    counter, callbacks = _counting_callback(), module._callbacks
    module._callbacks = lambda *args, **kwargs: callbacks(*args, **kwargs) + [counter]
    try:
        pretrain(resolve(settings, world_size))
    except Counted:
        return _per_step(counter.reads)
    except Exception as error:  # noqa: BLE001 - the case fails with it, the others still run
        counter.stop()  # a run that failed while counted leaves no counter on for the next
        return dict(error=f"{type(error).__name__}: {error}")
    finally:
        module._callbacks = callbacks
    return dict(error="the run ended before its steps were counted")


def allow_fp16_on_cpu() -> None:
    """DeepSpeed refuses fp16 on a CPU without native fp16 kernels, a capability check: torch
    computes fp16 on any CPU (as `tests/unit/training/test_fp16_engine_scaling.py` does)."""
    from deepspeed.accelerator import get_accelerator

    type(get_accelerator()).is_fp16_supported = lambda self: True


def count_runs(rank, world_size, runs: dict) -> dict:
    """`count_run` of each `{name: settings}`; a run that raises gives its error's text."""
    allow_fp16_on_cpu()
    out = {}
    for name, settings in runs.items():
        out[name] = count_run(settings, world_size)
    return out
