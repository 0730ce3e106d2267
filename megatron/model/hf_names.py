"""Rename table between our parameter names and Hugging Face's GPT-NeoX and Llama models.

Our names (`specs.py`, GPT-NeoX's indices): `{index}.{name in layer}`, where index 0 is the
embedding (or `tied_modules.embed.` when tied), `2 + i` transformer layer `i`, `L + 3` the
final norm and `L + 4` the untied head. Inside a transformer layer:

| ours (in layer `i`)           | GPTNeoX `gpt_neox.layers.{i}.` | Llama `model.layers.{i}.`       |
| ----------------------------- | ------------------------------ | ------------------------------- |
| `input_layernorm.*`           | `input_layernorm.*`            | `input_layernorm.*`             |
| `post_attention_layernorm.*`  | `post_attention_layernorm.*`   | `post_attention_layernorm.*`    |
| `attention.query_key_value.*` | `attention.query_key_value.*`  | `self_attn.{q,k,v}_proj.*` (*)  |
| `attention.dense.*`           | `attention.dense.*`            | `self_attn.o_proj.*`            |
| `mlp.dense_h_to_4h.*`         | `mlp.dense_h_to_4h.*`          | `mlp.up_proj.*`                 |
| `mlp.dense_h_to_4h_gate.*`    | (none: gelu MLP)               | `mlp.gate_proj.*`               |
| `mlp.dense_4h_to_h.*`         | `mlp.dense_4h_to_h.*`          | `mlp.down_proj.*`               |

(`*` = `weight` and, where the model has one, `bias`; Llama norms have no bias. (*): fused.)

Outside the layers: word embedding `gpt_neox.embed_in.weight` / `model.embed_tokens.weight`,
final norm `{L+3}.norm.*` = `gpt_neox.final_layer_norm.*` / `model.norm.weight`, untied head
`{L+4}.final_linear.weight` = `lm_head.weight` in both (transformers >= 5; the older
GPT-NeoX name `embed_out.weight`, used by the Pythia checkpoints, is accepted by `from_hf`);
a reward model's value head `{L+4}.score.weight` = `score.weight` of the
`...ForSequenceClassification` class.

Fused QKV: our `query_key_value` rows are grouped per key/value head, `(nkv, nq/nkv + 2, d)`
(see `attention.py`). GPT-NeoX's `query_key_value` is the same layout with nq = nkv (per head
`[q | k | v]`), so it maps unchanged. Llama's separate `q_proj (nq d)`, `k_proj`/`v_proj
(nkv d)` are interleaved by `fuse_qkv` and recovered by `split_qkv` (rotary uses the same
`rotate_half` convention in both, so no row permutation is needed).

Vocabulary: our tables have `args.vocab_size` (padded) rows; `from_hf` zero-pads Hugging
Face's rows up to it, `to_hf(vocab_size=V)` keeps the first V.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from megatron.model.args import ModelArgs, choose
from megatron.model.specs import layer_prefix


@dataclass(frozen=True)
class Part:
    """Chunk `index` of `parts` equal chunks along `dim` of one Hugging Face tensor: two of
    our tensors stored as one there (Mixtral's experts: `gate_up_proj` = our `w_gate`, `w_in`
    concatenated along the rows, dim 1 of `(E, 2 ffn, h)`)."""

    name: str
    index: int
    parts: int = 2
    dim: int = 1

    def format(self, **kw) -> Part:
        return dataclasses.replace(self, name=self.name.format(**kw))


Target = str | tuple[str, str, str] | Part


def hf_names_of(target: Target) -> tuple[str, ...]:
    """The Hugging Face tensor names one entry of `name_map` reads."""
    if isinstance(target, Part):
        return (target.name,)
    return target if isinstance(target, tuple) else (target,)


@dataclass(frozen=True)
class HFArchitecture:
    """How one Hugging Face architecture names our parameters (`{i}` = layer index)."""

    hf_class: str
    embedding: str
    head: str
    final_norm: dict[str, str]
    layer: dict[str, Target]
    """our name inside a transformer layer -> HF template, or (q, k, v) templates to fuse."""
    legacy_names: tuple[tuple[str, str], ...] = ()
    """(old, current) HF names that `from_hf` also accepts (older checkpoints on the Hub)."""


GPT_NEOX = HFArchitecture(
    hf_class="GPTNeoXForCausalLM",
    embedding="gpt_neox.embed_in.weight",
    head="lm_head.weight",
    final_norm={
        "norm.weight": "gpt_neox.final_layer_norm.weight",
        "norm.bias": "gpt_neox.final_layer_norm.bias",
    },
    layer={
        f"{ours}.{kind}": f"gpt_neox.layers.{{i}}.{ours}.{kind}"
        for ours in (
            "input_layernorm",
            "post_attention_layernorm",
            "attention.query_key_value",
            "attention.dense",
            "mlp.dense_h_to_4h",
            "mlp.dense_4h_to_h",
        )
        for kind in ("weight", "bias")
    },
    # transformers < 5 and the Pythia checkpoints call the untied head `embed_out`.
    legacy_names=(("embed_out.weight", "lm_head.weight"),),
)

_LLAMA_LINEARS = {
    "attention.dense": "self_attn.o_proj",
    "mlp.dense_h_to_4h": "mlp.up_proj",
    "mlp.dense_h_to_4h_gate": "mlp.gate_proj",
    "mlp.dense_4h_to_h": "mlp.down_proj",
}

LLAMA = HFArchitecture(
    hf_class="LlamaForCausalLM",
    embedding="model.embed_tokens.weight",
    head="lm_head.weight",
    final_norm={"norm.weight": "model.norm.weight"},
    layer={
        "input_layernorm.weight": "model.layers.{i}.input_layernorm.weight",
        "post_attention_layernorm.weight": "model.layers.{i}.post_attention_layernorm.weight",
        **{
            f"attention.query_key_value.{kind}": tuple(
                f"model.layers.{{i}}.self_attn.{p}_proj.{kind}" for p in "qkv"
            )
            for kind in ("weight", "bias")
        },
        **{
            f"{ours}.{kind}": f"model.layers.{{i}}.{theirs}.{kind}"
            for ours, theirs in _LLAMA_LINEARS.items()
            for kind in ("weight", "bias")
        },
    },
)

HF_ARCHITECTURES: dict[str, HFArchitecture] = {"gpt_neox": GPT_NEOX, "llama": LLAMA}

VALUE_HEAD = "score.weight"
"""A reward model's value head in every `...ForSequenceClassification` class (the rest of the
model keeps the causal class's names: `gpt_neox.*` / `model.*`)."""


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, args: ModelArgs) -> torch.Tensor:
    """Separate q `(nq d, ...)`, k and v `(nkv d, ...)` -> our grouped `((nq + 2 nkv) d, ...)`."""
    nkv, d = args.kv_heads, args.head_dim
    rest = q.shape[1:]
    grouped = torch.cat(
        (
            q.reshape(nkv, -1, d, *rest),  # (nkv, nq/nkv, d, ...)
            k.reshape(nkv, 1, d, *rest),
            v.reshape(nkv, 1, d, *rest),
        ),
        dim=1,
    )  # (nkv, nq/nkv + 2, d, ...)
    return grouped.reshape(-1, *rest)


