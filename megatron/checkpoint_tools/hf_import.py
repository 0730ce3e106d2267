"""A Hugging Face GPT-NeoX, Llama, Mistral, Qwen2, Qwen3, Mixtral or Mamba model directory -> our
checkpoint at any tp/pp layout (and, for Mixtral, any expert-parallel size `ep`).

    result = import_hf("pythia-160m", "checkpoints/pythia", tp=2, pp=2)
    result = import_hf("mixtral", "checkpoints/mixtral", tp=2, pp=2, ep=2)

1. `model_keys_from_hf`: the Hugging Face config as our config keys (the inverse of
   `megatron.model.hf_config`, which is then asked back: a setting that would not survive
   the round trip, such as another activation or a RoPE type we lack, is refused with the
   reason; RoPE scaling maps onto `rope_scaling` field by field).
2. The weights (safetensors or `pytorch_model*.bin`, sharded or not) renamed by the model's
   table (`from_hf`); a tensor the table does not use is an error, not a silent drop.
3. `write_checkpoint` at `global_step0` with the resolved config (at ep > 1 the experts of
   expert-parallel ranks > 0 in `expert_states_pp*_ep*.pt`, as training saves them), the
   tokenizer copied when the directory has one, and `hf_import.yml`: the model, layout
   (`moe_expert_parallel_size` too when ep > 1), tokenizer and `load: OUTPUT` +
   `finetune: true` keys to add to a training config.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import torch

from megatron.checkpoint_tools.hf_family_keys import WINDOW_KEYS, family_keys
from megatron.checkpoint_tools.hf_mamba_keys import mamba_keys
from megatron.checkpoint_tools.reshard import check_layout, tokenizer_vocab_size
from megatron.checkpoint_tools.schema import ModelSchema, resize_vocab
from megatron.checkpoint_tools.tokenizer_files import import_tokenizer
from megatron.checkpoint_tools.writer import write_checkpoint
from megatron.config.groups.rope_scaling import check_rope_scaling
from megatron.model import (
    HF_ARCHITECTURES,
    ModelArgs,
    from_hf,
    fuse_stored_experts,
    hf_config,
    name_map,
)
from megatron.model.hf_names import hf_names_of

MODEL_TYPES = {k: k for k in ("gpt_neox", "llama", "mistral", "qwen2", "qwen3", "mixtral", "mamba")}
# Non-weight tensors some Hugging Face checkpoints carry (recomputed by the model).
IGNORED_SUFFIXES = ("rotary_emb.inv_freq", "attention.bias", "attention.masked_bias")
# Keys of a Hugging Face rope dict that are not `rope_scaling` fields (ours: rotary_emb_base,
# rotary_pct; `type` is the old name of `rope_type`).
ROPE_OWN_KEYS = ("rope_type", "type", "rope_theta", "partial_rotary_factor")
SNIPPET = "hf_import.yml"
# Training keys the config system requires, for the config recorded beside the weights only
# (a run's own config files set them).
RECORD_DEFAULTS = {"train_micro_batch_size_per_gpu": 1, "lr": 1.0e-4}
# The length recorded for a model whose Hugging Face config has none (Mamba's), unless a
# config file sets one; every other family's comes from its max_position_embeddings.
LENGTH_DEFAULT = {"seq_length": 2048}


@dataclass
class ImportResult:
    folder: Path
    architecture: str
    config_snippet: Path
    notes: list[str] = field(default_factory=list)

    def report(self) -> str:
        lines = [
            f"imported {HF_ARCHITECTURES[self.architecture].hf_class} into {self.folder}",
            f"  train from it with: {self.config_snippet} (load + finetune: true) in the configs",
        ]
        return "\n".join(lines + [f"  note: {n}" for n in self.notes])


def read_hf_config(hf_dir: Path) -> dict:
    path = hf_dir / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"'{hf_dir}' has no config.json: not a Hugging Face model dir")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"'{path}' is not valid JSON: {err}") from None


def read_hf_weights(hf_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the directory's safetensors or `pytorch_model*.bin` files."""
    from safetensors.torch import load_file

    for index, loader in (
        ("model.safetensors.index.json", load_file),
        ("pytorch_model.bin.index.json", lambda f: torch.load(f, weights_only=True)),
    ):
        if (hf_dir / index).is_file():
            files = sorted(set(json.loads((hf_dir / index).read_text())["weight_map"].values()))
            state = {}
            for name in files:
                state.update(loader(str(hf_dir / name)))
            return state
    if (hf_dir / "model.safetensors").is_file():
        return load_file(str(hf_dir / "model.safetensors"))
    if (hf_dir / "pytorch_model.bin").is_file():
        return torch.load(hf_dir / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"'{hf_dir}' has no model.safetensors or pytorch_model.bin weights")


