"""The tiny runs the tests build: the one definition of their configs.

Every run here is the same small model (`MODEL`: 2 layers, 64 wide, 4 heads, 32 tokens) over a
small vocabulary (no 50k-row embedding), so a test spends its time on what it checks.

- `char_corpus()`: made-up sentences in byte tokens for `CharLevelTokenizer` (vocabulary
  `CHAR_VOCAB`), a `.bin/.idx` pair built once per machine under the temp folder (the writer
  finishes atomically).
- `tiny_settings(folder, **changes)`: the flat config keys of a training run over the character
  corpus writing under `folder`; `resolve(settings, world_size)` resolves them as `deepy.py`
  would.
- `tiny_config(**changes)`: a resolved config of the model with no data and no folders, for
  unit tests of what reads a config (LR schedules, optimizers, checkpoint policy, loggers).
- `BARE`: the model and a 2-step batch and nothing else, for the pre-flight tests, which add
  exactly what they check.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from megatron.config import config_from_dict

CHAR_VOCAB = 512  # CharLevelTokenizer's
WORDS = (
    "the king and queen of a far land rode out at dawn to see the sea where ships "
    "of many colours sailed home with bread wine and tales of old wars"
).split()

MODEL = dict(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32)
BARE = dict(MODEL, max_position_embeddings=32, train_iters=2, train_micro_batch_size_per_gpu=2)
_CONFIG = dict(  # tiny_config's
    MODEL,
    train_micro_batch_size_per_gpu=2,
    train_iters=200,
    optimizer={"type": "Adam", "params": {"lr": 1.0e-3}},
)


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
        **MODEL,
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
    """The resolved config of `settings` on `world_size` ranks."""
    return config_from_dict(settings, world_size=world_size, vocab_size=CHAR_VOCAB)


def tiny_config(*, world_size: int = 1, vocab_size: int = 100, **changes):
    """A resolved config of the tiny model without data; `changes` are flat config keys."""
    return config_from_dict({**_CONFIG, **changes}, vocab_size=vocab_size, world_size=world_size)
