"""A reward model's starting checkpoint from a language model's (`tools/init_reward_model.py`).

A reward model (`train_impl: rm`) is the language model with its vocabulary head replaced by a
value head (`megatron/model/head.py::ValueHeadPipe`), and checkpoints load strictly (as in
GPT-NeoX), so a run cannot start from a language model's checkpoint directly: that checkpoint
has a head the reward model lacks and no value head. This writes one that it can start from:

- every body tensor (embedding, layers, final norm) copied from the language model, which
  must have the same shapes (the reward model's config names the architecture);
- the language model's own head, if untied, left out;
- the value head drawn exactly as a fresh run of the reward model's config draws it (its
  layer's seed), so starting here equals training from the language model's weights;

at the reward model's tensor/pipeline layout, as `global_step0` with no optimizer state:
start the run with `load: {output}` and `finetune: true`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from megatron.checkpoint_tools.reader import CheckpointReader
from megatron.checkpoint_tools.schema import ModelSchema
from megatron.checkpoint_tools.writer import write_checkpoint
from megatron.model import ModelArgs, gpt_layer_specs, layer_index, layer_prefix


@dataclass
class RewardInitResult:
    folder: Path
    copied: int
    dropped: list[str]
    head: str

    def report(self) -> str:
        dropped = ", ".join(self.dropped) or "nothing"
        return (
            f"wrote {self.folder}: {self.copied} tensors from the language model, value head "
            f"{self.head} initialised from the config's seed; left out: {dropped}"
        )


def fresh_value_head(args: ModelArgs) -> dict[str, torch.Tensor]:
    """The value head's tensors as a fresh run of `args` builds them (same seed)."""
    spec = gpt_layer_specs(args)[layer_index(args, "head")]
    prefix = layer_prefix(args, "head")
    return {prefix + name: t.detach().clone() for name, t in spec.build().state_dict().items()}


def reward_model_state(lm_state: dict, rm_args: ModelArgs) -> tuple[dict, list[str]]:
    """The reward model's full state from the language model's; and the names left out."""
    if not rm_args.value_head:
        raise ValueError(
            "the target config does not build a reward model: set train_impl: rm in it"
        )
    head = fresh_value_head(rm_args)
    state = {}
    for name, spec in ModelSchema(rm_args).params.items():
        if name in head:
            state[name] = head[name]
            continue
        if name not in lm_state:
            raise ValueError(
                f"the language model has no '{name}', which the reward model's config needs: "
                "give the config of the language model's architecture (with train_impl: rm)"
            )
        if tuple(lm_state[name].shape) != spec.shape:
            raise ValueError(
                f"'{name}' is {tuple(lm_state[name].shape)} in the language model but "
                f"{spec.shape} in the reward model's config: the architectures differ"
            )
        state[name] = lm_state[name]
    return state, sorted(set(lm_state) - set(state))


def init_reward_model(checkpoint, rm_cfg, output, *, overwrite: bool = False) -> RewardInitResult:
    """Read the language model at `checkpoint`, write the reward model of `rm_cfg` (a resolved
    config with `train_impl: rm`) under `output` at `rm_cfg`'s layout."""
    reader = CheckpointReader(checkpoint)
    rm_args = ModelArgs.from_config(rm_cfg)
    state, dropped = reward_model_state(reader.state_dict(), rm_args)
    par = rm_cfg.parallel
    folder = write_checkpoint(
        output,
        schema=ModelSchema(rm_args),
        state=state,
        tp=par.model_parallel_size,
        pp=par.pipe_parallel_size,
        iteration=0,
        config_dict=rm_cfg.to_dict(),
        overwrite=overwrite,
        ep=rm_cfg.moe.moe_expert_parallel_size,  # experts sliced as the run will load them
    )
    head = next(iter(fresh_value_head(rm_args)))
    return RewardInitResult(folder, len(state) - 1, dropped, head)
