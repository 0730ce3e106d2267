"""Post-training objectives (`cfg.post_training`), in GPT-NeoX's vocabulary and defaults.

`train_impl` picks the objective (`megatron/training/objectives/`): `normal` (language
modelling, with label masks for supervised fine-tuning), `dpo` (Rafailov et al. 2023) on
pairwise data, `kto` (Ethayarajh et al. 2024) on text with a per-sample reward. Both compare
the policy with a reference model: the frozen starting weights, run beside the policy, or
log-probabilities stored in the samples (`precompute_model_name`). `validate_post_training`
refuses what the objective cannot run on, naming the key and what would be valid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from megatron.config.schema import ConfigError


@dataclass(frozen=True)
class PostTrainingConfig:
    train_impl: Literal["normal", "dpo", "kto", "rm"] = "normal"
    """The training objective: `normal` (next-token cross entropy), `dpo` (Direct Preference
    Optimization on `dataset_impl: pairwise` data: each sample a chosen `pos` and a rejected
    `neg` sequence), `kto` (Kahneman-Tversky Optimization on text with a reward dataset:
    positive reward = desirable, negative = undesirable; one document per sample,
    `pack_impl: unpacked`), `rm` (a reward model: a value head trained on `dataset_impl:
    pairwise` pairs with the Bradley-Terry loss, one pair per sample, see
    `megatron/training/objectives/rm.py`)."""

    dpo_beta: float = 0.1
    """DPO's beta: the loss is `-log sigmoid(beta * ((log pi(chosen) - log pi(rejected)) -
    (log ref(chosen) - log ref(rejected))))`, log-probabilities summed over the label tokens of
    each sequence."""

    dpo_fp32: bool = True
    """Compute DPO's per-token log-probabilities and sequence sums in fp32; false keeps them in
    the logits' dtype (bf16/fp16 runs), as GPT-NeoX does."""

    dpo_reference_free: bool = False
    """DPO without a reference model: the reference log-probabilities are taken as 0."""

    kto_beta: float = 0.1
    """KTO's beta, the scale of the log-ratio inside the sigmoid."""

    kto_desirable_weight: float = 1.0
    """KTO's lambda_D, the loss weight of desirable (positive-reward) samples."""

    kto_undesirable_weight: float = 1.0
    """KTO's lambda_U, the loss weight of undesirable (negative-reward) samples."""

    kto_fp32: bool = True
    """Compute KTO's per-token log-probabilities and sequence sums in fp32 (see `dpo_fp32`)."""


def _src(sources: dict[str, str], key: str) -> str:
    return f" (in {sources[key]})" if key in sources else ""


def validate_post_training(cfg, sources: dict[str, str]) -> None:
    """Refuse objectives without the data, batch or model they need."""
    p = cfg.post_training
    impl = f"train_impl: {p.train_impl}{_src(sources, 'train_impl')}"
    if p.train_impl == "normal":
        if p.dpo_reference_free and "dpo_reference_free" in sources:
            raise ConfigError(
                f"dpo_reference_free{_src(sources, 'dpo_reference_free')} applies to "
                "train_impl: dpo only; remove it or set train_impl: dpo"
            )
        return
    if cfg.model.z_loss and p.train_impl != "rm":  # rm: GPT-NeoX's reward penalty (rm.py)
        raise ConfigError(
            f"z_loss{_src(sources, 'z_loss')} adds to the language-model loss only; {impl} "
            "would ignore it: set z_loss: 0"
        )
    dataset_impl = getattr(cfg.data, "dataset_impl", "gpt2")
    pairwise = p.train_impl in ("dpo", "rm")
    if (dataset_impl == "pairwise") != pairwise:
        want = "pairwise (chosen/rejected pairs)" if pairwise else "gpt2 (text with rewards)"
        raise ConfigError(f"{impl} needs dataset_impl: {want}, not {dataset_impl}")
    if p.train_impl == "kto" and not getattr(cfg.data, "train_reward_data_paths", None):
        raise ConfigError(
            f"{impl} weighs every sample by its reward: set train_reward_data_paths (one reward "
            "dataset per train_data_paths entry, positive = desirable, negative = undesirable)"
        )
    if p.train_impl == "rm":
        _require_reward_labels(cfg.data, impl)
    _refuse_packed_rows(p.train_impl, getattr(cfg.data, "pack_impl", "packed"), impl, sources)
    if p.train_impl in ("dpo", "kto") and cfg.moe.moe_expert_parallel_size > 1:
        raise ConfigError(
            f"{impl} with moe_expert_parallel_size > 1 is not built: the reference engine's "
            "expert slices are not verified at expert parallelism; set moe_expert_parallel_size: 1"
        )
    micro = cfg.training.train_micro_batch_size_per_gpu
    if p.train_impl == "kto" and (micro or 0) % 2:
        raise ConfigError(
            f"{impl} compares each half of a micro-batch with the other half's KL estimate: "
            f"train_micro_batch_size_per_gpu must be even (and >= 2), not {micro}"
        )
    for key in ("dpo_beta", "kto_beta"):
        if getattr(p, key) <= 0:
            raise ConfigError(f"{key}{_src(sources, key)} must be > 0, got {getattr(p, key)}")
    for key in ("kto_desirable_weight", "kto_undesirable_weight"):
        if getattr(p, key) < 0:
            raise ConfigError(f"{key}{_src(sources, key)} must be >= 0, got {getattr(p, key)}")


def _refuse_packed_rows(train_impl: str, pack_impl: str, impl: str, sources) -> None:
    """Layouts that put several documents in one row, where the objective reads one value per
    row: KTO's reward (GPT-NeoX reads reward data only unpacked) and a reward model's reward
    token (every pair but a row's last would be dropped)."""
    pack = f"pack_impl: {pack_impl}{_src(sources, 'pack_impl') or ' (the default)'}"
    if train_impl == "kto" and pack_impl != "unpacked":
        raise ConfigError(
            f"{impl} cannot use {pack}: it puts several documents in one row, so desirable "
            "and undesirable ones would share one reward (their +1/-1 rewards averaged) and one "
            "log-ratio; set pack_impl: unpacked (one document per sample, as GPT-NeoX requires "
            "for reward data)"
        )
    if train_impl == "rm" and pack_impl == "pack_until_overflow":
        raise ConfigError(
            f"{impl} cannot use {pack}: a row would hold several pairs but the reward is read "
            "once per row, at its last labelled token, so every earlier pair would be dropped; "
            "set pack_impl: unpacked (one pair per sample)"
        )


def _require_reward_labels(data, impl: str) -> None:
    """A reward model reads each sequence's reward at its last labelled token (rm.py): every
    split it reads needs label datasets, or the reward would land on padding."""
    for split in ("train", "valid", "test"):
        if not getattr(data, f"pos_{split}_data_paths", None):
            continue
        missing = [
            f"{side}_{split}_label_data_paths"
            for side in ("pos", "neg")
            if not getattr(data, f"{side}_{split}_label_data_paths", None)
        ]
        if missing:
            raise ConfigError(
                f"{impl} reads each sequence's reward at its last labelled token, so "
                f"{', '.join(missing)} must be set (tools/preprocess_post_training.py --format "
                "pairs writes them; --label-scope eod labels only the final end-of-text token, "
                "GPT-NeoX's --for-rm)"
            )
