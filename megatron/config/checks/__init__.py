"""Checks that read several config groups at once, run after derivation
(`megatron/config/resolve.py`); a check of one group lives beside it in `groups/`.

| module              | what it refuses                                                       |
| ------------------- | --------------------------------------------------------------------- |
| `validate`          | the cross-field rules: layout, batch, schedule, precision, checkpoints |
| `data`              | data keys that cannot work together (splits, weights, post-training)   |
| `optimizer_engines` | optimizers that need whole parameters on engines that split them      |
| `torch_compile`     | what `torch_compile` cannot be combined with                          |
| `device_syncs`      | (warns) switches that make the device wait without changing a result   |
"""
