"""Token generation on an `InferenceModel`, at any tensor/pipeline layout.

    outputs = generate(model, [[12, 7, 99], [5]], settings)   # one Generated per prompt

Prompts of equal length run as one batch (no padding, so positions are exact). Every step:
the model runs (the new token only with the key/value cache, the whole sequence with
`recompute`), the last stage picks the next token of each row (`sampling.py`) from the logits
of the last position (`forward(last_only=True)`: the output head runs for that position only)
over the tokenizer's vocabulary (`InferenceModel` cuts off the padding rows) and broadcasts
it to every rank of the model replica, so all stages feed the same tokens next. A row ends at
the end-of-document token (not included in its output) or after `maximum_tokens`, or when the
model's `max_position_embeddings` is reached (with `rope_scaling` dynamic, `factor` times it).

Every rank of the replica must call `generate` with the same prompts (collective).
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field

import torch

from megatron.inference.kv_cache import kv_cache, supports_kv_cache
from megatron.inference.sampling import SamplingSettings, sample
from megatron.model.rope_scaling import position_limit

log = logging.getLogger(__name__)


@dataclass
class Generated:
    """One prompt's result."""

    prompt: list[int]
    tokens: list[int] = field(default_factory=list)
    """Generated tokens, without the end-of-document token."""
    finished: bool = False
    """True when the end-of-document token ended it (False: a length limit did)."""
    seconds: float = 0.0


def _positions(start: int, stop: int, batch: int) -> torch.Tensor:
    return torch.arange(start, stop).expand(batch, stop - start)  # (b, s)


def _next_tokens(model, logits, settings, generator, batch: int) -> torch.Tensor:
    chosen = None
    if logits is not None:
        chosen = sample(logits[:, -1].float().cpu(), settings, generator)  # (b,)
    return model.broadcast_from_last_stage(chosen, (batch,), torch.long).cpu()


def generate_batch(
    model, prompts: list[list[int]], settings: SamplingSettings, generator=None
) -> list[Generated]:
    """Generate for prompts of one length (see the module docstring)."""
    start = time.perf_counter()
    batch, length = len(prompts), len(prompts[0])
    if any(len(p) != length for p in prompts):
        raise ValueError("generate_batch needs prompts of equal length; use generate()")
    limit = position_limit(model.args)
    if length >= limit:
        raise ValueError(f"a prompt of {length} tokens leaves no room: max_positions {limit}")
    steps = min(settings.maximum_tokens, limit - length)
    tokens = torch.tensor(prompts, dtype=torch.long)  # (b, s)
    results = [Generated(list(p)) for p in prompts]
    done = torch.zeros(batch, dtype=torch.bool)
    use_cache = not settings.recompute and supports_kv_cache(model.args)
    cache = kv_cache(model.module) if use_cache else contextlib.nullcontext()
    with cache:
        inputs, positions = tokens, _positions(0, length, batch)
        for _ in range(steps):
            logits = model.forward(inputs, positions, last_only=True)  # (b, 1, V)
            chosen = _next_tokens(model, logits, settings, generator, batch)
            for row, token in enumerate(chosen.tolist()):
                if done[row]:
                    continue
                if token == settings.eod:
                    done[row] = results[row].finished = True
                else:
                    results[row].tokens.append(token)
            if bool(done.all()):
                break
            tokens = torch.cat((tokens, chosen[:, None]), dim=1)  # (b, s + 1)
            if use_cache:
                inputs, positions = (
                    chosen[:, None],
                    _positions(tokens.shape[1] - 1, tokens.shape[1], batch),
                )
            else:
                inputs, positions = tokens, _positions(0, tokens.shape[1], batch)
    seconds = time.perf_counter() - start
    for result in results:
        result.seconds = seconds
    return results


def generate(
    model,
    prompts: list[list[int]],
    settings: SamplingSettings,
    *,
    batch_size: int = 8,
    generator: torch.Generator | None = None,
) -> list[Generated]:
    """Results for `prompts` in their order, batching prompts of equal length."""
    if not settings.recompute and not supports_kv_cache(model.args):
        log.warning(
            "this model (pos_emb %s, attention types %s) cannot use the key/value cache; "
            "recomputing",
            model.args.pos_emb,
            sorted(set(model.args.layer_attention_types) or {"global"}),
        )
    limit = position_limit(model.args)
    trimmed = []
    for prompt in prompts:
        if not prompt:
            raise ValueError("empty prompt: give at least one token (e.g. end-of-document)")
        if len(prompt) >= limit:
            log.warning("prompt of %d tokens cut to its last %d", len(prompt), limit - 1)
            prompt = prompt[-(limit - 1) :]
        trimmed.append(prompt)
    by_length: dict[int, list[int]] = {}
    for index, prompt in enumerate(trimmed):
        by_length.setdefault(len(prompt), []).append(index)
    results: list[Generated | None] = [None] * len(trimmed)
    for indices in by_length.values():
        for i in range(0, len(indices), batch_size):
            chunk = indices[i : i + batch_size]
            outputs = generate_batch(model, [trimmed[j] for j in chunk], settings, generator)
            for j, output in zip(chunk, outputs):
                results[j] = output
    return results  # type: ignore[return-value]
