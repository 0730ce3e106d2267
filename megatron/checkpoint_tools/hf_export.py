"""Our weights -> a Hugging Face model directory (`GPTNeoXForCausalLM`, `LlamaForCausalLM`,
`MistralForCausalLM`, `Qwen2ForCausalLM`, `Qwen3ForCausalLM`, `MixtralForCausalLM` or, for a
model of `mamba` layers only, `MambaForCausalLM`).

    export_hf(reader.state_dict(), reader.args, "hf_out", tokenizer_cfg=reader.cfg.tokenizer)

first checks everything, writing nothing: the options the target class cannot express
(`megatron/model/hf_config.py` classifies every model option: QK-norm, another norm,
activation, positional encoding, biases, ... are refused naming the option and its value),
that every tensor of ours has a Hugging Face name (`megatron/model/hf_names.py`), and that the
renamed tensors fit the `transformers` model built on the meta device. Only then is the output
folder touched: the model's own `save_pretrained` writes `config.json`,
`generation_config.json` (end-of-document token as BOS/EOS) and the safetensors files exactly
as `transformers` writes them; then the tokenizer files when the config's are found
(`tokenizer_files.py`).

A reward model (`train_impl: rm`) exports as the family's `...ForSequenceClassification` with
`num_labels: 1` and its value head as `score` (`hf_reward.py`, which also says how transformers
finds the reward token); `verify_export` then compares scores with our rewards.

The vocabulary stays padded (as Pythia's Hugging Face checkpoints are), so the exported model's
logits equal ours over every row; `vocab_size` trims the tables to fewer rows.
`verify_export` loads the directory with `transformers` and compares its fp32 logits with ours
(our weights rounded to the exported dtype), relative to the largest logit.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch

from megatron.checkpoint_tools.hf_reward import reward_config, reward_difference
from megatron.checkpoint_tools.tokenizer_files import export_tokenizer
from megatron.model import (
    HF_ARCHITECTURES,
    ModelArgs,
    family_of,
    hf_config,
    is_mamba_model,
    name_map,
    to_hf,
)

ARCHITECTURES = ("auto", *HF_ARCHITECTURES)
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
VERIFY_TOLERANCE = 1.0e-4
"""Largest |logit difference| `verify_export` accepts, relative to the largest |logit| (>= 1):
fp32 on both sides, so only the order of floating-point operations differs."""


@dataclass
class ExportResult:
    folder: Path
    architecture: str
    files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    hf_class: str = ""

    def report(self) -> str:
        hf_class = self.hf_class or HF_ARCHITECTURES[self.architecture].hf_class
        lines = [f"exported {hf_class} to {self.folder}: {', '.join(self.files)}"]
        return "\n".join(lines + [f"  note: {n}" for n in self.notes])


def choose_architecture(args: ModelArgs, requested: str = "auto") -> str:
    """`requested`, or for `auto`: GPT-NeoX for LayerNorm models; for RMSNorm ones Llama, or
    the Llama-like class its attention variants need (`family_of`: Qwen3 for QK-norm, Qwen2
    for q/k/v-only biases, Mistral for a sliding window); Mamba for `mamba` layers only."""
    if requested not in ARCHITECTURES:
        raise ValueError(f"architecture '{requested}' is not valid; choose one of {ARCHITECTURES}")
    if requested != "auto":
        return requested
    if is_mamba_model(args):
        return "mamba"
    return family_of(args) if args.norm == "rmsnorm" else "gpt_neox"


def hf_config_object(args: ModelArgs, arch: str, vocab_size: int | None, dtype, eod=None):
    """The `transformers` config of the exported model (raises `ValueError` when `args`
    cannot be expressed as `arch`)."""
    import transformers

    config_cls = {
        "gpt_neox": transformers.GPTNeoXConfig,
        "llama": transformers.LlamaConfig,
        "mistral": transformers.MistralConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
        "mixtral": transformers.MixtralConfig,
        "mamba": transformers.MambaConfig,
    }
    config = config_cls[arch](
        **hf_config(args, arch, vocab_size),
        architectures=[HF_ARCHITECTURES[arch].hf_class],
        bos_token_id=eod,
        eos_token_id=eod,
    )
    config.dtype = dtype
    return config


def _check_all_exported(state: dict, args: ModelArgs, arch: str) -> None:
    """Every tensor of ours must have a Hugging Face name: a dropped one changes the model."""
    mapped = set(name_map(args, arch))
    left = [name for name in state if name not in mapped]
    if left:
        raise ValueError(
            f"the weights {left[:4]} have no place in Hugging Face "
            f"{HF_ARCHITECTURES[arch].hf_class}; exporting without them would change the model"
        )


def _assemble(tensors: dict, config) -> torch.nn.Module:
    """The `transformers` model (built on the meta device) holding our renamed tensors: its
    `save_pretrained` then writes its own on-disk names (GPT-NeoX's head is `embed_out`
    there), tied weights once, safetensors shards and their index."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    reward = config.architectures[0].endswith("ForSequenceClassification")
    auto = AutoModelForSequenceClassification if reward else AutoModelForCausalLM
    with torch.device("meta"):
        model = auto.from_config(config, dtype=config.dtype)
    result = model.load_state_dict(tensors, strict=False, assign=True)
    if result.missing_keys or result.unexpected_keys:
        raise ValueError(
            f"the renamed weights do not fit {type(model).__name__}: missing "
            f"{result.missing_keys[:4]}, unexpected {result.unexpected_keys[:4]}"
        )
    if config.tie_word_embeddings:
        model.tie_weights()
    return model