def split_qkv(qkv: torch.Tensor, args: ModelArgs):
    """Inverse of `fuse_qkv`: our grouped rows -> `(q, k, v)` in head order."""
    nkv, d = args.kv_heads, args.head_dim
    rest = qkv.shape[1:]
    grouped = qkv.reshape(nkv, -1, d, *rest)  # (nkv, nq/nkv + 2, d, ...)
    q = grouped[:, :-2].reshape(-1, *rest)
    k = grouped[:, -2].reshape(-1, *rest)
    v = grouped[:, -1].reshape(-1, *rest)
    return q, k, v


def name_map(args: ModelArgs, arch: str) -> dict[str, Target]:
    """`{our full name: HF name or (q, k, v) names}` for a model of this shape (every entry
    the architecture can have; a model without biases simply lacks those names)."""
    table = choose(HF_ARCHITECTURES, "Hugging Face architecture", arch)
    names: dict[str, Target] = {
        layer_prefix(args, "embedding") + "word_embeddings.weight": table.embedding
    }
    for i in range(args.num_layers):
        prefix = layer_prefix(args, "layer", i)
        for ours, theirs in table.layer.items():
            names[prefix + ours] = (
                tuple(t.format(i=i) for t in theirs)
                if isinstance(theirs, tuple)
                else theirs.format(i=i)
            )
    for ours, theirs in table.final_norm.items():
        names[layer_prefix(args, "final_norm") + ours] = theirs
    if args.value_head:  # a reward model: `...ForSequenceClassification`'s `score`
        names[layer_prefix(args, "head") + "score.weight"] = VALUE_HEAD
    elif not args.tied_embeddings:
        names[layer_prefix(args, "head") + "final_linear.weight"] = table.head
    return names


