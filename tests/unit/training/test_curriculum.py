"""Sequence-length curriculum (`megatron/training/setup/curriculum.py`): the lengths follow the
schedule as GPT-NeoX runs it (DeepSpeed's scheduler asked with iteration + 1), written out
here from DeepSpeed's documented formulas; micro-batches are cut as GPT-NeoX's `get_batch_pipe`
cuts them; a resumed schedule continues exactly; tokens/s and FLOPs count the real length
(against torch's FLOP counter)."""

from __future__ import annotations

import math

import pytest
import torch

from megatron.config import ConfigError
from megatron.model import ModelArgs
from megatron.training.metrics.flops import step_work
from megatron.training.metrics.monitor import TrainMonitor
from megatron.training.setup.curriculum import SeqlenCurriculum
from tests.flop_counter import counted_training_flops_per_token
from tests.tiny import tiny_config

LINEAR = {
    "enabled": True,
    "curriculum_type": "seqlen",
    "min_difficulty": 8,
    "max_difficulty": 64,
    "schedule_type": "fixed_linear",
    "schedule_config": {"total_curriculum_step": 10, "difficulty_step": 8},
}


def _linear(step, low=8, high=64, total=10, every=8, degree=1):
    """DeepSpeed 0.19.8's fixed_linear / fixed_root (the scheduler we run): the root of the
    progress scaled to the range, floored to a multiple of difficulty_step, raised to the first
    multiple at or above min_difficulty, capped at max_difficulty."""
    d = math.floor((step / total) ** (1 / degree) * (high - low) + low)
    return min(max(d - d % every, math.ceil(low / every) * every), high)


def _deeperspeed(step, low=8, high=64, total=10, every=8, degree=1):
    """GPT-NeoX's DeeperSpeed (0.16.5): the same without the lower clamp."""
    d = math.floor((step / total) ** (1 / degree) * (high - low) + low)
    return min(d - d % every, high)


def _lengths(curriculum, start, stop):
    return [curriculum.begin_step(it) for it in range(start, stop)]


@pytest.mark.parametrize("degree", [1, 2])
def test_lengths_follow_the_schedule_from_iteration_plus_one(degree):
    section = dict(LINEAR, schedule_type="fixed_linear" if degree == 1 else "fixed_root")
    section["schedule_config"] = dict(LINEAR["schedule_config"], root_degree=degree)
    curriculum = SeqlenCurriculum(section, 64, lambda n: n)
    assert _lengths(curriculum, 0, 14) == [_linear(i + 1, degree=degree) for i in range(14)]


def test_a_min_difficulty_off_the_step_follows_deepspeed_not_deeperspeed():
    """We run DeepSpeed 0.19.8's scheduler: with min_difficulty 12 and difficulty_step 8 the
    first lengths are 16 (the next multiple), where GPT-NeoX's DeeperSpeed floors to 8, below
    min_difficulty (and to 0, an empty sequence, when min_difficulty < difficulty_step). With
    min_difficulty a multiple of the step, as in LINEAR, the two agree at every step."""
    schedule = {"total_curriculum_step": 100, "difficulty_step": 8}
    section = dict(LINEAR, min_difficulty=12, schedule_config=schedule)
    curriculum = SeqlenCurriculum(section, 64, lambda n: n)
    ours = _lengths(curriculum, 0, 14)
    assert ours == [_linear(i + 1, low=12, total=100) for i in range(14)] and ours[0] == 16
    assert _deeperspeed(1, low=12, total=100) == 8 and _deeperspeed(1, low=4, total=100) == 0
    assert [_linear(i) for i in range(1, 14)] == [_deeperspeed(i) for i in range(1, 14)]


def test_lengths_never_exceed_seq_length():
    curriculum = SeqlenCurriculum(LINEAR, 32, lambda n: n)
    assert max(_lengths(curriculum, 0, 14)) == 32


# DeepSpeed's scheduler stops asking once it reaches max_difficulty, so this schedule stays at
# 32 from step 2 on; only the state carried across a resume keeps it there.
DISCRETE = {
    "enabled": True,
    "min_difficulty": 8,
    "max_difficulty": 32,
    "schedule_type": "fixed_discrete",
    "schedule_config": {"difficulty": [8, 32, 16], "max_step": [1, 2]},
}