def _export_dtype(state: dict, dtype: str | None) -> torch.dtype:
    if not state:
        raise ValueError("there are no weights to export")
    return DTYPES[dtype] if dtype else next(iter(state.values())).dtype


def _prepare_output(output: Path, overwrite: bool) -> None:
    if output.exists() and any(output.iterdir()):
        if not overwrite:
            raise FileExistsError(f"output folder '{output}' is not empty; choose another one")
        shutil.rmtree(output)
    output.mkdir(parents=True, exist_ok=True)


def export_hf(
    state: dict[str, torch.Tensor],
    args: ModelArgs,
    output: str | Path,
    *,
    architecture: str = "auto",
    vocab_size: int | None = None,
    dtype: str | None = None,
    tokenizer_cfg=None,
    eod: int | None = None,
    max_shard_size: str | int = "5GB",
    overwrite: bool = False,
) -> ExportResult:
    """Write the Hugging Face directory for our full `state` (see the module docstring);
    every check runs before the output folder is created or emptied."""
    arch = choose_architecture(args, architecture)
    if vocab_size is not None and not 0 < vocab_size <= args.vocab_size:
        raise ValueError(f"vocab_size {vocab_size} must be in 1..{args.vocab_size} (padded size)")
    output = Path(output)
    if output.exists() and any(output.iterdir()) and not overwrite:
        raise FileExistsError(f"output folder '{output}' is not empty; choose another one")
    config = hf_config_object(args, arch, vocab_size, None, eod)
    notes = reward_config(config, arch, eod) if args.value_head else []
    _check_all_exported(state, args, arch)
    torch_dtype = config.dtype = _export_dtype(state, dtype)
    # Fresh contiguous tensors: split QKV views and tied copies must not share storage.
    tensors = {
        k: v.detach().to(torch_dtype).contiguous().clone()
        for k, v in to_hf(state, args, arch, vocab_size).items()
    }
    model = _assemble(tensors, config)
    _prepare_output(output, overwrite)
    model.save_pretrained(output, max_shard_size=max_shard_size)
    files = sorted(p.name for p in output.iterdir())
    result = ExportResult(output, arch, files, notes, hf_class=config.architectures[0])
    if tokenizer_cfg is not None:
        written, why = export_tokenizer(tokenizer_cfg, output, max_length=args.max_positions)
        result.files += written
        if why:
            result.notes.append(f"no tokenizer files: {why}")
    give_usual_permissions(output)
    return result


def give_usual_permissions(folder: Path) -> None:
    """Files as any other file this user writes (0644 under umask 022): safetensors writes
    through a private temporary file, so its weights came out 0600, unreadable by the group
    that shares the model."""
    umask = os.umask(0)
    os.umask(umask)
    for path in folder.iterdir():
        if path.is_file():
            path.chmod(0o666 & ~umask)


@dataclass(frozen=True)
class Verification:
    """Exported model's logits (a reward model's scores) against ours."""

    max_difference: float
    max_logit: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.max_difference <= self.tolerance * max(1.0, self.max_logit)

    def report(self) -> str:
        verdict = "ok" if self.ok else "MISMATCH: the exported model does not compute ours"
        return (
            f"verify: max |logit difference| vs ours = {self.max_difference:.3e} (largest "
            f"|logit| {self.max_logit:.3g}, tolerance {self.tolerance:g} relative): {verdict}"
        )


def verify_export(
    output: str | Path,
    args: ModelArgs,
    state: dict,
    *,
    dtype: str | None = None,
    tolerance: float = VERIFY_TOLERANCE,
    seq: int = 16,
    eod: int | None = None,
) -> Verification:
    """Logits of the exported model (loaded with `transformers`) against ours (built at tp=1
    with `state` rounded to the exported `dtype`) on random tokens, both in fp32; for a
    reward model its scores against our rewards (`hf_reward.reward_difference`, `eod` the
    end-of-text token it was exported with)."""
    from transformers import AutoModelForCausalLM

    from megatron.model import build_gpt, load_full_state_dict

    ours = build_gpt(_plain(args)).eval()
    rounded = _export_dtype(state, dtype)
    load_full_state_dict(ours, {k: v.to(rounded).float() for k, v in state.items()})
    seq = min(seq, args.max_positions)
    if args.value_head:
        return Verification(*reward_difference(output, args, ours, eod, seq), tolerance)
    hf = AutoModelForCausalLM.from_pretrained(output, dtype=torch.float32).eval()
    rows = hf.config.vocab_size
    tokens = torch.randint(0, rows, (2, seq), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(seq).expand(2, seq)
    with torch.no_grad():
        theirs = hf(input_ids=tokens, position_ids=positions).logits
        mine = ours(tokens, positions)[..., :rows]
    return Verification((theirs - mine).abs().max().item(), mine.abs().max().item(), tolerance)


def _plain(args: ModelArgs) -> ModelArgs:
    return dataclasses.replace(
        args,
        pipe_parallel_size=0,
        sequence_parallel=False,
        checkpoint_activations=False,
        loss_chunk_tokens=0,  # the parity check compares logits
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
