"""What an unknown key most likely meant: other trainers' names for our keys, then spelling.

    did_you_mean("learning_rate")    # "; did you mean 'lr' (the peak learning rate)?"

A user coming from the Hugging Face Trainer, Megatron-LM, nanoGPT or a model's config.json
types that trainer's name; spelling alone rarely finds ours (`learning_rate` is nowhere near
`lr`). These names are only ever suggested, never mapped: a key we do not know is refused.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

_BETAS = "optimizer: {params: {betas: [b1, b2]}}"
_EPS = "optimizer: {params: {eps: ...}}"

# name used elsewhere -> (our key or setting, what it is)
OTHER_NAMES: dict[str, tuple[str, str]] = {
    "learning_rate": ("lr", "the peak learning rate"),
    "max_lr": ("lr", "the peak learning rate"),
    "min_learning_rate": ("min_lr", "the learning rate at the end of the decay"),
    "lr_scheduler_type": ("lr_decay_style", "the shape of the decay"),
    "lr_scheduler": ("lr_decay_style", "the shape of the decay"),
    "decay_style": ("lr_decay_style", "the shape of the decay"),
    "warmup_steps": ("warmup", "iterations when above 1, else a fraction of the decay"),
    "lr_warmup_iters": ("warmup", "iterations when above 1, else a fraction of the decay"),
    "warmup_ratio": ("warmup", "a fraction of the decay when up to 1"),
    "max_steps": ("train_iters", "optimizer steps to train"),
    "num_steps": ("train_iters", "optimizer steps to train"),
    "total_steps": ("train_iters", "optimizer steps to train"),
    "max_iters": ("train_iters", "optimizer steps to train"),
    "batch_size": ("train_micro_batch_size_per_gpu", "sequences per rank per micro batch"),
    "per_device_train_batch_size": ("train_micro_batch_size_per_gpu", "per rank"),
    "gradient_accumulation": ("gradient_accumulation_steps", "micro batches per step"),
    "grad_accum": ("gradient_accumulation_steps", "micro batches per step"),
    "max_seq_len": ("seq_length", "tokens per training sequence"),
    "max_seq_length": ("seq_length", "tokens per training sequence"),
    "seq_len": ("seq_length", "tokens per training sequence"),
    "block_size": ("seq_length", "tokens per training sequence"),
    "context_length": ("seq_length", "tokens per training sequence"),
    "n_layer": ("num_layers", "transformer layers"),
    "n_layers": ("num_layers", "transformer layers"),
    "num_hidden_layers": ("num_layers", "transformer layers"),
    "n_embd": ("hidden_size", "the model width"),
    "d_model": ("hidden_size", "the model width"),
    "n_head": ("num_attention_heads", "query heads"),
    "n_heads": ("num_attention_heads", "query heads"),
    "num_heads": ("num_attention_heads", "query heads"),
    "num_key_value_heads": ("num_kv_heads", "key/value heads"),
    "n_kv_heads": ("num_kv_heads", "key/value heads"),
    "dropout": ("hidden_dropout and attention_dropout", "two keys"),
    "adam_beta1": (_BETAS, "Adam's betas live in the optimizer's params"),
    "adam_beta2": (_BETAS, "Adam's betas live in the optimizer's params"),
    "betas": (_BETAS, "Adam's betas live in the optimizer's params"),
    "adam_eps": (_EPS, "Adam's eps lives in the optimizer's params"),
    "adam_epsilon": (_EPS, "Adam's eps lives in the optimizer's params"),
    "mixed_precision": ("precision", "fp32, bf16 or fp16"),
    "max_grad_norm": ("gradient_clipping", "the gradient norm clipped to"),
    "grad_clip": ("gradient_clipping", "the gradient norm clipped to"),
    "output_dir": ("save", "the checkpoint folder"),
    "resume_from_checkpoint": ("load", "the checkpoint folder resumed from"),
    "save_steps": ("checkpoint_factor", "iterations between checkpoints"),
    "eval_steps": ("eval_interval", "iterations between evaluations"),
    "logging_steps": ("log_interval", "iterations between log lines"),
    "tokenizer": ("tokenizer_type and vocab_file", "two keys"),
    "tokenizer_name": ("tokenizer_type and vocab_file", "two keys"),
}


def did_you_mean(key: str, known: Iterable[str]) -> str:
    """'; did you mean ...?' for an unknown `key`, or '' when nothing is close."""
    if key in OTHER_NAMES:
        ours, what = OTHER_NAMES[key]
        return f"; did you mean '{ours}' ({what})?"
    close = difflib.get_close_matches(key, list(known), n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
