"""The reference model of DPO and KTO: the frozen starting weights, run beside the policy.

Why run it rather than precompute: the reference log-probabilities then always belong to the
very weights the policy started from, at any layout and for any data order, with no extra
pass over the data before training and no files to keep in step with the datasets; the cost
is one forward pass per micro-batch. Reference log-probabilities stored in the samples
(`precompute_model_name`) are used instead when configured, and `dpo_reference_free` needs
none (`Objective.needs_reference`).

The reference is a second DeepSpeed engine of the policy's topology without optimizer:

- pipeline: its `eval_batch` runs over the same micro-batches the policy's train (or eval)
  pass will read; its `loss_fn` stashes each micro-batch's per-sequence log-probabilities on
  the last stage, where they are put into the loss inputs the policy's loss reads;
- plain engine (ZeRO 0-3; ZeRO-3 keeps it partitioned like the policy): a no-grad forward
  per micro-batch.

Its weights: those the run starts from. With no checkpoint, the reference is built from the
same seed as the policy, so it IS the policy's initial model. With a checkpoint to start from
(`load`, fine-tuning), the reference loads that checkpoint's weights. The checkpoints of the
run record where the reference came from (`reference` in the trainer state), so a resumed
run loads the same reference, not the policy's newer weights.
"""

from __future__ import annotations

import copy

import torch

from megatron.checkpoint.folders import resume_tag
from megatron.config.verbosity import quiet_deepspeed, verbose_logging
from megatron.training.checkpoint.checkpoint_io import CheckpointIO
from megatron.training.step.fp32_params import uncast_fp32_params


def reference_ds_config(ds_config: dict, zero_stage: int) -> dict:
    """The policy's DeepSpeed config for an engine that only runs forward: no optimizer
    state to partition, so ZeRO is off except stage 3 (which partitions the weights)."""
    out = copy.deepcopy(ds_config)
    out.pop("optimizer", None)
    out.pop("scheduler", None)
    out["zero_optimization"] = {
        **out.get("zero_optimization", {}),
        "stage": 3 if zero_stage == 3 else 0,
    }
    out.pop("zero_allow_untested_optimizer", None)
    return out


def build_reference(cfg, topology, objective):
    """The reference engine for `objective` (None when the objective needs none). Build it
    BEFORE the policy's engine: building an engine resets DeepSpeed's group registry, which the
    policy's expert groups (mixture of experts) must survive."""
    if not objective.needs_reference:
        return None
    import deepspeed

    from megatron.config import deepspeed_config
    from megatron.training.setup.model import build_model_for_engine

    ds = deepspeed_config(cfg, verbose=verbose_logging())
    ds_config = reference_ds_config(ds, cfg.parallel.zero_stage)
    model = build_model_for_engine(cfg, topology, ds_config)
    for param in model.parameters():
        param.requires_grad_(False)
    pipeline = cfg.parallel.pipe_parallel_size >= 1
    # as the policy's engine (setup/engine.py): quiet, and Mamba's fp32 A_log and D kept fp32,
    # so that the reference computes what the policy computes at step 0
    with quiet_deepspeed(), uncast_fp32_params(model):
        engine, _, _, _ = deepspeed.initialize(
            model=model, config=ds_config, mpu=None if pipeline else topology
        )
    engine.eval()
    return ReferenceModel(engine, objective, pipeline)


class ReferenceModel:
    """Fills the reference slot of each micro-batch's loss inputs (see the module docstring)."""

    def __init__(self, engine, objective, pipeline: bool):
        self.engine = engine
        self.objective = objective
        self.pipeline = pipeline
        self._stash: list[torch.Tensor] = []
        if pipeline:
            engine.module.loss_fn = self._stash_logps

    def _stash_logps(self, logits, loss_inputs):
        self._stash.append(self.objective.reference_logps(logits, loss_inputs))
        device = (logits[0] if isinstance(logits, tuple) else logits).device  # (head inputs)
        return torch.zeros((), device=device)  # eval_batch averages a loss

    def fill(self, micro_batches: list) -> list:
        """The same micro-batches with their reference log-probabilities (on every rank that
        computes the loss; elsewhere the slot is never read)."""
        if self.pipeline:
            self._stash.clear()
            self.engine.eval_batch(iter(micro_batches))
            refs = list(self._stash)
            if not refs:  # not the last stage
                return micro_batches
        else:
            refs = [self._forward(inputs, loss_inputs) for inputs, loss_inputs in micro_batches]
        return [
            (inputs, (*loss_inputs[:2], ref.to(loss_inputs[2].device), *loss_inputs[3:]))
            for (inputs, loss_inputs), ref in zip(micro_batches, refs)
        ]

    @torch.no_grad()
    def _forward(self, inputs, loss_inputs) -> torch.Tensor:
        tokens, positions = inputs
        return self.objective.reference_logps(self.engine(tokens, positions), loss_inputs)

    def load(self, cfg, loaded: dict | None) -> dict:
        """Load the reference's weights (see the module docstring); returns the record the
        run's checkpoints keep: `{"load": folder or None, "tag": tag or None}`."""
        if loaded and "reference" in loaded:  # resuming a run of this objective
            record = dict(loaded["reference"])
        else:
            load = cfg.checkpointing.load
            tag = resume_tag(load) if load else None
            record = {"load": load if tag else None, "tag": tag}
        if record["tag"] is not None:
            io = CheckpointIO(self.engine, None)
            if io._engine_load(record["load"], record["tag"], False, True) is None:
                raise FileNotFoundError(
                    f"the reference model's checkpoint {record['load']}/{record['tag']} (where "
                    "this run started) could not be loaded; it must stay while the run resumes"
                )
        return record
