"""DeepSpeed 0.19's file names inside a `global_step{N}` folder, each written once here for
everything that reads or writes those files without an engine (the checkpoint tools, the
pre-flight). A test holds them to DeepSpeed's own naming.

- `layer_{i:02d}-model_{t:02d}-model_states.pt`: the pipeline engine's weights of layer `i`
  at tensor-parallel rank `t`;
- `mp_rank_{m:02d}_model_states.pt`: the engine state of model-parallel rank `m` (not with
  ZeRO-3), with the plain engine's module and, without ZeRO, the optimizer state;
- `zero_pp_rank_{d}_mp_rank_{m:02d}_model_states.pt`: under ZeRO-3, the engine state, one per
  data-parallel rank `d`;
- `[bf16_]zero_pp_rank_{d}_mp_rank_{m:02d}_optim_states.pt`: under ZeRO 1-3 (and DeepSpeed's
  bf16 optimizer), rank `d`'s flat optimizer partitions.

The functions write a name; the patterns match one and capture its ranks in the order the
name gives them.
"""

from __future__ import annotations

import re

LAYER_FILE = re.compile(r"^layer_(\d+)-model_(\d+)-model_states\.pt$")
"""Groups: layer, tensor-parallel rank."""
MP_RANK_FILE = re.compile(r"^mp_rank_(\d+)_model_states\.pt$")
"""Group: model-parallel rank."""
ZERO_MODEL_FILE = re.compile(r"^zero_pp_rank_(\d+)_mp_rank_(\d+)_model_states\.pt$")
"""Groups: data-parallel rank, model-parallel rank."""
ZERO_OPTIM_FILE = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
"""Groups: data-parallel rank, model-parallel rank."""


def layer_file(layer: int, tp_rank: int) -> str:
    return f"layer_{layer:02d}-model_{tp_rank:02d}-model_states.pt"


def mp_rank_file(mp_rank: int) -> str:
    return f"mp_rank_{mp_rank:02d}_model_states.pt"


def zero_model_file(mp_rank: int, dp_rank: int = 0) -> str:
    """A ZeRO-3 engine-state file; data-parallel rank 0's is the one the readers open."""
    return f"zero_pp_rank_{dp_rank}_mp_rank_{mp_rank:02d}_model_states.pt"