def _is_vocab_table(ours: str) -> bool:
    return ours.endswith("word_embeddings.weight") or ours.endswith("final_linear.weight")


def from_hf(hf_state: dict, args: ModelArgs, arch: str) -> dict[str, torch.Tensor]:
    """Our full state dict from a Hugging Face one (names absent on both sides skipped)."""
    table = choose(HF_ARCHITECTURES, "Hugging Face architecture", arch)
    renamed = dict(table.legacy_names)
    hf_state = {renamed.get(name, name): tensor for name, tensor in hf_state.items()}
    out = {}
    for ours, theirs in name_map(args, arch).items():
        if isinstance(theirs, tuple):
            if all(t in hf_state for t in theirs):
                out[ours] = fuse_qkv(*(hf_state[t] for t in theirs), args)
        elif isinstance(theirs, Part):
            if theirs.name in hf_state:
                whole = hf_state[theirs.name]
                out[ours] = whole.chunk(theirs.parts, theirs.dim)[theirs.index].clone()
        elif theirs in hf_state:
            tensor = hf_state[theirs]
            if _is_vocab_table(ours) and tensor.shape[0] < args.vocab_size:
                pad = tensor.new_zeros(args.vocab_size - tensor.shape[0], *tensor.shape[1:])
                tensor = torch.cat((tensor, pad))  # (padded V, h)
            out[ours] = tensor
    return out


def to_hf(state: dict, args: ModelArgs, arch: str, vocab_size: int | None = None) -> dict:
    """A Hugging Face state dict from our full one; `vocab_size` trims the padded tables.
    With tied embeddings the HF head entry is the embedding tensor itself."""
    table = choose(HF_ARCHITECTURES, "Hugging Face architecture", arch)
    out, parts = {}, {}
    for ours, theirs in name_map(args, arch).items():
        if ours not in state:
            continue
        tensor = state[ours]
        if isinstance(theirs, Part):
            parts.setdefault(theirs.name, {})[theirs.index] = (theirs, tensor)
            continue
        if _is_vocab_table(ours) and vocab_size is not None:
            tensor = tensor[:vocab_size]
        if isinstance(theirs, tuple):
            out.update(zip(theirs, split_qkv(tensor, args)))
        else:
            out[theirs] = tensor
    for name, pieces in parts.items():
        part = pieces[0][0]
        if len(pieces) != part.parts:
            raise ValueError(f"Hugging Face '{name}' needs {part.parts} of our tensors")
        out[name] = torch.cat([pieces[j][1] for j in range(part.parts)], dim=part.dim)
    if args.tied_embeddings and not args.value_head and table.embedding in out:
        out[table.head] = out[table.embedding]
    return out
