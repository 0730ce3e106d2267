"""Tiny training runs for the multi-process and end-to-end training tests.

`char_corpus()` writes (once per machine, atomically) a small character-level corpus in the
`.bin/.idx` format: made-up sentences, byte tokens, `CharLevelTokenizer` (vocab 512), so the
model is small and fast (no 50k-row embedding). `tiny_settings(folder, **changes)` gives the
flat config keys of a 2-layer, 64-wide model over it; `resolve(settings, world_size)` the
resolved config.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from megatron.config import config_from_dict

WORDS = (
    "the king and queen of a far land rode out at dawn to see the sea where ships "
    "of many colours sailed home with bread wine and tales of old wars"
).split()


def char_corpus() -> str:
    """Prefix of the test corpus (built on first use under the temp folder)."""
    folder = Path(tempfile.gettempdir()) / "megatron-train-tests"
    prefix = folder / "chars_v1"
    if not Path(f"{prefix}.idx").is_file():
        from megatron.data import IndexedDatasetWriter

        rng = np.random.RandomState(0)
        folder.mkdir(parents=True, exist_ok=True)
        with IndexedDatasetWriter(prefix, np.uint16) as writer:
            for _ in range(40):
                words = rng.choice(WORDS, size=600)
                text = " ".join(words).capitalize() + "."
                writer.add_document(list(text.encode()) + [0])  # 0 ends a document
    return str(prefix)


def tiny_settings(folder, **changes) -> dict:
    """Flat config keys of a tiny pipeline run writing under `folder`."""
    folder = Path(folder)
    settings = dict(
        pipe_parallel_size=1,
        model_parallel_size=1,
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        seq_length=32,
        max_position_embeddings=32,
        pos_emb="rotary",
        hidden_dropout=0.1,  # dropout on: resume must replay the RNG exactly
        attention_dropout=0.1,
        optimizer={"type": "AdamW", "params": {"lr": 2.0e-3, "betas": [0.9, 0.95]}},
        lr_decay_style="cosine",
        warmup=0.2,
        min_lr=1.0e-4,
        train_iters=6,
        train_micro_batch_size_per_gpu=2,
        gradient_accumulation_steps=2,
        data_path=char_corpus(),
        data_cache_path=str(folder / "index_cache"),
        split="90,8,2",
        num_workers=0,
        tokenizer_type="CharLevelTokenizer",
        eval_interval=3,
        eval_iters=1,
        log_interval=1,
        steps_per_print=1000,
        log_dir=str(folder / "logs"),
        save=str(folder / "ckpt"),
        load=str(folder / "ckpt"),
        distributed_backend="gloo",
    )
    settings.update(changes)
    return settings


def resolve(settings: dict, world_size: int):
    return config_from_dict(settings, world_size=world_size, vocab_size=512)
