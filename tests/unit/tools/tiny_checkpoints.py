"""Trained checkpoints of the tiny models, shared by the checkpoint-tools tests.

`trained()`: one 4-rank session (trained once per test session, shared by the convert, reshard
and generate tests) that trains the GPT-NeoX-style and the Llama-style runs of
`tests/tiny.py::arch_settings` at (tp=2, pp=2) and then, from their step-2 checkpoints at the
same layout, computes logits of `PROBE` and greedy generations (key/value cache and recompute)
with `megatron.inference`.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

from tests.distributed import run_distributed
from tests.tiny import ARCH_KEYS, HF_VOCAB, arch_settings, resolve

ARCHS = tuple(ARCH_KEYS)
PROBE = [[5, 17, 230, 41, 99, 3, 384, 80], [61, 7, 7, 12, 300, 2, 45, 460]]
PROMPTS = [[41, 384, 80, 269], [13, 268, 460, 99]]
MAX_NEW = 6


def probe_and_generate(cfg, topology) -> dict:
    """Logits of `PROBE` and greedy tokens of `PROMPTS` (cached and recomputed), from the
    checkpoint `cfg.checkpointing.load` at `cfg`'s layout; logits only on the last stage."""
    import torch

    from megatron.inference import InferenceModel, SamplingSettings, generate

    model = InferenceModel.from_config(cfg, topology, vocab_size=HF_VOCAB)
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
        result = pretrain(resolve(settings, world_size, vocab_size=HF_VOCAB))
        step2 = str(Path(settings["save"]) / "global_step2")
        cfg = resolve({**settings, "load": step2}, world_size, vocab_size=HF_VOCAB)
        probes = probe_and_generate(cfg, initialize_distributed(cfg))
        out[arch] = {"losses": result.losses, **probes}
    return out


_CACHE: dict[str, object] = {}


def trained() -> dict:
    """`{arch: {"folder", "losses", "logits", "tokens_recompute=..."}}` of the (2,2) runs."""
    if "runs" not in _CACHE:
        root = Path(tempfile.mkdtemp(prefix="megatron-tools-"))
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        runs = {arch: arch_settings(root / arch, arch, tp=2, pp=2) for arch in ARCHS}
        results = run_distributed(_train_and_probe, 4, runs)
        merged = {}
        for arch in ARCHS:
            last = next(r[arch] for r in results if r[arch]["logits"] is not None)
            merged[arch] = {**results[0][arch], "logits": last["logits"], "folder": root / arch}
            merged[arch]["settings"] = runs[arch]
        _CACHE["runs"] = merged
    return _CACHE["runs"]  # type: ignore[return-value]
