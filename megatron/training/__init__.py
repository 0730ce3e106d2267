"""Training: the loop, optimizers, LR schedules, checkpoints, evaluation, metrics, loggers.

    from megatron.training import pretrain
    pretrain(cfg)          # on every rank; train.py does this

| module            | what it holds                                                      |
| ----------------- | ------------------------------------------------------------------ |
| `pretrain`        | `pretrain(cfg)` set-up and the short `TrainLoop`                   |
| `initialize`      | process group, topology, CPU threads, seeds                        |
| `engine_setup`    | model + optimizer + LR schedule → `deepspeed.initialize`           |
| `model_setup`     | the model for the engine, built partitioned under ZeRO-3          |
| `fp16_scaler`     | fp16 loss scaling as configured, on every engine path             |
| `data_setup`      | run length (`train_epochs`), datasets, per-rank batch iterators    |
| `batches`         | loader samples → `((tokens, positions), (labels, loss_mask))`      |
| `steps`           | one global batch on the pipeline or the plain engine               |
| `callbacks`       | logging, evaluation, checkpointing hung off the loop               |
| `evaluation`      | loss and perplexity over a split                                   |
| `checkpointing`   | save schedule, extra state, atomic `latest`, pruning, load         |
| `optimizers`      | optimizer registry and parameter groups (`optim/`: our optimizers) |
| `lr_schedules`    | warm-up and decay shapes                                           |
| `loss_scaling`    | the reported loss scale; the skipped-step guard                    |
| `flops`, `monitor`| FLOPs per token, tokens/s, TFLOP/s, MFU, ETA                       |
| `grad_norm`       | global gradient norm over tp and pp, clipping (fp32 without ZeRO)  |
| `norms`           | optional per-parameter norms (`log_param_norm`, `log_grad_norm`)  |
| `loggers/`        | console, metrics.jsonl, TensorBoard, wandb                         |
| `report`, `signals` | start-up report; SIGTERM/SIGINT → save and exit                  |
"""

from megatron.training.pretrain import TrainResult, pretrain

__all__ = ["TrainResult", "pretrain"]
