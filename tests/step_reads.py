"""Host reads per optimizer step of the real trainer (`pretrain`), counted on the CPU.

`count_runs(rank, world_size, runs)` (a `run_distributed` worker) trains each run's flat config
keys with `pretrain`, the one assembly `train.py` uses, so whatever a config switches on
(logging callbacks, the checkpoint time policy, the curriculum, the reference model of DPO and
KTO) is in what is counted. A callback appended after the run's own counts, with
`tests/device_costs.py::HostReads`, the `STEPS` whole iterations that follow `WARMUP` ones
(the warm-up builds what later steps reuse): the train step, every callback and the loop's
stop question. Then it ends the run (`Counted`), so no end-of-run evaluation or save is paid.

What a CPU cannot tell apart: a read of a tensor that lives on the host on a GPU too (a value
`megatron/parallel/host_values.py` handed back) counts like a read of a device value; and with
gloo those helpers reduce on the host, where NCCL would copy to the device and back (a wait
this counter does not see). The table's reasons say which reads are of the first kind.

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

        def __init__(self):
            self.reads, self.counting, self.applied = None, False, []

        def after_step(self, loop):
            if loop.state.iteration == WARMUP:
                self.reads = HostReads(exempt=step_counters(loop.engine.optimizer))
                self.reads.__enter__()
                self.counting = True
            elif self.counting:
                self.applied.append(loop.last_applied)
            if loop.state.iteration == WARMUP + STEPS:
                self.stop()
                raise Counted

        def stop(self):
            if self.counting:
                self.reads.__exit__(None, None, None)
                self.counting = False

    return CountSteps()


def _per_step(counter) -> dict:
    """Reads and synchronisations per step, the places that read, most first (DeepSpeed's
    files named from the package, not the environment), and whether each step was applied
    (a skipped step takes another path)."""
    reads = counter.reads
    syncs = reads.kinds["synchronize"]
    where = reads.report().replace(_SITE_PACKAGES, "")
    per_step = dict(reads=(reads.count - syncs) / STEPS, syncs=syncs / STEPS, where=where)
    return dict(per_step, applied=counter.applied)


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
        return _per_step(counter)
    except Exception as error:  # noqa: BLE001 - the case fails with it, the others still run
        counter.stop()  # a run that failed while counted leaves no counter on for the next
        return dict(error=f"{type(error).__name__}: {error}")
    finally:
        module._callbacks = callbacks
    return dict(error="the run ended before its steps were counted")


def count_runs(rank, world_size, runs: dict) -> dict:
    """`count_run` of each `{name: settings}` (a run that raises gives its error's text), with
    fp16 allowed on the CPU (`test_fp16_engine_scaling.py`: DeepSpeed's capability check)."""
    from tests.unit.training.test_fp16_engine_scaling import _allow_fp16_on_cpu

    _allow_fp16_on_cpu()
    out = {}
    for name, settings in runs.items():
        out[name] = count_run(settings, world_size)
    return out
