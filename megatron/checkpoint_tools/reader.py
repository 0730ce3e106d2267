"""Read a checkpoint's full (unsharded) weights at any tp/pp layout, without a DeepSpeed engine.

    reader = CheckpointReader("checkpoints")       # a save folder (its `latest`) or global_stepN
    reader.args                                     # the ModelArgs of its saved config
    reader.state_dict()                             # {full name: full tensor}
    reader.state_dict(names)                        # only those (only their layers' files read)

Tensor-parallel shards are merged along the dim the model's layers split (`ModelSchema`), so
the result loads into a model of any layout with `megatron.model.load_full_state_dict`. The
config is the `config.json` saved beside the weights unless one is given. Experts saved with
`moe_expert_parallel_size > 1` are completed from their `expert_states_pp*_ep*.pt` files
(`megatron/checkpoint/experts.py`), so the full `(E, ...)` tensors come back.
"""

from __future__ import annotations

import functools
import json
import pickle
from collections.abc import Iterable
from pathlib import Path

import torch

from megatron.checkpoint.deepspeed_files import layer_file, mp_rank_file, zero_model_file
from megatron.checkpoint.experts import (
    expert_slices,
    merge_expert_slices,
    saved_expert_parallel_size,
)
from megatron.checkpoint.model_files import has_old_numbering, old_layer_files, old_to_current
from megatron.checkpoint.neox_layout import from_sequential, is_sequential, our_param_name
from megatron.checkpoint.neox_resume import (
    is_neox_checkpoint,
    neox_trainer_state,
    saved_batch_size,
)
from megatron.checkpoint.safe_load import load_file, refusal, weights_only_loading
from megatron.checkpoint_tools.layout import (
    CheckpointError,
    CheckpointLayout,
    read_layout,
)
from megatron.checkpoint_tools.schema import ModelSchema
from megatron.model import ModelArgs
from megatron.model.neox_names import from_neox


def load_saved_config(layout: CheckpointLayout):
    """The resolved `Config` saved in the checkpoint folder."""
    from megatron.config import Config
    from megatron.config.groups.model import recorded_intermediate_size

    path = layout.config_file
    if not path.is_file():
        raise CheckpointError(
            f"checkpoint '{layout.folder}' has no {path.name}; give the run's config files "
            "(--config) so the model can be described"
        )
    try:
        saved = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(
            f"'{path}' is not valid JSON ({err}); give the run's config files (--config) so "
            "the model can be described"
        ) from None
    return Config.from_dict({**saved, "intermediate_size": recorded_intermediate_size(saved)})


def config_from_files(files, overrides=()) -> object:
    """Resolve config files for a tool: world size = their own tp x pp, vocabulary from the
    tokenizer they name (whose files must be readable here)."""
    from types import SimpleNamespace

    from megatron.config.resolve import load_settings, resolve_settings, settings_group
    from megatron.data.tokenizers import build_tokenizer

    settings = load_settings(list(files), list(overrides))
    par = settings_group(settings, "parallel")
    world = par.model_parallel_size * max(1, par.pipe_parallel_size)
    tokenizer = build_tokenizer(SimpleNamespace(tokenizer=settings_group(settings, "tokenizer")))
    return resolve_settings(settings, world_size=world, vocab_size=tokenizer.vocab_size)


def _load(path: Path) -> dict:
    if not path.is_file():
        raise CheckpointError(f"checkpoint file '{path}' is missing; the folder is incomplete")
    return load_file(path)  # weights-only: a downloaded checkpoint cannot run code


