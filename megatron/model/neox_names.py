"""GPT-NeoX's current tensor names and layouts inside a layer, read as ours.

Our layers store what older GPT-NeoX stored (its Pythia checkpoints, its HF-to-sequential
converter): `mlp.dense_h_to_4h`, `mlp.dense_4h_to_h`, norms' `weight`; GPT-NeoX's converter
reads those. GPT-NeoX's current trainer writes other names, and for Llama-style models other
layouts, per tensor-parallel rank (its `ParallelMLP`, `Gated_Activation`, `RMSNorm` and
`ParallelSelfAttention.gqa_project`):

| GPT-NeoX now                      | ours                                                    |
| --------------------------------- | ------------------------------------------------------- |
| `mlp.linear1.*` (plain MLP)       | `mlp.dense_h_to_4h.*`                                   |
| `mlp.linear1.*` (gated MLP)       | rows `[:half]` `mlp.dense_h_to_4h.*` (the value), rows  |
|                                   | `[half:]` `mlp.dense_h_to_4h_gate.*` (the gate)         |
| `mlp.linear2.*`                   | `mlp.dense_4h_to_h.*`                                   |
| `*norm.scale` (RMSNorm)           | `*norm.weight`                                          |
| `attention.query_key_value.*` with key/value heads fewer than query heads: rows           |
| `[q of all local heads, k, v]`    | grouped per key/value head, `(nkv, nq/nkv + 2, d)`      |

(Without grouped-query attention both store `query_key_value` per head as `[q | k | v]`.) The
grouped-query rows tell no name apart, so they are reordered when the layer is in GPT-NeoX's
current names (`linear1`, `linear2` or `scale` present), which our checkpoints never use.

Three tensors of GPT-NeoX's are named alike by both of its trainers and are saved under its
names by ours too (`SAVED_AS_NEOX`, a state-dict hook), so GPT-NeoX reads our files and we
read its: T5's relative bias table `attention.rpe.weight` (ours `attention.positions.weight`)
and the gMLP spatial projection `sgu.proj.{weight,bias}` (ours `sgu.spatial_{weight,bias}`).
GPT-NeoX's gMLP projections also hold biases its forward discards (`input_linear.bias`,
`output_linear.bias`): dropped on reading, saved as zeros (`megatron/model/gmlp.py`).
Buffers GPT-NeoX saves and we compute (`inv_freq` of its sinusoidal and, with
`rotary_save_freqs_buffer`, rotary encodings; ALiBi's `slopes`) are dropped.

`from_neox` converts one rank's state (any keys: a layer file, or a whole plain model's);
`accept_neox_names` registers it as a load pre-hook on a layer, so DeepSpeed's loads (per-layer
files and the plain engine's module) read GPT-NeoX's files directly; the checkpoint tools call
`from_neox` on what they read. `our_name` renames one tensor, as where only names are saved
(DeepSpeed's `param_shapes`, which name GPT-NeoX's ZeRO partitions and optimizer groups:
`megatron/checkpoint/neox_layout.py::our_param_name`); `reordered_by_neox` says when that is
not enough, the tensors being cut or reordered too.
"""

from __future__ import annotations

import re

import torch

from megatron.model.activations import build_activation
from megatron.model.args import ModelArgs

_NEOX_ONLY = re.compile(
    r"(^|\.)(mlp\.linear[12]\.|[a-z_]*norm\.scale$)|" + r"(inv_freq|alibi_embed\.slopes)$"
)
_RECOMPUTED = re.compile(r"(inv_freq|alibi_embed\.slopes)$")
SAVED_AS_NEOX = {
    "attention.positions.weight": "attention.rpe.weight",
    "sgu.spatial_weight": "sgu.proj.weight",
    "sgu.spatial_bias": "sgu.proj.bias",
}
"""Our name -> GPT-NeoX's, for the tensors saved under GPT-NeoX's names (module docstring)."""
UNUSED_NEOX_BIASES = re.compile(r"(^|\.)(input_linear|output_linear)\.bias$")
"""GPT-NeoX's gMLP biases that its forward never adds."""


def _rename(name: str, table: dict) -> str:
    for old, new in table.items():
        if name == old or name.endswith("." + old):
            return name[: len(name) - len(old)] + new
    return name


