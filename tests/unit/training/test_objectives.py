"""DPO and KTO losses and gradients against their published formulas, written here.

DPO: Rafailov et al. 2023, eq. 7. KTO: Ethayarajh et al. 2024, eq. 8, with GPT-NeoX's
reference point (each half of the micro-batch uses the other half's clamped mean log-ratio,
without gradient). Log-probabilities here come from `torch.log_softmax`, not from our
vocab-parallel cross entropy; checked on random logits and on a real tiny model, whose
vocabulary (100 tokens) is padded to 128 rows: the log-probabilities are over the 100 tokens,
the padding logits masked out.
"""

from __future__ import annotations

import math

import pytest
import torch

from megatron.training.objectives import OBJECTIVES, build_objective
from megatron.training.setup.batches import BatchSettings
from tests.tiny import tiny_config

V = 11


def _seq_logps(logits, labels, mask, vocab=None):
    logp = torch.log_softmax(logits[..., :vocab].double(), dim=-1)
    return (logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1) * mask).sum(-1)


def dpo_reference(pi, ref, beta):
    """-log sigmoid(beta * (log pi(yw)/ref(yw) - log pi(yl)/ref(yl))), mean over pairs."""
    b = pi.shape[0] // 2
    losses = []
    for i in range(b):
        z = beta * ((pi[i] - ref[i]) - (pi[b + i] - ref[b + i]))
        losses.append(-torch.log(1 / (1 + torch.exp(-z))))
    return torch.stack(losses).mean()


