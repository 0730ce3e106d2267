"""`train_impl: rm` against the Bradley–Terry model written here, independently of rm.py.

Reference: P(chosen ≻ rejected) = σ(r_c - r_r) (Bradley & Terry 1952, as used for reward
models by Ouyang et al. 2022), loss = mean over pairs of log(1 + exp(-(r_c - r_r))), plus
GPT-NeoX's reward penalty z · mean(r_c² + r_r²); its gradient in closed form. On a real tiny
model the reference rewards come from running every sequence alone, cut after its reward token
(causal attention makes that the same value), so the token choice is checked too.
"""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch

from megatron.model import ModelArgs, build_gpt
from megatron.training.objectives import OBJECTIVES, build_objective
from megatron.training.objectives.rm import RewardDataError, RewardModel
from megatron.training.setup.batches import BatchSettings
from tests.unit.model.tiny import assert_close, neox_args

Z = 0.05


def objective(z_loss: float = Z) -> RewardModel:
    return RewardModel(SimpleNamespace(model=SimpleNamespace(z_loss=z_loss)))


def reference_loss(chosen: list[float], rejected: list[float], z: float) -> float:
    n = len(chosen)
    bt = sum(math.log1p(math.exp(-(c - r))) for c, r in zip(chosen, rejected)) / n
    return bt + z * sum(c * c + r * r for c, r in zip(chosen, rejected)) / n


def reference_grads(chosen, rejected, z):
    """d loss / d r_c and d loss / d r_r per pair: ∓σ(-(r_c - r_r))/n + 2 z r/n."""
    n = len(chosen)
    dc, dr = [], []
    for c, r in zip(chosen, rejected):
        s = 1.0 / (1.0 + math.exp(c - r))  # σ(-(c - r))
        dc.append(-s / n + 2 * z * c / n)
        dr.append(s / n + 2 * z * r / n)
    return dc, dr


def test_registered_under_train_impl_rm():
    cfg = SimpleNamespace(post_training=SimpleNamespace(train_impl="rm"), model=SimpleNamespace())
    assert OBJECTIVES["rm"] is RewardModel
    assert isinstance(build_objective(cfg), RewardModel)
    assert ModelArgs.from_config(_cfg("rm")).value_head
    assert not ModelArgs.from_config(_cfg("normal")).value_head


def _cfg(train_impl):
    ns = SimpleNamespace
    model = ns(num_layers=1, hidden_size=8, num_attention_heads=2, seq_length=4)
    model.padded_vocab_size = 16
    return ns(model=model, post_training=ns(train_impl=train_impl))


@pytest.mark.parametrize("z", [0.0, Z])
def test_loss_and_gradient_on_fixed_rewards(z):
    chosen, rejected = [1.5, -0.25, 0.3], [0.5, 0.75, 0.3]
    b, s = len(chosen), 6
    at = [5, 2, 3, 4, 0, 5]  # reward token of each row (chosen rows, then rejected rows)
    values = torch.randn(2 * b, s, dtype=torch.float64)
    mask = torch.zeros(2 * b, s)
    for row, (pos, r) in enumerate(zip(at, chosen + rejected)):
        values[row, pos] = r
        mask[row, pos] = 1.0
    values.requires_grad_()
    loss = objective(z).loss(values, (torch.zeros(2 * b, s, dtype=torch.long), mask))
    assert loss.item() == pytest.approx(reference_loss(chosen, rejected, z), rel=1e-6)
    loss.backward()
    expected = torch.zeros(2 * b, s, dtype=torch.float64)
    dc, dr = reference_grads(chosen, rejected, z)
    for row, (pos, g) in enumerate(zip(at, dc + dr)):
        expected[row, pos] = g
    assert torch.allclose(values.grad, expected, atol=1e-7)


def test_reward_token_is_the_last_labelled_one_and_metrics():
    values = torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.0, 9.0, 1.0, 7.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])  # rows: chosen, rejected
    rm = objective(0.0)
    rm.loss(values, (None, mask))
    metrics = rm.metrics.reduce()
    assert metrics == pytest.approx(
        {"accuracy": 1.0, "margin": 3.0, "pos_values": 3.0, "neg_values": 0.0}
    )
    args = dataclasses.replace(neox_args(value_head=True), seq_length=8)
    unlabelled = pair_samples(args, [(2, 3)])
    unlabelled["neg_label"][:] = -100  # the rejected row keeps no token
    with pytest.raises(RewardDataError, match="no labelled token"):  # refused by the loader
        rm.model_inputs(unlabelled, BatchSettings())


