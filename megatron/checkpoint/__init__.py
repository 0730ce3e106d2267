"""Checkpoint facts that every room reading or writing checkpoints shares (training, the
offline checkpoint tools, inference, the pre-flight). Imports only `megatron/config/` and
`megatron/model/`.

| module            | what it holds                                                           |
| ----------------- | ----------------------------------------------------------------------- |
| `folders`         | `global_step{N}` names, `latest`, completion markers, resume, pruning   |
| `deepspeed_files` | DeepSpeed's file names inside a checkpoint folder (ZeRO's among them)   |
| `safe_load`       | `torch.load` with weights only, and the refusal of an unsafe file       |
| `experts`         | the expert-parallel files' names, saved size, and reading them back     |
| `size`            | the bytes one checkpoint of a config takes (pre-flight and each save)   |
"""
