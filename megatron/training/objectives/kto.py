"""`train_impl: kto`: Kahneman-Tversky Optimization (Ethayarajh et al. 2024).

Each sample is one document (`pack_impl: unpacked`, refused otherwise by
`megatron/config/groups/post_training.py`) with a reward per token (the `reward` dataset). As in
GPT-NeoX, with `R_t` the rewards at the sample's `seq_length` predicted positions (the last
token's dropped, padding 0): the sample is desirable when `sum_t R_t > 0.001`, undesirable
when `sum_t R_t < -0.001`, else neither (weight 0): the threshold applies to the SUM. The
`reward` scaling the log-ratio is the MEAN `sum_t R_t / seq_length`, padding included (so a
document of n tokens rewarded +1 each scales it by n / seq_length). With `r` = the
policy-to-reference log-ratio of a sequence (log-probabilities summed over label tokens):

    loss = mean over samples of lambda_y * (1 - sigmoid(beta * reward * (r - z)))

where `lambda_y` is `kto_desirable_weight`, `kto_undesirable_weight` or 0 by the class above,
and `z` the reference point, the KL estimate. As GPT-NeoX does (it has no separate mismatched
KL inputs), the micro-batch is split in two halves and each half's `z` is the other half's
mean of `max(r, 0)`, without gradient; a micro-batch therefore has an even number of samples.

The weight is each sample's own `lambda_y` (the paper's, and TRL's). GPT-NeoX multiplies each
half by the MEAN weight of that half, which differs only when the two weights differ and a
half mixes both classes.

Metrics: `desirable_rewards` / `undesirable_rewards` (mean `beta * r` per class), `margins`
(their difference), `reward_acc` (fraction whose `reward * r` is positive), `kl` (mean of the
two halves' estimates).
"""

from __future__ import annotations

import torch

from megatron.training.objectives.base import Objective
from megatron.training.objectives.dpo import precomputed
from megatron.training.objectives.logprobs import (
    objective_logps,
    require_keys,
    stored_sequence_logps,
)
from megatron.training.setup.batches import to_model_inputs

REWARD_EPS = 0.001  # GPT-NeoX's threshold on the reward SUM: desirable, undesirable, neither


class KTO(Objective):
    name = "kto"
    metric_names = ("desirable_rewards", "undesirable_rewards", "reward_acc", "kl")

    def __init__(self, cfg, tp_group=None):
        super().__init__(cfg, tp_group)
        p = cfg.post_training
        self.beta, self.fp32 = p.kto_beta, p.kto_fp32
        self.weights = (p.kto_desirable_weight, p.kto_undesirable_weight)
        self.stored_ref = precomputed(cfg)

    @property
    def needs_reference(self) -> bool:
        return not self.stored_ref

    def summary(self, topology=None) -> dict[str, float]:
        metrics = super().summary(topology)
        if "desirable_rewards" in metrics and "undesirable_rewards" in metrics:
            metrics["margins"] = metrics["desirable_rewards"] - metrics["undesirable_rewards"]
        return metrics

    def step_metrics(self, topology=None) -> dict[str, torch.Tensor]:
        metrics = super().step_metrics(topology)
        desirable, undesirable = metrics["desirable_rewards"], metrics["undesirable_rewards"]
        both = desirable[1] * undesirable[1]  # 1 where the step had both classes, else 0
        metrics["margins"] = torch.stack([(desirable[0] - undesirable[0]) * both, both])
        return metrics

    def model_inputs(self, sample, settings):
        require_keys(sample, ("text", "reward"), "train_impl: kto needs text with rewards")
        inputs, (labels, mask) = to_model_inputs(sample, settings)
        if labels.shape[0] % 2:
            raise ValueError(f"train_impl: kto needs an even micro-batch, got {labels.shape[0]}")
        # (b, s): the input tokens' rewards (the last token's dropped), as GPT-NeoX reads them
        reward = torch.as_tensor(sample["reward"]).float()[:, :-1].contiguous()
        ref = torch.zeros(labels.shape[0], dtype=torch.float32)
        if self.stored_ref:
            require_keys(sample, ("ref",), "precompute_model_name is set")
            ref = stored_sequence_logps(sample["ref"], mask)
        return inputs, (labels, mask, ref, reward)

    def reference_logps(self, logits, loss_inputs) -> torch.Tensor:
        labels, mask = loss_inputs[:2]
        return objective_logps(self, logits, labels, mask).detach()

    def loss(self, logits, loss_inputs):
        labels, mask, ref, reward = loss_inputs
        # consumed, as the language-model loss consumes them (`model/loss.py::bound_loss_fn`)
        pi = objective_logps(self, logits, labels, mask, consume=True)  # (b,)
        ratio = pi - ref.to(pi.dtype)
        half1, half2 = ratio.detach().chunk(2)
        kl1, kl2 = half1.clamp(min=0).mean(), half2.clamp(min=0).mean()
        z = torch.cat([kl2.expand_as(half1), kl1.expand_as(half2)])  # the other half's
        total = reward.float().sum(-1)  # (b,): the class (module docstring)
        desirable, undesirable = total > REWARD_EPS, total < -REWARD_EPS
        reward = reward.float().mean(-1).to(pi.dtype)  # (b,): the scale
        weight = desirable.float() * self.weights[0] + undesirable.float() * self.weights[1]
        value = torch.sigmoid(self.beta * reward * (ratio - z))
        loss = (weight * (1 - value)).mean()
        with torch.no_grad():
            implicit = self.beta * ratio
            # class sums by selection, not mask indexing (whose output size is read back)
            zero = implicit.new_zeros(())
            chosen = torch.where(desirable, implicit, zero).sum()
            self.metrics.add("desirable_rewards", chosen, desirable.sum())
            shunned = torch.where(undesirable, implicit, zero).sum()
            self.metrics.add("undesirable_rewards", shunned, undesirable.sum())
            self.metrics.add("reward_acc", (reward * ratio > 0).float().sum(), ratio.numel())
            self.metrics.add("kl", (kl1 + kl2) / 2, 1)
        return loss
