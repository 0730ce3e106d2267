"""The memory plan follows the fused head and loss (`loss_chunk_tokens` > 0).

The plan traces the model's real loss on `meta`, so the fused path's memory is what it
computes. Planned at two vocabularies (one process, fp32, 1024 tokens per micro-batch), the
last stage's micro-batch must grow with the vocabulary as each path really does:

- unfused: what it keeps for the backward grows by the logits, tokens × ΔV × 4 bytes;
- fused: what it keeps grows by the head weight's fp32 gradient alone, ΔV × h × 4 bytes (the
  hidden states' gradient does not depend on V), and its forward's peak by a few chunks of
  logits (`loss_chunk_tokens` × ΔV × 4 bytes each), never by the tokens × vocabulary term.
"""

from __future__ import annotations

from megatron.planning.plan import plan_run
from tests.tiny import tiny_config

SEQ, MICRO_BATCH, CHUNK, HIDDEN = 256, 4, 128, 64
TOKENS = SEQ * MICRO_BATCH


def _last_microbatch(vocab: int, chunk: int):
    cfg = tiny_config(
        vocab_size=vocab,
        loss_chunk_tokens=chunk,
        seq_length=SEQ,
        max_position_embeddings=SEQ,
        train_micro_batch_size_per_gpu=MICRO_BATCH,
    )
    assert cfg.model.hidden_size == HIDDEN
    return cfg.model.padded_vocab_size, plan_run(cfg).stages[-1].activations.microbatch


def test_the_logits_term_leaves_the_plan_on_the_fused_path():
    (v1, unfused1), (v2, unfused2) = _last_microbatch(20000, 0), _last_microbatch(40000, 0)
    (_, fused1), (_, fused2) = _last_microbatch(20000, CHUNK), _last_microbatch(40000, CHUNK)
    more = v2 - v1  # padded vocabulary columns added
    assert unfused2.held - unfused1.held >= TOKENS * more * 4
    assert fused2.held - fused1.held <= HIDDEN * more * 4 * 1.01
    assert fused2.forward - fused1.forward <= 4 * CHUNK * more * 4 < TOKENS * more * 4
    assert fused2.forward < unfused2.forward / 2
