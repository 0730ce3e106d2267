"""Training: `pretrain(cfg)` assembles a run; each wing below is a folder with its own index.

    from megatron.training import pretrain
    pretrain(cfg)          # on every rank; train.py does this

| wing / module | what it holds                                                            |
| ------------- | ------------------------------------------------------------------------ |
| `pretrain`    | `pretrain(cfg)`: the set-up order, written once                          |
| `loop/`       | `TrainLoop`, its state and callbacks, evaluation, signals, profiling     |
| `step/`       | one step per engine kind, gradient norm, non-finite steps, loss scaling  |
| `setup/`      | model, engine, data and batches                                          |
| `optim/`      | the optimizer registry and our optimizers; `optim/lr/`: LR schedules     |
| `objectives/` | `train_impl` objectives (LM, DPO, KTO, RM) and the reference model      |
| `checkpoint/` | saving and loading with the engine, when to save, disk space, experts    |
| `metrics/`    | FLOPs, throughput, the start-up report and summary, loggers              |

Only `train.py` and `bench/` import this package; what other rooms share lives below it
(`megatron/checkpoint/`, `megatron/model/param_groups.py`, `megatron/launcher/worker.py`).
"""

from megatron.training.loop.train_loop import TrainResult
from megatron.training.pretrain import pretrain

__all__ = ["TrainResult", "pretrain"]