def kto_reference(pi, ref, token_rewards, beta, w_d, w_u):
    """lambda_y - v(x, y) with v = lambda_y * sigma(beta * reward * (r - z0)), mean (eq. 8).

    `token_rewards` `(b, s)`: one value per predicted position, as GPT-NeoX's `rewards`. Its
    class (lambda_y) comes from the row's SUM against 0.001, its `reward` is the row's MEAN
    (GPT-NeoX's `rewards.sum(-1) > 0.001` and `reward1.mean(-1)`)."""
    b = pi.shape[0]
    r = pi - ref
    halves = [range(0, b // 2), range(b // 2, b)]
    z0 = [
        sum(max(float(r[j].detach()), 0.0) for j in halves[1]) / (b // 2),  # for the first half
        sum(max(float(r[j].detach()), 0.0) for j in halves[0]) / (b // 2),
    ]
    losses = []
    for i in range(b):
        z = z0[0] if i < b // 2 else z0[1]
        row = [float(v) for v in token_rewards[i]]
        total, scale = sum(row), sum(row) / len(row)
        weight = w_d if total > 0.001 else w_u if total < -0.001 else 0.0
        losses.append(weight - weight * torch.sigmoid(beta * scale * (r[i] - z)))
    return torch.stack(losses).mean()


def _cfg(**changes):
    """The tiny config with objective keys set after resolution (no pairwise data here)."""
    return tiny_config().replace(**changes)


def _random_logits_cfg(**changes):
    """`_cfg` for logits of `V` columns, all of them tokens."""
    return _cfg(true_vocab_size=V, **changes)


def _batch(b, s, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, s, V, generator=g, dtype=torch.float64) * 2
    labels = torch.randint(0, V, (b, s), generator=g)
    mask = (torch.rand(b, s, generator=g) > 0.3).double()
    return logits, labels, mask


def test_registry_names_every_train_impl_value():
    from typing import get_args, get_type_hints

    from megatron.config.groups.post_training import PostTrainingConfig

    values = get_args(get_type_hints(PostTrainingConfig)["train_impl"])
    assert {"normal", "dpo", "kto"} <= set(values) <= set(OBJECTIVES)


@pytest.mark.parametrize("beta", [0.1, 0.5])
def test_dpo_loss_and_gradient_match_the_paper(beta):
    cfg = _random_logits_cfg(train_impl="dpo", dpo_beta=beta)
    objective = build_objective(cfg)
    logits, labels, mask = _batch(6, 7)
    ref = torch.randn(6, dtype=torch.float64)
    ours_logits = logits.clone().requires_grad_()
    theirs_logits = logits.clone().requires_grad_()
    ours = objective.loss(ours_logits.clone(), (labels, mask, ref))  # consumes them
    theirs = dpo_reference(_seq_logps(theirs_logits, labels, mask), ref, beta)
    ours.backward(), theirs.backward()
    torch.testing.assert_close(ours.double(), theirs, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(ours_logits.grad, theirs_logits.grad, rtol=1e-5, atol=1e-9)
    pi = _seq_logps(logits, labels, mask)
    chosen, rejected = beta * (pi[:3] - ref[:3]), beta * (pi[3:] - ref[3:])
    metrics = objective.summary()
    assert metrics["chosen_rewards"] == pytest.approx(float(chosen.mean()), rel=1e-5)
    assert metrics["margins"] == pytest.approx(float((chosen - rejected).mean()), rel=1e-5)
    assert metrics["reward_acc"] == pytest.approx(float((chosen > rejected).double().mean()))


# Per-token rewards of six samples of 5 predicted positions (the reward of the last token is
# dropped, as the label shift drops it): whole documents of +1/-1, a short document padded with
# 0, and two rows whose per-token rewards are small: their SUM is past GPT-NeoX's 0.001
# threshold (desirable / undesirable there) but their MEAN is not.
KTO_REWARDS = [
    [1.0] * 5,
    [-1.0] * 5,
    [0.0004] * 5,
    [-1.0, -1.0, 0.0, 0.0, 0.0],
    [-0.0004] * 5,
    [1.0] * 5,
]


def _kto_sample(token_rewards, seed):
    """A KTO sample `(b, s + 1)` whose rewards at positions 1.. are `token_rewards`."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.tensor(token_rewards, dtype=torch.float32)
    text = torch.randint(0, V, (rows.shape[0], rows.shape[1] + 1), generator=g)
    label = text.clone()
    label[:, 1] = -100  # a prompt token without loss
    reward = torch.cat([rows, torch.full((rows.shape[0], 1), 7.0)], dim=1)  # last: dropped
    return dict(text=text, label=label, reward=reward)


def test_kto_loss_and_gradient_match_the_paper():
    beta, w_d, w_u = 0.3, 1.0, 1.5
    cfg = _random_logits_cfg(
        train_impl="kto", kto_beta=beta, kto_desirable_weight=w_d, kto_undesirable_weight=w_u
    )
    objective = build_objective(cfg)
    sample = _kto_sample(KTO_REWARDS, seed=1)
    _, (labels, mask, _, reward) = objective.model_inputs(sample, BatchSettings())
    logits = _batch(6, 5, seed=1)[0]
    ref = torch.randn(6, dtype=torch.float64) - 4
    tokens = torch.tensor(KTO_REWARDS, dtype=torch.float64)
    ours_logits = logits.clone().requires_grad_()
    theirs_logits = logits.clone().requires_grad_()
    ours = objective.loss(
        ours_logits.clone(), (labels, mask, ref, reward)
    )  # it consumes its logits
    theirs = kto_reference(_seq_logps(theirs_logits, labels, mask), ref, tokens, beta, w_d, w_u)
    ours.backward(), theirs.backward()
    torch.testing.assert_close(ours.double(), theirs, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(ours_logits.grad, theirs_logits.grad, rtol=1e-5, atol=1e-9)
    r = beta * (_seq_logps(logits, labels, mask) - ref)
    total, scale = tokens.sum(-1), tokens.mean(-1)
    metrics = objective.summary()
    assert metrics["desirable_rewards"] == pytest.approx(float(r[total > 0].mean()), rel=1e-5)
    assert metrics["undesirable_rewards"] == pytest.approx(float(r[total < 0].mean()), rel=1e-5)
    assert metrics["reward_acc"] == pytest.approx(float((scale * r > 0).double().mean()))


def test_fp32_off_keeps_bf16_sums():
    cfg = _random_logits_cfg(train_impl="dpo", dpo_fp32=False)
    logits, labels, mask = _batch(4, 9, seed=2)
    objective = build_objective(cfg)
    low = objective.reference_logps(logits.bfloat16(), (labels, mask))
    exact = _seq_logps(logits.bfloat16().double(), labels, mask)
    assert not torch.equal(low.double(), exact)
    torch.testing.assert_close(low.double(), exact, rtol=2e-2, atol=0.1)


def test_pairwise_samples_become_one_micro_batch_with_stored_reference():
    objective = build_objective(_cfg(train_impl="dpo"))
    objective.stored_ref = True  # what precompute_model_name sets
    pos = torch.arange(2 * 5).reshape(2, 5)
    neg = pos + 20
    pos_label = pos.clone()
    pos_label[:, :2] = -100  # the prompt carries no loss
    pos_ref = torch.full((2, 5), -0.5)
    neg_ref = torch.full((2, 5), -1.0)
    sample = {
        "pos": pos,
        "neg": neg,
        "pos_label": pos_label,
        "pos_ref": pos_ref,
        "neg_ref": neg_ref,
    }
    (tokens, positions), (labels, mask, ref) = objective.model_inputs(sample, BatchSettings())
    assert tokens.tolist() == torch.cat([pos, neg])[:, :-1].tolist()
    assert mask.tolist() == [[0, 1, 1, 1]] * 2 + [[1, 1, 1, 1]] * 2
    assert ref.tolist() == [-1.5, -1.5, -4.0, -4.0]  # per-token values summed over the mask


def test_samples_without_pairs_are_refused_naming_the_keys():
    objective = build_objective(_cfg(train_impl="dpo"))
    with pytest.raises(ValueError, match=r"\['neg', 'pos'\]|\['pos', 'neg'\]"):
        objective.model_inputs({"text": torch.zeros(2, 5, dtype=torch.long)}, BatchSettings())


def _tiny_model_logits(seed):
    from megatron.model import build_model

    torch.manual_seed(seed)
    # the logits: the tests differentiate the objectives through them
    cfg = _cfg(seq_length=8, max_position_embeddings=8, loss_chunk_tokens=0)
    model = build_model(cfg)
    model.float()
    return model, cfg


@pytest.mark.parametrize("name", ["dpo", "kto"])
def test_gradients_of_a_real_tiny_model_match_the_formula(name):
    model, cfg = _tiny_model_logits(0)
    objective = build_objective(cfg.replace(train_impl=name))
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 100, (4, 9), generator=g)
    (inputs, positions), (labels, mask) = (
        (tokens[:, :-1], torch.arange(8).expand(4, 8)),
        (tokens[:, 1:], torch.ones(4, 8)),
    )
    ref = torch.tensor([-30.0, -31.0, -29.5, -32.0])
    reward = torch.tensor([1.0, -1.0, -1.0, 1.0])[:, None].expand(4, 8)  # per token
    extra = (ref,) if name == "dpo" else (ref, reward)

    def grads(loss_of):
        model.zero_grad()
        loss_of(model(inputs, positions)).backward()
        return [p.grad.clone() for p in model.parameters()]

    ours = grads(lambda logits: objective.loss(logits, (labels, mask, *extra)))
    beta = 0.1
    vocab = cfg.model.true_vocab_size
    assert vocab < cfg.model.padded_vocab_size  # padding rows to mask out
    if name == "dpo":

        def dpo(lg):
            return dpo_reference(_seq_logps(lg, labels, mask, vocab), ref.double(), beta)

        theirs = grads(dpo)
    else:

        def kto(lg):
            pi = _seq_logps(lg, labels, mask, vocab)
            return kto_reference(pi, ref.double(), reward.double(), beta, 1.0, 1.0)

        theirs = grads(kto)
    assert any(float(t.abs().max()) > 0 for t in theirs)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.double(), b.double(), rtol=1e-4, atol=1e-7)
    assert math.isfinite(float(ours[0].sum()))


def test_stored_reference_equals_the_reference_models_own():
    """Per-token values as `generate.py`'s precompute writes them (value k: log-prob of token
    k + 1, one per token) give the same sequence log-probs as running the model."""
    model, cfg = _tiny_model_logits(1)
    model.eval()
    objective = build_objective(cfg.replace(train_impl="dpo"))
    g = torch.Generator().manual_seed(4)
    pos, neg = (torch.randint(0, 100, (2, 9), generator=g) for _ in range(2))
    pos_label = pos.clone()
    pos_label[:, :3] = -100

    def per_token(tokens):
        with torch.no_grad():
            logits = model(tokens[:, :-1], torch.arange(8).expand(2, 8))
        logits = logits[..., : cfg.model.true_vocab_size]  # as InferenceModel cuts them
        logp = torch.log_softmax(logits.double(), -1).gather(-1, tokens[:, 1:, None])[..., 0]
        return torch.cat([logp, torch.zeros(2, 1, dtype=logp.dtype)], dim=1)  # (2, 9)

    sample = dict(pos=pos, neg=neg, pos_label=pos_label)
    (tokens, positions), loss_inputs = objective.model_inputs(sample, BatchSettings())
    with torch.no_grad():
        running = objective.reference_logps(model(tokens, positions), loss_inputs)
    objective.stored_ref = True
    stored = dict(sample, pos_ref=per_token(pos), neg_ref=per_token(neg))
    _, (_, _, ref) = objective.model_inputs(stored, BatchSettings())
    torch.testing.assert_close(ref.double(), running.double(), rtol=1e-5, atol=1e-5)
