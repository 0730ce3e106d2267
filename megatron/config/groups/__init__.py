"""The config groups: one frozen dataclass per concern, a docstring under every field, and the
checks that read only that group beside it. `megatron/config/config.py::Config` holds one of
each; every flat key of a config file belongs to exactly one.

| module          | group                                                                  |
| --------------- | ---------------------------------------------------------------------- |
| `model`         | architecture: sizes, attention, positions, norms, activations, head    |
| `rope_scaling`  | the `rope_scaling` rules of `model` and the fields each one takes     |
| `moe`           | mixture of experts: experts, routing, capacity, router losses         |
| `parallel`      | tensor, pipeline and data parallelism, ZeRO, the backend               |
| `optimizer`     | the optimizer and the table of optimizer facts (`OPTIMIZER_TYPES`)     |
| `lr`            | warm-up, decay, LR cycles                                              |
| `precision`     | fp32, fp16 loss scaling, bf16                                          |
| `data`          | data paths, splits, blending, packing, loaders                         |
| `tokenizer`     | the tokenizer and vocabulary padding                                   |
| `training`      | batch sizes, iterations, evaluation, seeds                             |
| `post_training` | `train_impl` (SFT, DPO, KTO, RM) and its coefficients                  |
| `checkpointing` | save, load, schedule, keep policy                                      |
| `logging`       | console, metrics, TensorBoard, wandb, profiling                        |
| `launcher`      | hosts, launcher backend, ports, secrets                                |
| `generation`    | `generate.py`'s sampling and prompts                                   |
| `deepspeed`     | sections passed to DeepSpeed                                           |
| `planning`      | the GPU and links the memory and step-time plan assumes                |
"""