def test_a_resumed_schedule_continues_the_unbroken_one():
    unbroken = SeqlenCurriculum(DISCRETE, 32, lambda n: n)
    assert _lengths(unbroken, 0, 6) == [8, 32, 32, 32, 32, 32]
    first = SeqlenCurriculum(DISCRETE, 32, lambda n: n)
    _lengths(first, 0, 3)
    resumed = SeqlenCurriculum(DISCRETE, 32, lambda n: n)
    resumed.resume(3, first.state_dict())
    assert _lengths(resumed, 3, 6) == [32, 32, 32]
    linear = SeqlenCurriculum(LINEAR, 64, lambda n: n)  # no saved state: GPT-NeoX's resume
    linear.resume(5, None)
    assert _lengths(linear, 5, 8) == [_linear(i + 1) for i in range(5, 8)]


def test_micro_batches_keep_the_first_tokens_of_every_sample():
    curriculum = SeqlenCurriculum(LINEAR, 64, lambda n: n)
    text = torch.randint(0, 50, (2, 65))
    tokens, labels = text[:, :-1], text[:, 1:]
    positions, mask = torch.arange(64).expand(2, 64), torch.rand(2, 64)
    batches = curriculum.truncated(iter([((tokens, positions), (labels, mask))] * 2))
    curriculum.begin_step(2)  # step 3: 8 + 56 * 3 / 10 = 24.8 -> 24
    (t, p), (lab, m) = next(batches)
    # GPT-NeoX's get_batch_pipe: x[:, :curriculum_seqlen] for tokens, positions, labels, mask
    assert t.shape == (2, 24) and torch.equal(t, text[:, :24]) and torch.equal(lab, text[:, 1:25])
    assert torch.equal(p, torch.arange(24).expand(2, 24)) and torch.equal(m, mask[:, :24])
    curriculum.begin_step(20)  # past the schedule: whole samples
    (t, _), _ = next(batches)
    assert t.shape == (2, 64)


def test_tokens_per_second_and_flops_count_the_real_length():
    """A step cut to 8 tokens: its tokens are the batch's samples times 8 and its FLOPs what
    torch's counter counts over the model at sequence 8 (not the product's own step_work)."""
    cfg = tiny_config()
    full, short = step_work(cfg), step_work(cfg, seq_length=8)
    tokens = cfg.training.train_batch_size * 8
    counted = tokens * counted_training_flops_per_token(ModelArgs.from_config(cfg), 8)
    assert short.tokens == tokens and short.flops == pytest.approx(counted, rel=1e-9)
    ticks = iter([0.0, 1.0])
    monitor = TrainMonitor(
        full.tokens, full.flops_per_token, 1, None, 10, clock=lambda: next(ticks)
    )
    monitor.step(1.0, applied=True, work=short)
    record = monitor.record(1, lr=1e-3, grad_norm=None, loss_scale=None)
    assert record["tokens_per_sec"] == tokens
    assert record["tflops_per_gpu"] == pytest.approx(counted / 1e12, rel=1e-9)
    assert monitor.tokens_trained == tokens


def _config(**section):
    return tiny_config(curriculum_learning={**LINEAR, **section})


@pytest.mark.parametrize(
    "section, words",
    [
        ({"curriculum_type": "vocab"}, "only 'seqlen'"),
        ({"schedule_type": "custom"}, "schedule_type 'custom'"),
        ({"schedule_config": {"difficulty_step": 8}}, "total_curriculum_step"),
        ({"max_difficulty": 64}, "seq_length (32)"),
        ({"min_difficulty": 0, "max_difficulty": 16}, "1 <= min_difficulty"),
    ],
)
def test_a_bad_section_is_refused_naming_what_is_valid(section, words):
    with pytest.raises(ConfigError, match="curriculum_learning") as refused:
        _config(**{"max_difficulty": 32, **section})
    assert words in str(refused.value)


def test_only_the_language_model_objective_takes_a_curriculum():
    with pytest.raises(ConfigError, match="train_impl: normal only"):
        tiny_config(curriculum_learning=dict(LINEAR, max_difficulty=32), train_impl="kto")


def test_the_section_is_not_handed_to_deepspeed():
    from megatron.config.ds_export import deepspeed_config

    cfg = _config(max_difficulty=32)
    assert "curriculum_learning" not in deepspeed_config(cfg)  # DeepSpeed 0.19 refuses it
