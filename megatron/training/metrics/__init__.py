"""What a run reports, and where it goes.

| module     | what it holds                                                           |
| ---------- | ----------------------------------------------------------------------- |
| `flops`    | FLOPs per token and per step, peak TFLOP/s, what each objective counts |
| `monitor`  | tokens/s, TFLOP/s, MFU and ETA over a log interval                      |
| `report`   | the start-up report and the run summary                                 |
| `norms`    | optional per-parameter norms (`log_param_norm`, `log_grad_norm`)        |
| `loggers/` | console, metrics.jsonl, TensorBoard, wandb                              |
"""
