"""The last pipeline stage keeps no micro-batch's logits after the step.

DeepSpeed 0.19.8's pipeline engine kept each buffer's last-stage output (the logits, a tokens
x vocabulary tensor) until the buffer's next forward: two of them through the optimizer step
and into the next step (`megatron/training/setup/engine.py::free_last_stage_outputs`). Counted
over a real step on one rank: what the step made and still holds at its end must be less than
one micro-batch's logits.
"""

from __future__ import annotations

from megatron.planning.trace import LiveBytes
from tests.distributed import run_distributed
from tests.tiny import CHAR_VOCAB, resolve, stepping_trainer, tiny_settings


def _kept_after_a_step(rank, world_size, folder):
    settings = tiny_settings(folder, save=None, load=None, train_iters=4, hidden_dropout=0.0,
                             attention_dropout=0.0, gradient_accumulation_steps=2)  # fmt: skip
    cfg = resolve(settings, world_size)
    with LiveBytes("cpu") as live:
        parts, steps, batches = stepping_trainer(cfg, 4)
        start = live.ops
        steps.train(batches)
        kept = sum(a.nbytes for a in live.allocations if a.born > start and a.freed is None)
    t = cfg.training
    logits = t.train_micro_batch_size_per_gpu * cfg.model.seq_length * CHAR_VOCAB * 4
    return kept, logits


def test_the_step_keeps_no_logits(tmp_path):
    kept, logits = run_distributed(_kept_after_a_step, 1, str(tmp_path))[0]
    assert kept < logits, (kept, logits)
