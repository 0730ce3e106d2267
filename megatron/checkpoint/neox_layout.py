"""GPT-NeoX's names for the plain engine's weights, where they differ from the model's own.

The pipeline engine's files need no translation: our layer list is GPT-NeoX's, index for index
(`megatron/model/specs.py`), so DeepSpeed names `layer_{index:02d}-model_{tp:02d}-...` as
GPT-NeoX's engine does and stores the same names inside them.

Without a pipeline (`pipe_parallel_size: 0`) GPT-NeoX trains `GPT2ModelPipe.to_sequential()`:
the same layers in an `nn.Sequential` called `sequential` (the functions wrapped in
parameter-free modules, the tied head a function of the embedding), so the `module` entry of
its `mp_rank_{t:02d}_model_states.pt` names every tensor `sequential.{index}.{name}`, the tied
embedding included (`sequential.0.word_embeddings.weight`). Our plain model names the same
tensors as the pipeline module does (`{index}.{name}`, `tied_modules.embed.{name}`), so the
`module` entry is written in GPT-NeoX's names (`to_sequential`) and read back from them
(`from_sequential`), by the engine (`megatron/training/checkpoint/checkpoint_io.py`) and by the
checkpoint tools alike. Where DeepSpeed saves names alone (`param_shapes`, which name the ZeRO
partitions and the optimizer groups), `our_param_name` reads one of GPT-NeoX's: the resume's
check of its groups (`neox_resume.py`) and the checkpoint tools' reading of its ZeRO state
(`CheckpointReader.current_name`) both use it.

GPT-NeoX's loader also reads two entries of each `mp_rank` file that DeepSpeed does not write:
`iteration` and `args` (`neox_entries`), and, unless the run loads no RNG state, its RNG
states (`random_rng_state`, `np_rng_state`, `torch_rng_state`, `cuda_rng_state`,
`rng_tracker_states`: the training side writes them, `neox_files.py`). And they read the
checkpoint's `config.json` as YAML (`config_json`).
"""

from __future__ import annotations

import json
import math

from megatron.config.groups.model import recorded_intermediate_size
from megatron.model.neox_names import our_name
from megatron.model.specs import EMBED_KEY

SEQUENTIAL = "sequential."
TIED = f"tied_modules.{EMBED_KEY}."


def to_sequential(module: dict) -> dict:
    """Our plain model's state dict under GPT-NeoX's sequential names."""
    out = {}
    for name, value in module.items():
        local = name[len(TIED) :] if name.startswith(TIED) else None
        out[f"{SEQUENTIAL}0.{local}" if local is not None else SEQUENTIAL + name] = value
    return out


def from_sequential(module: dict, tied: bool) -> dict:
    """GPT-NeoX's sequential names back to ours (`tied`: the model ties its embedding)."""
    out = {}
    for name, value in module.items():
        if not name.startswith(SEQUENTIAL):
            raise ValueError(
                f"'{name}' is not a GPT-NeoX sequential name ('{SEQUENTIAL}{{index}}.{{name}}')"
            )
        ours = name[len(SEQUENTIAL) :]
        if tied and ours.startswith("0."):
            ours = TIED + ours[2:]
        out[ours] = value
    return out


def our_param_name(name: str, tied: bool) -> str:
    """A parameter's name as an engine of GPT-NeoX's records it (DeepSpeed's `param_shapes`,
    which name the ZeRO partitions: the plain engine's sequential names, GPT-NeoX's tensor
    names, `megatron/model/neox_names.py::our_name`) as ours names it (`tied`: the model ties
    its embedding); our own names come back unchanged."""
    if name.startswith(SEQUENTIAL):
        (name,) = from_sequential({name: None}, tied)
    return our_name(name)


def is_sequential(names) -> bool:
    """Whether a `module` entry's names (or the entry) are GPT-NeoX's sequential names."""
    names = list(names)
    return bool(names) and all(name.startswith(SEQUENTIAL) for name in names)


NEOX_ARGS = (
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "max_position_embeddings",
    "make_vocab_size_divisible_by",
    "padded_vocab_size",
    "tokenizer_type",
    "model_parallel_size",
)
"""The config values GPT-NeoX's loader compares with its own run (`args` of an mp_rank file)."""


def neox_entries(config_dict: dict | None, iteration: int) -> dict:
    """The entries GPT-NeoX's loader reads from every `mp_rank_{m:02d}_model_states.pt` beside
    DeepSpeed's own: `iteration` (where the run resumes) and `args` (checked against its
    config; left out when the config is unknown)."""
    out: dict = {"iteration": iteration}
    if config_dict is not None:
        out["args"] = {key: config_dict.get(key) for key in NEOX_ARGS}
    return out


def config_json(config_dict: dict) -> str:
    """`config.json`'s text: JSON that YAML 1.1 reads to the same values, since GPT-NeoX's
    tools read a config with PyYAML (`--config_file`). YAML 1.1 reads an exponent without a
    decimal point (`1e-05`, how Python's `json` writes 0.00001) as a string, so every float
    is written with one (`1.0e-05`, still JSON); `intermediate_size` is written as a number
    (`recorded_intermediate_size`), which GPT-NeoX's converter needs."""
    size = recorded_intermediate_size(config_dict)
    return _dumps({**config_dict, "intermediate_size": size} if size else config_dict, 0)


def _dumps(value, depth: int) -> str:
    pad, inner = " " * depth, " " * (depth + 1)
    if isinstance(value, dict) and value:
        items = [f"{inner}{json.dumps(str(k))}: {_dumps(v, depth + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(value, (list, tuple)) and value:
        items = [f"{inner}{_dumps(v, depth + 1)}" for v in value]
        return "[\n" + ",\n".join(items) + f"\n{pad}]"
    if isinstance(value, float) and math.isfinite(value):
        text = repr(value)
        mantissa, e, exponent = text.partition("e")
        return f"{mantissa}.0e{exponent}" if e and "." not in mantissa else text
    return json.dumps(value)
