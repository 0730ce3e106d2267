"""The resolved, frozen config: one attribute per concern, flat keys in files.

`cfg.model.hidden_size`, `cfg.parallel.pipe_parallel_size`, ... Every key belongs to exactly
one group (`KEY_TO_GROUP`, guarded by a test). `to_dict`/`from_dict` give the flat mapping
that travels to the workers as the config bundle, derived values included.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from megatron.config.groups.checkpointing import CheckpointingConfig
from megatron.config.groups.data import DataConfig
from megatron.config.groups.deepspeed import DeepSpeedConfig
from megatron.config.groups.generation import GenerationConfig
from megatron.config.groups.launcher import LauncherConfig
from megatron.config.groups.logging import LoggingConfig
from megatron.config.groups.lr import LRConfig
from megatron.config.groups.model import ModelConfig
from megatron.config.groups.moe import MoEConfig
from megatron.config.groups.mup import MuPConfig
from megatron.config.groups.optimizer import OptimizerConfig
from megatron.config.groups.parallel import ParallelConfig
from megatron.config.groups.planning import PlanningConfig
from megatron.config.groups.post_training import PostTrainingConfig
from megatron.config.groups.precision import PrecisionConfig
from megatron.config.groups.tokenizer import TokenizerConfig
from megatron.config.groups.training import TrainingConfig
from megatron.config.neox.keys import RENAMED

GROUPS: dict[str, type] = {
    "model": ModelConfig,
    "moe": MoEConfig,
    "mup": MuPConfig,
    "parallel": ParallelConfig,
    "optimizer": OptimizerConfig,
    "lr": LRConfig,
    "precision": PrecisionConfig,
    "data": DataConfig,
    "tokenizer": TokenizerConfig,
    "training": TrainingConfig,
    "post_training": PostTrainingConfig,
    "checkpointing": CheckpointingConfig,
    "logging": LoggingConfig,
    "launcher": LauncherConfig,
    "generation": GenerationConfig,
    "deepspeed": DeepSpeedConfig,
    "planning": PlanningConfig,
}


def _key_to_group() -> dict[str, str]:
    owners: dict[str, str] = {}
    for group, cls in GROUPS.items():
        for f in dataclasses.fields(cls):
            if f.name in owners:
                raise RuntimeError(
                    f"config key '{f.name}' is declared in both '{owners[f.name]}' and '{group}'"
                )
            owners[f.name] = group
    return owners


KEY_TO_GROUP: dict[str, str] = _key_to_group()


@dataclass(frozen=True)
class Config:
    """The whole resolved configuration of a run. Frozen: run state lives elsewhere."""

    model: ModelConfig = field(default_factory=ModelConfig)
    moe: MoEConfig = field(default_factory=MoEConfig)
    mup: MuPConfig = field(default_factory=MuPConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    lr: LRConfig = field(default_factory=LRConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    post_training: PostTrainingConfig = field(default_factory=PostTrainingConfig)
    checkpointing: CheckpointingConfig = field(default_factory=CheckpointingConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)
    planning: PlanningConfig = field(default_factory=PlanningConfig)
    unimplemented: dict[str, Any] = field(default_factory=dict)
    """GPT-NeoX keys of `neox_keys.NEOX_KEYS` the config set and resolution accepted (at
    GPT-NeoX's default, without effect here, or expressed through our keys): the record."""
    config_files: tuple[str, ...] = ()
    """The files this config was merged from, in order."""

    def get(self, key: str) -> Any:
        """A value by its flat key name, e.g. `cfg.get("hidden_size")`."""
        return getattr(getattr(self, KEY_TO_GROUP[key]), key)

    def to_dict(self) -> dict[str, Any]:
        """Flat `{key: value}` of every field, derived ones included (JSON-serialisable)."""
        flat: dict[str, Any] = {}
        for group in GROUPS:
            flat.update(dataclasses.asdict(getattr(self, group)))
        flat["unimplemented"] = dict(self.unimplemented)
        flat["config_files"] = list(self.config_files)
        return _jsonable(flat)

    @classmethod
    def from_dict(cls, flat: dict[str, Any]) -> Config:
        """Rebuild a resolved config from `to_dict` output (no re-validation). A config saved
        before one of our keys was renamed (`RENAMED`: `expert_interval`, the MoE layer
        interval of checkpoints written until then) is read under the key's current name."""
        flat = {**{RENAMED[k][0]: v for k, v in flat.items() if k in RENAMED}, **flat}
        groups = {}
        for name, group_cls in GROUPS.items():
            names = {f.name for f in dataclasses.fields(group_cls)}
            values = {k: _tuple_if_needed(group_cls, k, v) for k, v in flat.items() if k in names}
            groups[name] = group_cls(**values)
        return cls(
            **groups,
            unimplemented=dict(flat.get("unimplemented", {})),
            config_files=tuple(flat.get("config_files", ())),
        )

    def replace(self, **changes: Any) -> Config:
        """A copy with flat keys changed, e.g. `cfg.replace(train_iters=10)`."""
        by_group: dict[str, dict[str, Any]] = {}
        for key, value in changes.items():
            by_group.setdefault(KEY_TO_GROUP[key], {})[key] = value
        return dataclasses.replace(
            self,
            **{g: dataclasses.replace(getattr(self, g), **kv) for g, kv in by_group.items()},
        )


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def _tuple_if_needed(group_cls: type, key: str, value: Any) -> Any:
    default = {f.name: f.default for f in dataclasses.fields(group_cls)}[key]
    return tuple(value) if isinstance(default, tuple) and isinstance(value, list) else value