def in_neox_names(state) -> bool:
    """Whether any key is one of GPT-NeoX's current names (module docstring)."""
    return any(_NEOX_ONLY.search(name) for name in state)


def our_name(name: str) -> str:
    """A tensor's name in either of GPT-NeoX's trainers' names as ours (`SAVED_AS_NEOX`, and
    its current names: a gated `linear1` becomes its value half's, `dense_h_to_4h`); ours come
    back unchanged."""
    name = _rename(name, {v: k for k, v in SAVED_AS_NEOX.items()})
    name = name.replace(".linear1.", ".dense_h_to_4h.").replace(".linear2.", ".dense_4h_to_h.")
    return name[: -len("scale")] + "weight" if name.endswith("norm.scale") else name


def reordered_by_neox(names, args: ModelArgs) -> str:
    """Which of GPT-NeoX's tensors under `names` (one rank's, in GPT-NeoX's current names) are
    not ours element for element once renamed, since `from_neox` cuts or reorders them: a
    gated MLP's `linear1` (value and gate in one tensor), grouped-query `query_key_value` rows;
    "" when none is."""
    names = list(names)
    if not in_neox_names(names):
        return ""
    if build_activation(args.activation).gated and any(".linear1." in n for n in names):
        return "a gated MLP's mlp.linear1, which holds the up and gate projections in one tensor"
    grouped = args.kv_heads != args.num_attention_heads
    if grouped and any("attention.query_key_value." in n for n in names):
        return "grouped-query attention's query_key_value, whose rows GPT-NeoX orders otherwise"
    return ""


def _grouped_qkv(rows: torch.Tensor, args: ModelArgs) -> torch.Tensor:
    """One rank's GPT-NeoX grouped-query `[q | k | v]` rows in our per-group order."""
    per_kv, d = args.num_attention_heads // args.kv_heads, args.head_dim
    kv_local = rows.shape[0] // ((per_kv + 2) * d)
    q, k, v = rows.split([kv_local * per_kv * d, kv_local * d, kv_local * d])
    tail = rows.shape[1:]
    parts = (q.view(kv_local, per_kv * d, *tail), k.view(kv_local, d, *tail))
    return torch.cat((*parts, v.view(kv_local, d, *tail)), dim=1).reshape(rows.shape)


def from_neox(state: dict, args: ModelArgs) -> dict:
    """One tensor-parallel rank's tensors under our names and layouts (module docstring): the
    names both GPT-NeoX trainers share with ours always, the rest where the state is in
    GPT-NeoX's current names."""
    ours = {v: k for k, v in SAVED_AS_NEOX.items()}
    state = {_rename(k, ours): v for k, v in state.items() if not UNUSED_NEOX_BIASES.search(k)}
    if not in_neox_names(state):
        return state
    gated = build_activation(args.activation).gated
    grouped = args.kv_heads != args.num_attention_heads
    out = {}
    for name, value in state.items():
        if _RECOMPUTED.search(name):
            continue
        ours = our_name(name)
        if gated and ".linear1." in name:
            value, gate = value.chunk(2, dim=0)
            out[ours.replace(".dense_h_to_4h.", ".dense_h_to_4h_gate.")] = gate.clone()
            value = value.clone()
        elif grouped and "attention.query_key_value." in name:
            value = _grouped_qkv(value, args)
        out[ours] = value
    return out


def accept_neox_names(module: torch.nn.Module, args: ModelArgs) -> None:
    """Let `module` load a state in GPT-NeoX's names (its keys under the prefix), and save the
    tensors of `SAVED_AS_NEOX` under them."""

    def load(_module, state_dict, prefix, *_):
        own = {k[len(prefix) :]: state_dict[k] for k in list(state_dict) if k.startswith(prefix)}
        converted = from_neox(own, args)
        for key in own:
            del state_dict[prefix + key]
        state_dict.update({prefix + k: v for k, v in converted.items()})

    def save(_module, state_dict, prefix, _metadata):
        for key in [k for k in state_dict if k.startswith(prefix)]:
            renamed = prefix + _rename(key[len(prefix) :], SAVED_AS_NEOX)
            if renamed != key:
                state_dict[renamed] = state_dict.pop(key)

    module.register_load_state_dict_pre_hook(load)
    module._register_state_dict_hook(save)
