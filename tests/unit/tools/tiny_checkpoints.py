"""Tiny models, data and trained checkpoints shared by the checkpoint-tools tests.

- `corpus()`: a small `.bin/.idx` corpus tokenized with `tests/data/tiny_hf_tokenizer.json`
  (vocab 500, padded to 512), built once per machine under the temp folder.
- `run_settings(folder, arch, tp, pp)`: flat config keys of a 2-layer, 64-wide GPT-NeoX-style
  (tied, parallel residual, partial rotary) or Llama-style (RMSNorm, SwiGLU, GQA, untied,
  no biases) model training 3 steps, saving at steps 2 and 3, dropout off.
- `trained()`: one 4-rank session (trained once per test session, shared by the convert,
  reshard and generate tests) that trains both models at (tp=2, pp=2) and then, from their
  step-2 checkpoints at the same layout, computes logits of `PROBE` and greedy generations
  (key/value cache and recompute) with `megatron.inference`.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import numpy as np

from tests.distributed import run_distributed

REPO = Path(__file__).resolve().parents[3]
TOKENIZER = REPO / "tests" / "data" / "tiny_hf_tokenizer.json"
VOCAB = 500
ARCHS = ("neox", "llama")
PROBE = [[5, 17, 230, 41, 99, 3, 384, 80], [61, 7, 7, 12, 300, 2, 45, 460]]
PROMPTS = [[41, 384, 80, 269], [13, 268, 460, 99]]
MAX_NEW = 6

WORDS = (
    "the king and queen of a far land rode out at dawn to see the sea where ships "
    "of many colours sailed home with bread wine and tales of old wars"
).split()

ARCH_KEYS = {
    "neox": dict(
        norm="layernorm",
        activation="gelu",
        rotary_pct=0.5,
        gpt_j_residual=True,
        no_weight_tying=False,
    ),
    "llama": dict(
        norm="rmsnorm",
        rms_norm_epsilon=1.0e-6,
        activation="swiglu",
        num_kv_heads=2,
        intermediate_size=288,  # 96 per gated branch
        rotary_pct=1.0,
        no_weight_tying=True,
        use_bias_in_norms=False,
        use_bias_in_attn_linear=False,
        use_bias_in_mlp=False,
    ),
}


def corpus() -> str:
    """Prefix of the test corpus (built on first use)."""
    folder = Path(tempfile.gettempdir()) / "megatron-tools-tests"
    prefix = folder / "tiny_hf_v1"
    if not Path(f"{prefix}.idx").is_file():
        from megatron.data import IndexedDatasetWriter
        from megatron.data.tokenizers import make_tokenizer

        tokenizer = make_tokenizer("HFTokenizer", vocab_file=str(TOKENIZER))
        rng = np.random.RandomState(0)
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f"tmp_{rng.randint(1 << 30)}"
        with IndexedDatasetWriter(tmp, np.uint16) as writer:
            for _ in range(40):
                text = " ".join(rng.choice(WORDS, size=300)).capitalize() + "."
                writer.add_document(tokenizer.tokenize(text) + [tokenizer.eod])
        for ext in (".bin", ".idx"):  # the index last: its presence means complete
            Path(f"{tmp}{ext}").replace(f"{prefix}{ext}")
    return str(prefix)


def run_settings(folder, arch: str, tp: int, pp: int, **changes) -> dict:
    """Flat config keys of a tiny training run writing under `folder`."""
    folder = Path(folder)
    settings = dict(
        pipe_parallel_size=pp,
        model_parallel_size=tp,
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        seq_length=32,
        max_position_embeddings=32,
        pos_emb="rotary",
        hidden_dropout=0.0,
        attention_dropout=0.0,
        optimizer={"type": "AdamW", "params": {"lr": 2.0e-3, "betas": [0.9, 0.95]}},
        lr_decay_style="cosine",
        warmup=0.2,
        min_lr=1.0e-4,
        train_iters=3,
        train_micro_batch_size_per_gpu=2,
        gradient_accumulation_steps=2,
        data_path=corpus(),
        data_cache_path=str(folder / "index_cache"),
        split="90,8,2",
        num_workers=0,
        tokenizer_type="HFTokenizer",
        vocab_file=str(TOKENIZER),
        eval_interval=100,
        eval_iters=1,
        log_interval=1,
        steps_per_print=1000,
        log_dir=str(folder / "logs"),
        save=str(folder / "ckpt"),
        load=str(folder / "ckpt"),
        checkpoint_factor=None,
        extra_save_iters=[2],
        distributed_backend="gloo",
        seed=7,
        **ARCH_KEYS[arch],
    )
    settings.update(changes)
    return settings


def resolve(settings: dict, world_size: int):
    from megatron.config import config_from_dict

    return config_from_dict(settings, world_size=world_size, vocab_size=VOCAB)


def probe_and_generate(cfg, topology) -> dict:
    """Logits of `PROBE` and greedy tokens of `PROMPTS` (cached and recomputed), from the
    checkpoint `cfg.checkpointing.load` at `cfg`'s layout; logits only on the last stage."""
    import torch

    from megatron.inference import InferenceModel, SamplingSettings, generate

    model = InferenceModel.from_config(cfg, topology, vocab_size=VOCAB)
    tokens = torch.tensor(PROBE)
    logits = model.forward(tokens, torch.arange(tokens.shape[1]).expand_as(tokens))
    out = {"logits": logits}
    for recompute in (False, True):
        settings = SamplingSettings(maximum_tokens=MAX_NEW, recompute=recompute, eod=None)
        results = generate(model, PROMPTS, settings)
        out[f"tokens_recompute={recompute}"] = [g.tokens for g in results]
    return out


def _train_and_probe(rank, world_size, runs):
    from megatron.launcher.worker import initialize_distributed
    from megatron.training import pretrain

    out = {}
    for arch, settings in runs.items():
        result = pretrain(resolve(settings, world_size))
        step2 = str(Path(settings["save"]) / "global_step2")
        cfg = resolve({**settings, "load": step2}, world_size)
        probes = probe_and_generate(cfg, initialize_distributed(cfg))
        out[arch] = {"losses": result.losses, **probes}
    return out


_CACHE: dict[str, object] = {}


def trained() -> dict:
    """`{arch: {"folder", "losses", "logits", "tokens_recompute=..."}}` of the (2,2) runs."""
    if "runs" not in _CACHE:
        root = Path(tempfile.mkdtemp(prefix="megatron-tools-"))
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        runs = {arch: run_settings(root / arch, arch, tp=2, pp=2) for arch in ARCHS}
        results = run_distributed(_train_and_probe, 4, runs)
        merged = {}
        for arch in ARCHS:
            last = next(r[arch] for r in results if r[arch]["logits"] is not None)
            merged[arch] = {**results[0][arch], "logits": last["logits"], "folder": root / arch}
            merged[arch]["settings"] = runs[arch]
        _CACHE["runs"] = merged
    return _CACHE["runs"]  # type: ignore[return-value]
