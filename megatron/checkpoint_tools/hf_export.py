"""Our weights -> a Hugging Face model directory (`GPTNeoXForCausalLM` or `LlamaForCausalLM`).

    export_hf(reader.state_dict(), reader.args, "hf_out", tokenizer_cfg=reader.cfg.tokenizer)

builds the `transformers` model (on the meta device, no memory) from its own config class,
assigns our renamed tensors to it (a name that does not fit is an error) and lets its
`save_pretrained` write `config.json`, `generation_config.json` (end-of-document token as
BOS/EOS) and the safetensors files exactly as `transformers` writes them; then the tokenizer
files when the config's are found (`tokenizer_files.py`). Names and the fused QKV come from
the model's rename table (`megatron/model/hf_names.py`); what the target architecture cannot
express (another norm, activation, positional encoding, biases, ...) is refused by
`hf_config` with the reason.

The vocabulary stays padded (as Pythia's Hugging Face checkpoints are), so the exported model's
logits equal ours over every row; `vocab_size` trims the tables to fewer rows.
`verify_export` loads the directory with `transformers` and compares logits with ours.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch

from megatron.checkpoint_tools.tokenizer_files import export_tokenizer
from megatron.model import HF_ARCHITECTURES, ModelArgs, hf_config, to_hf

ARCHITECTURES = ("auto", *HF_ARCHITECTURES)
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass
class ExportResult:
    folder: Path
    architecture: str
    files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def report(self) -> str:
        hf_class = HF_ARCHITECTURES[self.architecture].hf_class
        lines = [f"exported {hf_class} to {self.folder}: {', '.join(self.files)}"]
        return "\n".join(lines + [f"  note: {n}" for n in self.notes])


def choose_architecture(args: ModelArgs, requested: str = "auto") -> str:
    """`requested`, or for `auto`: Llama for RMSNorm models, GPT-NeoX otherwise."""
    if requested not in ARCHITECTURES:
        raise ValueError(f"architecture '{requested}' is not valid; choose one of {ARCHITECTURES}")
    if requested != "auto":
        return requested
    return "llama" if args.norm == "rmsnorm" else "gpt_neox"


def hf_config_object(args: ModelArgs, arch: str, vocab_size: int | None, dtype, eod=None):
    """The `transformers` config of the exported model (raises `ValueError` when `args`
    cannot be expressed as `arch`)."""
    import transformers

    config_cls = {"gpt_neox": transformers.GPTNeoXConfig, "llama": transformers.LlamaConfig}
    config = config_cls[arch](
        **hf_config(args, arch, vocab_size),
        architectures=[HF_ARCHITECTURES[arch].hf_class],
        bos_token_id=eod,
        eos_token_id=eod,
    )
    config.dtype = dtype
    return config


def _save_with_transformers(tensors: dict, config, output: Path, max_shard_size) -> list[str]:
    """Hand our tensors to the `transformers` model itself and let its `save_pretrained`
    write the files: its own on-disk names (GPT-NeoX's head is `embed_out` there), tied
    weights stored once, safetensors shards and their index."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=config.dtype)
    result = model.load_state_dict(tensors, strict=False, assign=True)
    if result.missing_keys or result.unexpected_keys:
        raise ValueError(
            f"the renamed weights do not fit {type(model).__name__}: missing "
            f"{result.missing_keys[:4]}, unexpected {result.unexpected_keys[:4]}"
        )
    if config.tie_word_embeddings:
        model.tie_weights()
    model.save_pretrained(output, max_shard_size=max_shard_size)
    return sorted(p.name for p in output.iterdir())


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
    """Write the Hugging Face directory for our full `state` (see the module docstring)."""
    arch = choose_architecture(args, architecture)
    if vocab_size is not None and not 0 < vocab_size <= args.vocab_size:
        raise ValueError(f"vocab_size {vocab_size} must be in 1..{args.vocab_size} (padded size)")
    config = hf_config_object(args, arch, vocab_size, None, eod)  # refuses before any work
    output = Path(output)
    if output.exists() and any(output.iterdir()):
        if not overwrite:
            raise FileExistsError(f"output folder '{output}' is not empty; choose another one")
        shutil.rmtree(output)
    tensors = to_hf(state, args, arch, vocab_size)
    first = next(iter(state.values()))
    torch_dtype = DTYPES[dtype] if dtype else first.dtype
    # Fresh contiguous tensors: split QKV views and tied copies must not share storage.
    tensors = {k: v.detach().to(torch_dtype).contiguous().clone() for k, v in tensors.items()}
    config.dtype = torch_dtype
    output.mkdir(parents=True, exist_ok=True)
    result = ExportResult(
        output, arch, _save_with_transformers(tensors, config, output, max_shard_size)
    )
    if tokenizer_cfg is not None:
        written, why = export_tokenizer(tokenizer_cfg, output, max_length=args.max_positions)
        result.files += written
        if why:
            result.notes.append(f"no tokenizer files: {why}")
    return result


def verify_export(output: str | Path, args: ModelArgs, state: dict, seq: int = 16) -> float:
    """Largest |logit difference| between the exported model (loaded with `transformers`)
    and ours (built at tp=1 with `state`) on random tokens, in fp32."""
    from transformers import AutoModelForCausalLM

    from megatron.model import build_gpt, load_full_state_dict

    hf = AutoModelForCausalLM.from_pretrained(output, dtype=torch.float32).eval()
    ours = build_gpt(_plain(args)).eval()
    load_full_state_dict(ours, {k: v.float() for k, v in state.items()})
    rows = hf.config.vocab_size
    seq = min(seq, args.max_positions)
    tokens = torch.randint(0, rows, (2, seq), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(seq).expand(2, seq)
    with torch.no_grad():
        theirs = hf(input_ids=tokens, position_ids=positions).logits
        mine = ours(tokens, positions)[..., :rows]
    return (theirs - mine).abs().max().item()


def _plain(args: ModelArgs) -> ModelArgs:
    import dataclasses

    return dataclasses.replace(
        args,
        pipe_parallel_size=0,
        sequence_parallel=False,
        checkpoint_activations=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
