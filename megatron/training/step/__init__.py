"""One optimizer step: the engine's step and the policies around it.

| module         | what it holds                                                         |
| -------------- | --------------------------------------------------------------------- |
| `steps`        | one global batch on the pipeline or the plain engine                  |
| `grad_norm`    | the global gradient norm over tp, pp and experts; clipping by it      |
| `nonfinite`    | a step whose loss or gradient norm is inf/NaN is skipped on every rank |
| `loss_scaling` | the reported loss scale; the stop after too many skipped steps       |
| `fp16_scaler`  | fp16 loss scaling as configured, on every engine path                |
| `moe_grads`    | expert gradients and router losses (mixture of experts)              |
"""
