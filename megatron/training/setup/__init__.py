"""Building what a run trains: model, engine, data.

| module         | what it holds                                                       |
| -------------- | ------------------------------------------------------------------- |
| `engine`       | model + optimizer + LR schedule → `deepspeed.initialize`            |
| `model`        | the model for the engine, built partitioned under ZeRO-3            |
| `data`         | run length (`train_epochs`), datasets, per-rank batch iterators     |
| `batches`      | loader samples → `((tokens, positions), (labels, loss_mask))`       |
| `resume_vocab` | a resumed run's padded vocabulary: its checkpoint's where it fits   |
"""
