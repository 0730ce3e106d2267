"""Inference: the model at any tp/pp layout without an engine, token generation, generate.py.

| module       | what it holds                                                           |
| ------------ | ----------------------------------------------------------------------- |
| `model`      | `InferenceModel`: build, load any checkpoint layout, stage-to-stage forward |
| `kv_cache`   | `kv_cache(module)`: cached keys/values in place of attention backends   |
| `sampling`   | `SamplingSettings`, greedy / temperature / top-k / top-p                |
| `generation` | `generate(model, prompts, settings)`: batched, cached or recomputed     |
| `text`       | `generate_from_config(cfg)`: prompt sources, jsonl output (generate.py) |
| `precompute` | `precompute_from_config(cfg)`: reference log-probs (`text_gen_type: precompute`) |
"""

from megatron.inference.generation import Generated, generate, generate_batch
from megatron.inference.kv_cache import KVCache, kv_cache, supports_kv_cache
from megatron.inference.model import InferenceModel, inference_config, load_weights
from megatron.inference.sampling import SamplingSettings, filter_logits, sample
from megatron.inference.text import PROMPT_SOURCES, generate_from_config

__all__ = [
    "PROMPT_SOURCES",
    "Generated",
    "InferenceModel",
    "KVCache",
    "SamplingSettings",
    "filter_logits",
    "generate",
    "generate_batch",
    "generate_from_config",
    "inference_config",
    "kv_cache",
    "load_weights",
    "sample",
    "supports_kv_cache",
]
