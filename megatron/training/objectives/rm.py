"""`train_impl: rm`: a reward model trained on preference pairs (Bradley–Terry), as GPT-NeoX.

The model ends in a value head (`megatron/model/head.py::ValueHeadPipe`, chosen by
`ModelArgs.value_head`): one scalar per token, `(2b, s)` for a micro-batch whose first `b`
rows are the chosen (`pos`) sequences and the last `b` the rejected (`neg`) ones, so a pair
meets in one loss call on the last pipeline stage.

The reward of a sequence is the value at its last token whose loss-mask entry is nonzero.
GPT-NeoX's reward-model data (`preprocess_data_with_chat_template.py --for-rm`) labels only
the end-of-text token it appends, so that is the token just before it (the last token the
model sees before the end of the text); GPT-NeoX gathers every masked position and so needs
exactly one per sequence, which this equals. A sequence with no such token is refused, and
so is `pack_impl: pack_until_overflow` (`megatron/config/groups/post_training.py`): a row of several
pairs would be scored at its last pair only.

Loss over the `b` pairs of a micro-batch (GPT-NeoX's definition, `z_loss` its coefficient):

    loss = mean(-log σ(r_chosen - r_rejected)) + z_loss · mean(r_chosen² + r_rejected²)

For this objective `z_loss` is GPT-NeoX's reward penalty above, which keeps rewards near 0
(the Bradley–Terry loss only sees differences); for language-model training the same key is
PaLM's logit z-loss (`megatron/model/loss.py`). This is the one place that says so.

Metrics (GPT-NeoX's names), means over the pairs of a step: `accuracy` (share of pairs with
r_chosen > r_rejected), `margin` (r_chosen - r_rejected), `pos_values` and `neg_values`
(the mean chosen and rejected rewards).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from megatron.training.objectives.base import Objective
from megatron.training.objectives.logprobs import require_keys
from megatron.training.setup.batches import pair_inputs


class RewardDataError(ValueError):
    """A reward-model sample whose reward token cannot be found."""


def require_reward_tokens(loss_mask: torch.Tensor) -> None:
    """Refuse a micro-batch with a row that has no labelled token (so no reward). Asked of
    the loader's host tensors (`model_inputs`): on the device the answer would be a read."""
    if not bool((loss_mask > 0).any(dim=1).all()):
        raise RewardDataError(
            "a reward-model sequence has no labelled token, so it has no reward: the reward is "
            "read at the last token whose label is kept (label data with -100 everywhere but "
            "the final end-of-text token, as GPT-NeoX's --for-rm preprocessing writes)"
        )


def sequence_rewards(values: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """fp32 `(n,)` rewards: each row's value at its last token with a nonzero loss mask
    (every row has one: `require_reward_tokens`).

    Args:
        values: `(n, s)` value-head outputs.
        loss_mask: `(n, s)` the batch's loss mask (labels >= 0, see `batches.py`).
    """
    counted = loss_mask > 0  # (n, s)
    positions = torch.arange(values.shape[1], device=values.device).expand_as(values)
    last = torch.where(counted, positions, -1).argmax(dim=1, keepdim=True)  # (n, 1)
    return values.gather(1, last).squeeze(1).float()


def bradley_terry_loss(
    chosen: torch.Tensor, rejected: torch.Tensor, z_loss: float = 0.0
) -> torch.Tensor:
    """Mean `-log σ(chosen - rejected)` plus `z_loss · mean(chosen² + rejected²)` (fp32)."""
    loss = -F.logsigmoid(chosen - rejected).mean()
    if z_loss:
        loss = loss + z_loss * (chosen.square() + rejected.square()).mean()
    return loss


class RewardModel(Objective):
    """Bradley–Terry reward model over pos/neg pairs (see the module docstring)."""

    name = "rm"
    pairwise = True
    metric_names = ("accuracy", "margin", "pos_values", "neg_values")

    def __init__(self, cfg, tp_group=None):
        super().__init__(cfg, tp_group)
        self.z_loss = float(getattr(cfg.model, "z_loss", 0.0) or 0.0)

    def model_inputs(self, sample: dict, settings):
        """Chosen then rejected rows, `(2b, s)` each: `((tokens, positions), (labels, mask))`."""
        require_keys(sample, ("pos", "neg"), "train_impl: rm needs pairwise data")
        tokens, positions, labels, mask = pair_inputs(sample, settings)
        require_reward_tokens(mask)
        return (tokens, positions), (labels, mask)

    def loss(self, values: torch.Tensor, loss_inputs) -> torch.Tensor:
        """Loss of one micro-batch from the value head's `(2b, s)` outputs."""
        _, loss_mask = loss_inputs[:2]
        rewards = sequence_rewards(values, loss_mask)  # (2b,)
        chosen, rejected = rewards.chunk(2)
        with torch.no_grad():
            margin = chosen - rejected
            pairs = margin.numel()
            self.metrics.add("accuracy", (margin > 0).sum(), pairs)
            self.metrics.add("margin", margin.sum(), pairs)
            self.metrics.add("pos_values", chosen.sum(), pairs)
            self.metrics.add("neg_values", rejected.sum(), pairs)
        return bradley_terry_loss(chosen, rejected, self.z_loss)
