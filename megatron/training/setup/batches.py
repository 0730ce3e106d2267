"""From data-loader samples to model inputs.

The loader yields `{"text": int64 (b, s + 1)}` (and `"label"` with per-token labels). The
model takes `((tokens, position_ids), (labels, loss_mask))`, all `(b, s)`:

    tokens    = text[:, :-1]
    labels    = text[:, 1:]               (or label[:, 1:] when the dataset has labels)
    loss_mask = 1, 0 where the label is negative (label data masks with -100) and, with
                `eod_mask_loss`, where the input token is end-of-document
    position  = 0 .. s-1, restarting after each end-of-document with `reset_position_ids`
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class BatchSettings:
    """How samples become inputs (`from_config` reads `cfg.data`)."""

    eod_token: int | None = None
    eod_mask_loss: bool = False
    reset_position_ids: bool = False

    def __post_init__(self):
        if (self.eod_mask_loss or self.reset_position_ids) and self.eod_token is None:
            raise ValueError(
                "eod_mask_loss / reset_position_ids need the tokenizer's end-of-document "
                "token, and this tokenizer has none"
            )

    @classmethod
    def from_config(cls, cfg, eod_token: int | None) -> BatchSettings:
        d = cfg.data
        if getattr(d, "reset_attention_mask", False):
            raise ValueError(
                "reset_attention_mask: true is not supported: the model attends causally over "
                "the whole sequence; set reset_attention_mask: false"
            )
        return cls(
            eod_token=eod_token,
            eod_mask_loss=bool(getattr(d, "eod_mask_loss", False)),
            reset_position_ids=bool(getattr(d, "reset_position_ids", False)),
        )


def reset_positions(tokens: torch.Tensor, eod: int) -> torch.Tensor:
    """Positions `(b, s)` that restart at 0 right after every `eod` token."""
    b, s = tokens.shape
    index = torch.arange(s, device=tokens.device).expand(b, s)  # (b, s)
    starts = torch.zeros_like(index)
    # a document starts at i when token i-1 is eod; carry the latest start forward
    starts[:, 1:] = torch.where(tokens[:, :-1] == eod, index[:, 1:], 0)
    return index - starts.cummax(dim=1).values


def to_model_inputs(sample: dict, settings: BatchSettings):
    """`((tokens, position_ids), (labels, loss_mask))` for one micro-batch (see above)."""
    text = torch.as_tensor(sample["text"]).long()  # (b, s + 1)
    tokens = text[:, :-1].contiguous()
    if "label" in sample:
        labels = torch.as_tensor(sample["label"]).long()[:, 1:].contiguous()
    else:
        labels = text[:, 1:].contiguous()
    loss_mask = (labels >= 0).float()
    labels = labels.clamp(min=0)
    if settings.eod_mask_loss:
        loss_mask[tokens == settings.eod_token] = 0.0
    if settings.reset_position_ids:
        position_ids = reset_positions(tokens, settings.eod_token)
    else:
        position_ids = torch.arange(tokens.shape[1]).expand_as(tokens).contiguous()
    return (tokens, position_ids), (labels, loss_mask)


def pair_inputs(sample: dict, settings: BatchSettings):
    """`(tokens, position_ids, labels, loss_mask)` of a pairwise sample, each `(2b, s)`: the
    chosen (`pos`, `pos_label`) rows, then the rejected (`neg`, `neg_label`) rows, so the two
    halves of every pair travel in one micro-batch and meet in the loss on the last stage."""
    halves = []
    for side in ("pos", "neg"):
        half = {"text": sample[side]}
        if f"{side}_label" in sample:
            half["label"] = sample[f"{side}_label"]
        (tokens, positions), (labels, mask) = to_model_inputs(half, settings)
        halves.append((tokens, positions, labels, mask))
    return tuple(torch.cat(pair) for pair in zip(*halves, strict=True))


class ModelBatches:
    """Iterator of model inputs over a loader iterator; counts the micro-batches it gave.

    `objective` (`megatron/training/objectives/`) turns samples into inputs; without one,
    `to_model_inputs` (the language-model objective's)."""

    def __init__(self, samples, settings: BatchSettings, device=None, objective=None):
        self.samples = samples
        self.settings = settings
        self.device = device
        self.convert = objective.model_inputs if objective is not None else to_model_inputs
        self.taken = 0

    def __iter__(self):
        return self

    def __next__(self):
        inputs, loss_inputs = self.convert(next(self.samples), self.settings)
        self.taken += 1
        if self.device is not None:
            inputs, loss_inputs = (
                tuple(t.to(self.device, non_blocking=True) for t in part)
                for part in (inputs, loss_inputs)
            )
        return inputs, loss_inputs
