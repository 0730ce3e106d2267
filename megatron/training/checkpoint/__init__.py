"""Saving and loading a training run's checkpoints (with the DeepSpeed engine).

| module          | what it holds                                                             |
| --------------- | ------------------------------------------------------------------------- |
| `checkpoint_io` | `CheckpointIO`: DeepSpeed's states, trainer state, RNG, config; `latest` |
| `policy`        | when to save and of which kind: `SaveSchedule`, `CheckpointPolicy`        |
| `disk_space`    | room for a checkpoint before each save; a failed save stops the run       |
| `experts`       | the expert slices DeepSpeed's own files lack (`ExpertCheckpoint`)         |

File names and folder rules are `megatron/checkpoint/`'s, shared with the offline tools.
"""