class CheckpointReader:
    """Full weights and saved state of one checkpoint folder (see the module docstring)."""

    def __init__(self, path: str | Path, cfg=None):
        self.layout = read_layout(path)
        self.cfg = cfg if cfg is not None else load_saved_config(self.layout)
        self.args = ModelArgs.from_config(self.cfg)
        self.schema = ModelSchema(self.args)
        self._plain_modules: list[dict] | None = None
        self._experts: list[dict] | None = None

    @property
    def folder(self) -> Path:
        return self.layout.folder

    def mp_rank_state(self, mp_rank: int) -> dict:
        """DeepSpeed's engine-state file of model-parallel rank `mp_rank` (stage * tp + t)."""
        return _load(self.folder / mp_rank_file(mp_rank))

    def engine_state(self) -> dict:
        """DeepSpeed's bookkeeping of rank 0 (scheduler, sample counts, its config), without
        the module and optimizer tensors."""
        if self.layout.zero3:
            state = _load(self.folder / zero_model_file(0))
        else:
            state = self.mp_rank_state(0)
        state.pop("module", None)
        state.pop("optimizer", None)
        return state

    def trainer_state(self) -> dict | None:
        """Our `trainer_state.pt`; from a folder GPT-NeoX saved, what it would hold (iteration,
        LR schedule, and the samples consumed at the saved global batch: `neox_resume.py`);
        None when the folder holds neither."""
        path = self.layout.trainer_state_file
        if path.is_file():
            return load_file(path)
        if is_neox_checkpoint(self.folder):
            return neox_trainer_state(self.folder, saved_batch_size(self.folder))
        return None

    def _plain_shards(self) -> list[dict]:
        if self._plain_modules is None:
            if self.layout.zero3 and self.layout.tp > 1:  # DeepSpeed's reader: one mp rank
                from megatron.checkpoint_tools.master_weights import read_zero3_shards

                modules = read_zero3_shards(self)
            elif self.layout.zero3:
                modules = [self._zero3_module()]
            else:
                modules = [self.mp_rank_state(t).get("module") for t in range(self.layout.tp)]
                if any(m is None for m in modules):
                    raise CheckpointError(
                        f"checkpoint '{self.folder}': mp_rank files hold no module weights"
                    )
            self._plain_modules = [self._current_names(m) for m in modules]
        return self._plain_modules

    def _current_names(self, module: dict) -> dict:
        """A plain engine's weights under the model's own names, from GPT-NeoX's sequential
        names or, from a folder of `OLD_NUMBERING`, its names."""
        if is_sequential(module):
            return from_neox(from_sequential(module, self.args.tied_embeddings), self.args)
        return {self.current_name(name): value for name, value in module.items()}

    @functools.cached_property
    def old_numbering(self) -> bool:
        """Whether the folder was saved in `OLD_NUMBERING` (`model_files.py`)."""
        if self.layout.pipeline:
            return has_old_numbering(self.folder)
        if self.layout.zero3:
            shapes = _load(self.folder / zero_model_file(0)).get("param_shapes") or []
            names = [n for group in shapes for n in group]
        else:
            names = list(load_file(self.folder / mp_rank_file(0), mmap=True).get("module") or {})
        return not is_sequential(names) and any(n not in self.schema.params for n in names)

    def current_name(self, name: str) -> str:
        """A parameter name as saved in this folder (DeepSpeed's `param_shapes`, which name the
        ZeRO partitions) as the model names it: from `OLD_NUMBERING`, else from GPT-NeoX's
        names (`neox_layout.our_param_name`; ours are kept)."""
        if self.old_numbering:
            return old_to_current(name, self.args)
        return our_param_name(name, self.args.tied_embeddings)

    def _zero3_module(self) -> dict:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        try:
            with weights_only_loading():  # DeepSpeed's own torch.load calls, made weights-only
                state = get_fp32_state_dict_from_zero_checkpoint(
                    str(self.folder.parent), tag=self.folder.name
                )
        except pickle.UnpicklingError as err:
            raise refusal(self.folder, err) from err
        return {name: tensor.detach() for name, tensor in state.items()}

    def _layer_shards(self, layer: int) -> list[dict]:
        """The per-tp-rank state dicts of one layer, keyed by our full names."""
        prefix = self.schema.prefix(layer)
        if self.layout.pipeline:
            indices = old_layer_files(self.args, layer) if self.old_numbering else [layer]
            shards = []
            for t in range(self.layout.tp):
                files = [self.folder / layer_file(i, t) for i in indices]
                if not files or not files[0].is_file():
                    return []
                saved = {k: v for f in files for k, v in _load(f).items()}
                shards.append({prefix + k: v for k, v in from_neox(saved, self.args).items()})
            return shards
        return [
            {k: v for k, v in module.items() if k.startswith(prefix)}
            for module in self._plain_shards()
        ]

    def _expert_slices(self) -> list[dict]:
        """Experts of expert-parallel ranks > 0, which DeepSpeed's files lack (ep > 1)."""
        if self._experts is None:
            ep = saved_expert_parallel_size(self.folder) if self.args.moe_num_experts > 1 else 1
            self._experts = expert_slices(self.folder, ep)
        return self._experts

    def layer_state(self, layer: int) -> dict[str, torch.Tensor]:
        """`{full name: full tensor}` of one layer of the spec list."""
        shards = self._layer_shards(layer)
        expected = self.schema.layer_params(layer)
        if expected and not shards:
            raise CheckpointError(
                f"checkpoint '{self.folder}' has no files for layer {layer} "
                f"({expected[0].name}, ...); it does not match the config's model"
            )
        out = {}
        for name in shards[0] if shards else ():
            parts = [shard[name] for shard in shards]
            out[name] = self.schema.merge(name, parts)
        out = merge_expert_slices(out, self._expert_slices())
        for spec in expected:
            if spec.name not in out:
                raise CheckpointError(
                    f"checkpoint '{self.folder}' lacks parameter '{spec.name}'; the config "
                    "describes a different model (check the architecture keys)"
                )
            if tuple(out[spec.name].shape) != spec.shape:
                raise CheckpointError(
                    f"parameter '{spec.name}' is {tuple(out[spec.name].shape)} in checkpoint "
                    f"'{self.folder}' but the config gives {spec.shape}; the config does not "
                    "describe this checkpoint"
                )
        return out

    def state_dict(self, names: Iterable[str] | None = None) -> dict[str, torch.Tensor]:
        """Full tensors of every parameter (or of `names`, reading only their layers)."""
        if names is None:
            layers = range(self.schema.num_spec_layers)
        else:
            layers = sorted({self.schema.spec(n).layer for n in names})
        out: dict[str, torch.Tensor] = {}
        for layer in layers:
            out.update(self.layer_state(layer))
        if names is not None:
            wanted = set(names)
            out = {k: v for k, v in out.items() if k in wanted}
        return out
