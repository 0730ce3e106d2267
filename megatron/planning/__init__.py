"""The plan of a run before launch: what each rank of each pipeline stage holds, and a step's
time, from the model the config really builds (`deepy.py --dry-run`, `tools/plan.py`).

| module        | what it holds                                                            |
| ------------- | ------------------------------------------------------------------------ |
| `trace`       | live and saved bytes of the tensors ops make (`meta` or real)            |
| `routes`      | the kernels a device runs where `meta` would take another path           |
| `stages`      | the model on `meta` at one rank's shapes, cut into DeepSpeed's stages    |
| `parts`       | one part of a stage traced forward and backward                          |
| `activations` | a stage's activation bytes: layers, checkpointing, the 1F1B schedule     |
| `states`      | the model states of DeepSpeed's optimizer wrapper for the config         |
| `steptime`    | the step-time estimate: matrix work and collectives                      |
| `gpus`        | the GPUs a plan can be for                                               |
| `plan`        | `plan_run(cfg)`: the stages' plans together                              |
"""
