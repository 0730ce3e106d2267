"""`train_impl: dpo`: Direct Preference Optimization (Rafailov et al. 2023).

A micro-batch of `b` pairs goes through the model as ONE batch of `2b` sequences, the chosen
(`pos`) half first and the rejected (`neg`) half second, so that with pipelines both halves
reach the loss together on the last stage. With per-sequence log-probabilities `pi` (policy)
and `ref` (reference), summed over label tokens:

    loss = mean over pairs of -log sigmoid(beta * ((pi_c - pi_r) - (ref_c - ref_r)))

Metrics, as GPT-NeoX names them: `chosen_rewards` = mean `beta * (pi_c - ref_c)`,
`rejected_rewards` likewise, `margins` = mean difference of the two, `reward_acc` = fraction
of pairs whose chosen reward is the larger.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from megatron.training.objectives.base import Objective
from megatron.training.objectives.logprobs import (
    objective_logps,
    require_keys,
    stored_sequence_logps,
)
from megatron.training.setup.batches import pair_inputs


def precomputed(cfg) -> bool:
    """Whether reference log-probabilities come from the samples (`precompute_model_name`)."""
    return bool(getattr(cfg.data, "precompute_model_name", None))


class DPO(Objective):
    name = "dpo"
    pairwise = True
    metric_names = ("chosen_rewards", "rejected_rewards", "margins", "reward_acc")

    def __init__(self, cfg, tp_group=None):
        super().__init__(cfg, tp_group)
        p = cfg.post_training
        self.beta, self.fp32, self.free = p.dpo_beta, p.dpo_fp32, p.dpo_reference_free
        self.stored_ref = precomputed(cfg) and not self.free

    @property
    def needs_reference(self) -> bool:
        return not (self.free or self.stored_ref)

    def model_inputs(self, sample, settings):
        require_keys(sample, ("pos", "neg"), "train_impl: dpo needs pairwise data")
        tokens, positions, labels, mask = pair_inputs(sample, settings)  # chosen, then rejected
        ref = torch.zeros(tokens.shape[0], dtype=torch.float32)
        if self.stored_ref:
            require_keys(sample, ("pos_ref", "neg_ref"), "precompute_model_name is set")
            stored = torch.cat(
                [torch.as_tensor(sample["pos_ref"]), torch.as_tensor(sample["neg_ref"])]
            )
            ref = stored_sequence_logps(stored, mask)
        return (tokens, positions), (labels, mask, ref)

    def reference_logps(self, logits, loss_inputs) -> torch.Tensor:
        labels, mask = loss_inputs[:2]
        return objective_logps(self, logits, labels, mask).detach()

    def loss(self, logits, loss_inputs):
        labels, mask, ref = loss_inputs
        # consumed, as the language-model loss consumes them (`model/loss.py::bound_loss_fn`)
        pi = objective_logps(self, logits, labels, mask, consume=True)  # (2b,)
        pi_c, pi_r = pi.chunk(2)
        ref_c, ref_r = ref.to(pi.dtype).chunk(2)
        logits_dpo = (pi_c - pi_r) - (ref_c - ref_r)  # (b,)
        loss = -F.logsigmoid(self.beta * logits_dpo).mean()
        with torch.no_grad():
            chosen = self.beta * (pi_c - ref_c)
            rejected = self.beta * (pi_r - ref_r)
            n = chosen.numel()
            self.metrics.add("chosen_rewards", chosen.sum(), n)
            self.metrics.add("rejected_rewards", rejected.sum(), n)
            self.metrics.add("margins", (chosen - rejected).sum(), n)
            self.metrics.add("reward_acc", (chosen > rejected).float().sum(), n)
        return loss
