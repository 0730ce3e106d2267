"""The training loop and what hangs off it.

| module        | what it holds                                                       |
| ------------- | ------------------------------------------------------------------- |
| `train_loop`  | `TrainLoop` (a short generic loop), `TrainState`, `TrainResult`     |
| `callbacks`   | logging, evaluation, skipped-step counting, checkpointing           |
| `evaluation`  | loss and perplexity (or an objective's metrics) over a split       |
| `signals`     | SIGTERM/SIGINT: finish the step, save, exit                         |
| `profiling`   | the torch profiler / memory snapshot window as a callback           |
"""