def pair_samples(args: ModelArgs, lengths, seed=0):
    """Loader samples of GPT-NeoX's --for-rm form: text ends in an end-of-text token (the
    only labelled one), then padding; `lengths` = [(chosen, rejected), ...] content lengths."""
    gen = torch.Generator().manual_seed(seed)
    eod, s = args.vocab_size - 1, args.seq_length
    sample = {k: torch.zeros(len(lengths), s + 1, dtype=torch.long) for k in ("pos", "neg")}
    for key in ("pos_label", "neg_label"):
        sample[key] = torch.full((len(lengths), s + 1), -100, dtype=torch.long)
    for i, pair in enumerate(lengths):
        for key, n in zip(("pos", "neg"), pair):
            sample[key][i, :n] = torch.randint(0, eod, (n,), generator=gen)
            sample[key][i, n] = eod
            sample[f"{key}_label"][i, n] = eod
    return sample


def test_loss_and_gradients_on_a_real_tiny_model():
    args = neox_args(value_head=True, hidden_dropout=0.0, attention_dropout=0.0)
    lengths = [(5, 9), (16, 3), (1, 12)]
    sample = pair_samples(args, lengths)
    rm = objective()
    inputs, loss_inputs = rm.model_inputs(sample, BatchSettings())
    assert inputs[0].shape == (2 * len(lengths), args.seq_length)
    model = build_gpt(args)
    loss = rm.loss(model(*inputs), loss_inputs)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}

    twin = build_gpt(args)
    chosen, rejected = [], []
    for i, pair in enumerate(lengths):
        for key, n, out in zip(("pos", "neg"), pair, (chosen, rejected)):
            tokens = sample[key][i : i + 1, :n]  # everything up to the token before end-of-text
            out.append(twin(tokens, torch.arange(n)[None])[0, -1])
    chosen, rejected = torch.stack(chosen), torch.stack(rejected)
    reference = (
        torch.log1p(torch.exp(-(chosen - rejected))).mean()
        + Z * (chosen.square() + rejected.square()).mean()
    )
    assert loss.item() == pytest.approx(reference.item(), rel=1e-5)
    reference.backward()
    for name, p in twin.named_parameters():
        # packed rows against one sequence at a time: fp32 sums in another order
        assert_close(grads[name], p.grad, f"gradient of {name}", tol=1e-4)


def test_value_head_model_inputs_put_chosen_rows_first():
    args = dataclasses.replace(neox_args(value_head=True), seq_length=8)
    sample = pair_samples(args, [(2, 3), (4, 5)], seed=1)
    (tokens, positions), (labels, mask) = objective().model_inputs(sample, BatchSettings())
    assert torch.equal(tokens[:2], sample["pos"][:, :-1])
    assert torch.equal(tokens[2:], sample["neg"][:, :-1])
    assert mask.sum(dim=1).tolist() == [1.0] * 4
    assert mask.argmax(dim=1).tolist() == [1, 3, 2, 4]  # the token before end-of-text


def test_config_rm_reads_pairs_and_keeps_z_loss_as_the_reward_penalty():
    from megatron.config.schema import ConfigError
    from tests.unit.tools.test_hf_reward_export import FAMILIES, reward_config

    llama = FAMILIES["LlamaForSequenceClassification"]
    cfg = reward_config({**llama, "z_loss": 0.01})
    assert cfg.post_training.train_impl == "rm" and RewardModel(cfg).z_loss == 0.01
    assert isinstance(build_objective(cfg), RewardModel)
    assert ModelArgs.from_config(cfg).value_head
    with pytest.raises(ConfigError, match="train_impl: rm.*needs dataset_impl: pairwise"):
        reward_config(
            {
                **llama,
                "dataset_impl": "gpt2",
                "pos_train_data_paths": None,
                "neg_train_data_paths": None,
                "pos_train_label_data_paths": None,
                "neg_train_label_data_paths": None,
                "data_path": "x_text_document",
            }
        )
    unlabelled = {"pos_train_label_data_paths": None, "neg_train_label_data_paths": None}
    with pytest.raises(ConfigError, match="reward at its last labelled token"):
        reward_config({**llama, **unlabelled})
