"""`train_impl: normal`: the language-model loss of `megatron/model/loss.py`, unchanged."""

from __future__ import annotations

from megatron.training.objectives.base import Objective
from megatron.training.setup.batches import to_model_inputs


class LanguageModel(Objective):
    """Next-token cross entropy over the tokens the labels keep (label -100: no loss)."""

    name = "normal"
    language_model = True

    def install(self, model) -> None:
        """The model already carries `loss_fn` bound to its group and `z_loss`."""

    def model_inputs(self, sample, settings):
        return to_model_inputs(sample, settings)

    def loss(self, logits, loss_inputs):
        raise RuntimeError("train_impl normal uses the model's own loss_fn")