def _rope(hf: dict) -> tuple[float, float, dict | None]:
    """(theta, rotary fraction, our `rope_scaling`), refusing RoPE types we do not implement."""
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    theta = rope.get("rope_theta", hf.get("rope_theta", hf.get("rotary_emb_base", 10000)))
    pct = rope.get("partial_rotary_factor", hf.get("rotary_pct", hf.get("partial_rotary_factor")))
    if kind == "default":
        return float(theta), float(1.0 if pct is None else pct), None
    scaling = {"rope_type": kind, **{k: v for k, v in rope.items() if k not in ROPE_OWN_KEYS}}
    if kind in ("yarn", "llama3"):  # transformers' default for a missing original length
        scaling.setdefault("original_max_position_embeddings", hf["max_position_embeddings"])
    check_rope_scaling(scaling, "rotary", "the Hugging Face config's rope_parameters")
    return float(theta), float(1.0 if pct is None else pct), scaling


def model_keys_from_hf(hf: dict) -> tuple[str, dict]:
    """`(architecture, our config keys)` for a Hugging Face config dict."""
    arch = MODEL_TYPES.get(hf.get("model_type"))
    if arch is None:
        raise ValueError(
            f"model_type '{hf.get('model_type')}' is not supported; expected one of "
            f"{', '.join(MODEL_TYPES)}"
        )
    if arch == "mamba":
        return arch, mamba_keys(hf)
    theta, pct, scaling = _rope(hf)
    if int(theta) != theta:
        raise ValueError(f"rope_theta {theta} is not an integer (rotary_emb_base is one)")
    want_act = "gelu" if arch == "gpt_neox" else "silu"
    if hf.get("hidden_act", want_act) != want_act:
        raise ValueError(
            f"hidden_act '{hf['hidden_act']}' is not supported for {arch}: use {want_act}"
        )
    keys = dict(
        num_layers=hf["num_hidden_layers"],
        hidden_size=hf["hidden_size"],
        num_attention_heads=hf["num_attention_heads"],
        seq_length=hf["max_position_embeddings"],
        max_position_embeddings=hf["max_position_embeddings"],
        pos_emb="rotary",
        rotary_pct=pct,
        rotary_emb_base=int(theta),
        intermediate_size=hf["intermediate_size"],
        mlp_multiple_of=1,
        no_weight_tying=not hf.get("tie_word_embeddings", False),
    )
    if scaling is not None:
        keys["rope_scaling"] = scaling
    if arch == "gpt_neox":
        bias = hf.get("attention_bias", True)
        keys.update(
            norm="layernorm",
            layernorm_epsilon=hf.get("layer_norm_eps", 1e-5),
            activation="gelu",
            gpt_j_residual=hf.get("use_parallel_residual", True),
            use_bias_in_attn_linear=bias,
            use_bias_in_mlp=True,
        )
    else:
        heads = hf["num_attention_heads"]
        head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
        if head_dim * heads != hf["hidden_size"]:
            keys["head_dim"] = head_dim  # explicit (Qwen3, Gemma style)
        keys.update(
            # GPT-NeoX's gated-MLP convention: each branch is int(2/3 intermediate_size) / 2
            # wide (megatron/model/mlp.py); Hugging Face's intermediate_size is that width.
            intermediate_size=3 * hf["intermediate_size"],
            num_kv_heads=hf.get("num_key_value_heads") or heads,
            norm="rmsnorm",
            rms_norm_epsilon=hf.get("rms_norm_eps", 1e-6),
            activation="swiglu",
            use_bias_in_norms=False,
            use_bias_in_attn_linear=hf.get("attention_bias", False),
            use_bias_in_mlp=hf.get("mlp_bias", False),
        )
        keys.update(family_keys(arch, hf))
    return arch, keys


def _check_round_trip(hf: dict, args: ModelArgs, arch: str) -> None:
    back = hf_config(args, arch, hf["vocab_size"])  # raises for inexpressible settings
    if arch == "mamba":  # no positions, no rope
        differ = {k: (hf.get(k), v) for k, v in back.items() if k in hf and hf[k] != v}
        if differ:
            raise ValueError(f"these Hugging Face settings would not survive conversion: {differ}")
        return
    theta, pct, scaling = _rope(hf)
    rope = back.pop("rope_parameters")
    back.pop("attention_dropout", None)
    back.pop("hidden_dropout", None)
    for key in WINDOW_KEYS:  # compared as the window of every layer, by family_keys
        back.pop(key, None)
    differ = {k: (hf.get(k), v) for k, v in back.items() if k in hf and hf[k] != v}
    if rope["rope_theta"] != theta or rope["partial_rotary_factor"] != pct:
        differ["rope"] = ((theta, pct), (rope["rope_theta"], rope["partial_rotary_factor"]))
    rule = {k: v for k, v in rope.items() if k not in ("rope_theta", "partial_rotary_factor")}
    if rule != (scaling or {"rope_type": "default"}):
        differ["rope_parameters"] = (scaling, rule)
    if differ:
        raise ValueError(f"these Hugging Face settings would not survive conversion: {differ}")


