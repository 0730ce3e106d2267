"""Config system: config files in, one validated, derived, frozen `Config` out.

The files at this level are the pipeline, in the order a config goes through it: `loader`
(merge files, `--set`), `resolve` (renames, GPT-NeoX keys, unknown keys, types, groups,
derivation, checks), `schema` (type checks, field docstrings), `derive` (computed values),
`config` (the frozen `Config`), `bundle` (to the workers and back), `ds_export` (DeepSpeed's
config), `describe` (`--describe`, configs/README.md), `verbosity` (the workers' log level).
The groups are in `groups/`, GPT-NeoX's other keys in `neox/`, cross-group checks in
`checks/`.
"""

from megatron.config.bundle import config_from_argv, decode_bundle, encode_bundle
from megatron.config.config import GROUPS, KEY_TO_GROUP, Config
from megatron.config.derive import kept_padded_vocab, pad_vocab_size, resumed_padded_vocab
from megatron.config.ds_export import deepspeed_config
from megatron.config.resolve import config_from_dict, load_config, resolve_settings
from megatron.config.schema import ConfigError

__all__ = [
    "GROUPS",
    "KEY_TO_GROUP",
    "Config",
    "ConfigError",
    "config_from_argv",
    "config_from_dict",
    "decode_bundle",
    "deepspeed_config",
    "encode_bundle",
    "kept_padded_vocab",
    "load_config",
    "pad_vocab_size",
    "resolve_settings",
    "resumed_padded_vocab",
]
