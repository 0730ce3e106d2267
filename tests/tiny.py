"""The tiny runs the tests build: the one definition of their configs and corpora.

Every run here is the same small model (`MODEL`: 2 layers, 64 wide, 4 heads, 32 tokens) over a
small vocabulary (no 50k-row embedding), so a test spends its time on what it checks.

- `char_corpus()`: made-up sentences in byte tokens for `CharLevelTokenizer` (vocabulary
  `CHAR_VOCAB`); `hf_corpus()`: the same kind of text tokenized with `HF_TOKENIZER`
  (vocabulary `HF_VOCAB`). Each is a `.bin/.idx` pair built once per machine under the temp
  folder (the writer finishes atomically).
- `tiny_settings(folder, **changes)`: the flat config keys of a training run over the character
  corpus writing under `folder`; `resolve(settings, world_size)` resolves them as `deepy.py`
  would.
- `arch_settings(folder, arch, tp, pp, **changes)`: that run over the tokenizer corpus as a
  GPT-NeoX-style or a Llama-style model (`ARCH_KEYS`), 3 steps saving at steps 2 and 3,
  dropout off: the checkpoint tools' runs; resolve them with `vocab_size=HF_VOCAB`.
- `tiny_config(**changes)`: a resolved config of the model with no data and no folders, for
  unit tests of what reads a config (LR schedules, optimizers, checkpoint policy, loggers).
- `BARE`: the model and a 2-step batch and nothing else, for the pre-flight tests, which add
  exactly what they check.
- `write_config(folder, settings)`: settings as the config file a `deepy.py` test launches.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np

from megatron.config import config_from_dict

REPO = Path(__file__).resolve().parents[1]
CHAR_VOCAB = 512  # CharLevelTokenizer's
HF_TOKENIZER = REPO / "tests" / "data" / "tiny_hf_tokenizer.json"
HF_VOCAB = 500  # padded to 512
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
# GPT-NeoX-style (tied, parallel residual, partial rotary) and Llama-style (RMSNorm, SwiGLU,
# GQA, untied, no biases) keys of `arch_settings`.
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
# What the checkpoint tools' runs change in `tiny_settings`: 3 steps saving at steps 2 and 3,
# dropout off, another seed, the tokenizer corpus.
_ARCH_RUN = dict(
    hidden_dropout=0.0,
    attention_dropout=0.0,
    train_iters=3,
    tokenizer_type="HFTokenizer",
    vocab_file=str(HF_TOKENIZER),
    eval_interval=100,
    checkpoint_factor=None,
    extra_save_iters=[2],
    seed=7,
)


def _texts(rng: np.random.RandomState, words_per_document: int):
    """40 documents of random `WORDS`."""
    for _ in range(40):
        yield " ".join(rng.choice(WORDS, size=words_per_document)).capitalize() + "."


def _pair(folder: str, name: str, documents) -> str:
    """Prefix of `folder/name` under the temp folder, written on first use from `documents()`
    (token lists)."""
    prefix = Path(tempfile.gettempdir()) / folder / name
    if not Path(f"{prefix}.idx").is_file():
        from megatron.data import IndexedDatasetWriter

        with IndexedDatasetWriter(prefix, np.uint16) as writer:
            for tokens in documents():
                writer.add_document(tokens)
    return str(prefix)


def char_corpus() -> str:
    """Prefix of the character-level corpus; 0 ends a document."""

    def documents():
        return (list(text.encode()) + [0] for text in _texts(np.random.RandomState(0), 600))

    return _pair("megatron-train-tests", "chars_v1", documents)


def hf_corpus() -> str:
    """Prefix of the corpus tokenized with `HF_TOKENIZER`; its end-of-document token ends one."""

    def documents():
        from megatron.data.tokenizers import make_tokenizer

        tokenizer = make_tokenizer("HFTokenizer", vocab_file=str(HF_TOKENIZER))
        rng = np.random.RandomState(0)
        rng.randint(1 << 30)  # a draw this corpus was always built after: the same documents
        return (tokenizer.tokenize(text) + [tokenizer.eod] for text in _texts(rng, 300))

    return _pair("megatron-tools-tests", "tiny_hf_v1", documents)


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
        data_path=changes["data_path"] if "data_path" in changes else char_corpus(),
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


def arch_settings(folder, arch: str, tp: int, pp: int, **changes) -> dict:
    """Flat config keys of a checkpoint tools' run of `arch` ("neox", "llama") at (tp, pp)."""
    layout = dict(pipe_parallel_size=pp, model_parallel_size=tp, data_path=hf_corpus())
    return tiny_settings(folder, **{**layout, **_ARCH_RUN, **ARCH_KEYS[arch], **changes})


def resolve(settings: dict, world_size: int, vocab_size: int = CHAR_VOCAB):
    """The resolved config of `settings` on `world_size` ranks with the tokenizer's vocabulary."""
    return config_from_dict(settings, world_size=world_size, vocab_size=vocab_size)


def stepping_trainer(cfg, iters: int):
    """The trainer's parts for a step-by-step test, on this rank of a `run_distributed` worker:
    `(parts, steps, batches)`, the engine built and guarded as `pretrain` builds it
    (`build_engine`, `engine_steps`, `NonFiniteSteps`) and the training batches of `cfg`'s data,
    after one step (it creates the optimizer's state)."""
    from megatron.data import build_tokenizer
    from megatron.launcher.worker import initialize_distributed
    from megatron.parallel.random import seed_everything
    from megatron.training.setup.batches import BatchSettings
    from megatron.training.setup.data import BatchFactory, build_datasets
    from megatron.training.setup.engine import build_engine
    from megatron.training.step.nonfinite import NonFiniteSteps
    from megatron.training.step.steps import engine_steps

    topology = initialize_distributed(cfg)
    seed_everything(cfg.training.seed)
    parts = build_engine(cfg, topology, iters)
    steps = engine_steps(parts.engine, topology)
    NonFiniteSteps(parts.engine, parts.optimizer, topology, steps.local_loss).install()
    batch = BatchSettings.from_config(cfg, build_tokenizer(cfg).eod)
    batches = BatchFactory(cfg, topology, batch, parts.engine.device)
    batches = batches(build_datasets(cfg, iters)[0], 0)
    steps.train(batches)
    return parts, steps, batches


def tiny_config(*, world_size: int = 1, vocab_size: int = 100, **changes):
    """A resolved config of the tiny model without data; `changes` are flat config keys."""
    return config_from_dict({**_CONFIG, **changes}, vocab_size=vocab_size, world_size=world_size)


def write_config(folder, settings: dict, name: str = "run.yml") -> Path:
    """Write `settings` as the config file `folder/name` (JSON, which YAML reads)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(
        json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in settings.items()})
    )
    return path