def _check_all_used(hf_state: dict, args: ModelArgs, arch: str) -> None:
    table = HF_ARCHITECTURES[arch]
    used = {table.head, *(old for old, _ in table.legacy_names)}
    for target in name_map(args, arch).values():
        used.update(hf_names_of(target))
    unused = [k for k in hf_state if k not in used and not k.endswith(IGNORED_SUFFIXES)]
    if unused:
        raise ValueError(f"the Hugging Face weights {unused[:4]} have no place in our model")


def layout_keys(tp: int, pp: int, ep: int) -> dict:
    """The layout keys of the import (the expert-parallel size only when it is not 1)."""
    keys = {"model_parallel_size": tp, "pipe_parallel_size": pp}
    return {**keys, "moe_expert_parallel_size": ep} if ep != 1 else keys


def _settings(keys: dict, tokenizer: dict, config_files, layout: dict):
    """Settings for the config system; keys from `config_files` must not contradict `keys`."""
    from megatron.config.loader import Setting
    from megatron.config.resolve import load_settings

    derived = {**keys, **layout}
    settings = load_settings(list(config_files)) if config_files else {}
    clash = [
        f"{k}: {settings[k].value!r} in {settings[k].source}, {v!r} in the Hugging Face config"
        for k, v in derived.items()
        if k in settings and k in keys and settings[k].value != v
    ]
    if clash:
        raise ValueError("the config files contradict the Hugging Face model: " + "; ".join(clash))
    for k, v in {**tokenizer, **RECORD_DEFAULTS, **LENGTH_DEFAULT}.items():
        settings.setdefault(k, Setting(v, "<defaults of convert_from_hf>"))
    settings.update({k: Setting(v, "<Hugging Face config>") for k, v in derived.items()})
    return settings


def import_hf(
    hf_dir: str | Path,
    output: str | Path,
    *,
    tp: int = 1,
    pp: int = 1,
    ep: int = 1,
    config_files=(),
    overwrite: bool = False,
) -> ImportResult:
    """Convert the Hugging Face directory `hf_dir` into a checkpoint under `output` at layout
    (tp, pp) and expert-parallel size `ep` (a model with experts only)."""
    from megatron.config.resolve import resolve_settings, settings_group

    hf_dir, output = Path(hf_dir), Path(output)
    hf = read_hf_config(hf_dir)
    arch, keys = model_keys_from_hf(hf)
    output.mkdir(parents=True, exist_ok=True)
    tokenizer = import_tokenizer(hf_dir, output)
    layout = layout_keys(tp, pp, ep)
    if ep != 1 and not keys.get("moe_num_experts", 1) > 1:
        raise ValueError(
            f"--expert-parallel-size {ep}: {hf.get('model_type')} has no experts; use 1"
        )
    settings = _settings(keys, tokenizer, config_files, layout)
    tokenizer_cfg = SimpleNamespace(tokenizer=settings_group(settings, "tokenizer"))
    vocab = tokenizer_vocab_size(tokenizer_cfg) or hf["vocab_size"]
    # one data-parallel replica per expert-parallel rank: the smallest world ep divides
    cfg = resolve_settings(settings, world_size=tp * max(1, pp) * ep, vocab_size=vocab)
    args = ModelArgs.from_config(cfg)
    _check_round_trip(hf, args, arch)
    schema = ModelSchema(args)
    check_layout(schema, tp, pp)
    hf_state = read_hf_weights(hf_dir)
    if arch == "mixtral":  # per-expert files -> the stacked tensors of the model
        hf_state = fuse_stored_experts(hf_state)
    _check_all_used(hf_state, args, arch)
    notes = []
    if hf["vocab_size"] > args.vocab_size:
        notes.append(f"vocabulary tables trimmed from {hf['vocab_size']} to {args.vocab_size}")
    state = from_hf(hf_state, args, arch)
    for name, spec in schema.params.items():
        if spec.is_vocab_table and name in state:
            state[name] = resize_vocab(state[name], spec.shape[0])
    folder = write_checkpoint(
        output,
        schema=schema,
        state=state,
        tp=tp,
        pp=pp,
        iteration=0,
        config_dict=cfg.to_dict(),
        overwrite=overwrite,
        ep=ep,
    )
    snippet = output / SNIPPET
    snippet_keys = {**keys, **layout, **tokenizer}
    snippet_keys.update(load=str(output), finetune=True)
    snippet.write_text(json.dumps(snippet_keys, indent=2) + "\n")  # JSON is valid YAML
    return ImportResult(folder, arch, snippet, notes)
