"""Cross-field validation of the data keys: splits, weights, label and reward datasets, the
synthetic `data_impl: dummy`, and GPT-NeoX's post-training data (`dataset_impl: pairwise`,
`pack_impl`, `precompute_model_name`): every path given is read, every pair is whole."""

from __future__ import annotations

from megatron.config.config import Config
from megatron.config.schema import ConfigError
from megatron.config.schema import set_in as _src

_SPLITS = ("train", "valid", "test")
_SPLIT_PATH_KEYS = tuple(f"{s}_{k}data_paths" for s in _SPLITS for k in ("", "label_", "reward_"))
_PAIR_PATH_KEYS = tuple(
    f"{side}_{s}_{k}data_paths" for s in _SPLITS for side in ("pos", "neg") for k in ("", "label_")
)


def validate_dummy_data(cfg: Config, sources: dict[str, str]) -> None:
    """`data_impl: dummy` reads no files: a data path or an epoch count would be ignored."""
    d = cfg.data
    paths = ("data_path", "precompute_model_name") + _SPLIT_PATH_KEYS + _PAIR_PATH_KEYS
    given = [key for key in paths if getattr(d, key)]
    if given:
        raise ConfigError(
            f"data_impl: dummy{_src(sources, 'data_impl')} uses synthetic tokens and reads no "
            f"files, but {', '.join(given)}{_src(sources, *given)} is set; remove it, or set "
            "data_impl: mmap to train on it"
        )
    if cfg.training.train_epochs:
        raise ConfigError(
            f"train_epochs{_src(sources, 'train_epochs')} with data_impl: dummy: synthetic data "
            "has no epochs; set train_iters instead"
        )


def validate_data(cfg: Config, sources: dict[str, str]) -> None:
    d = cfg.data
    if d.data_impl == "dummy":
        validate_dummy_data(cfg, sources)
    parts = d.split.replace("/", ",").split(",")
    try:
        numbers = [float(x) for x in parts]
    except ValueError:
        numbers = []
    if not numbers or len(numbers) > 3 or any(x < 0 for x in numbers) or sum(numbers) <= 0:
        raise ConfigError(
            f"split '{d.split}'{_src(sources, 'split')} is not valid; expected up to three "
            "non-negative numbers such as '949,50,1' (train, valid, test)"
        )
    pairwise = d.dataset_impl == "pairwise"
    for kind in _SPLITS:
        paths_key = f"pos_{kind}_data_paths" if pairwise else f"{kind}_data_paths"
        paths = getattr(d, paths_key)
        weights = getattr(d, f"{kind}_data_weights")
        if weights is not None and (paths is None or len(weights) != len(paths)):
            key = f"{kind}_data_weights"
            raise ConfigError(
                f"{key}{_src(sources, key)} has {len(weights)} weights but "
                f"{paths_key} has {len(paths or [])} paths; give one weight per path"
            )
        for extra in ("label", "reward"):
            key = f"{kind}_{extra}_data_paths"
            values = getattr(d, key)
            if not pairwise and values is not None and (paths is None or len(values) != len(paths)):
                raise ConfigError(
                    f"{key}{_src(sources, key)} needs one {extra} dataset per data path "
                    f"({paths_key} has {len(paths or [])})"
                )
    validate_post_training_data(cfg, sources)


def validate_post_training_data(cfg: Config, sources: dict[str, str]) -> None:
    """`dataset_impl`, `pack_impl` and the pos/neg/reward paths (GPT-NeoX's post-training
    data): every path given is read, every pair is whole."""
    d = cfg.data
    if cfg.generation.text_gen_type == "precompute" and not d.precompute_model_name:
        raise ConfigError(
            f"text_gen_type: precompute{_src(sources, 'text_gen_type')} writes the reference "
            "log-probs as {prefix}_{precompute_model_name}: set precompute_model_name"
        )
    if cfg.training.train_epochs and (d.pack_impl != "packed" or d.dataset_impl == "pairwise"):
        raise ConfigError(
            f"train_epochs{_src(sources, 'train_epochs')} needs pack_impl: packed and dataset_impl:"
            f" gpt2 (as in GPT-NeoX), not {d.pack_impl} / {d.dataset_impl}; set train_iters"
        )
    if d.dataset_impl != "pairwise":
        given = [k for k in _PAIR_PATH_KEYS if getattr(d, k) is not None]
        if given:
            raise ConfigError(
                f"{', '.join(given)}{_src(sources, *given)} are read only with dataset_impl: "
                f"pairwise (it is {d.dataset_impl}); set dataset_impl: pairwise, or remove them"
            )
        rewarded = [s for s in _SPLITS if getattr(d, f"{s}_reward_data_paths")]
        lacking = [s for s in _SPLITS if getattr(d, f"{s}_data_paths") and s not in rewarded]
        if rewarded and lacking:
            keys = [f"{s}_reward_data_paths" for s in lacking]
            raise ConfigError(
                f"{', '.join(keys)} missing: {rewarded[0]}_reward_data_paths is set, so every "
                "split read needs its rewards (KTO weighs each sample by them)"
            )
        return
    if d.pack_impl == "packed":
        raise ConfigError(
            f"dataset_impl: pairwise{_src(sources, 'dataset_impl', 'pack_impl')} cannot use "
            "pack_impl: packed (it would cut chosen and rejected at different places); set "
            "pack_impl: unpacked or pack_until_overflow"
        )
    ignored = [k for k in ("data_path",) + _SPLIT_PATH_KEYS if getattr(d, k)]
    if ignored:
        raise ConfigError(
            f"{', '.join(ignored)}{_src(sources, *ignored)} not read with dataset_impl: pairwise"
            " (it reads pos_*/neg_*_data_paths); remove them"
        )
    if not d.pos_train_data_paths:
        raise ConfigError(
            "dataset_impl: pairwise needs pos_train_data_paths and neg_train_data_paths (the "
            "chosen and rejected sides of the training pairs)"
        )
    for split in _SPLITS:
        _validate_pairs(d, split, sources)


def _validate_pairs(d, split: str, sources: dict[str, str]) -> None:
    pos, neg = getattr(d, f"pos_{split}_data_paths"), getattr(d, f"neg_{split}_data_paths")
    n = len(pos or [])
    for kind in ("data", "label_data"):
        keys = [f"{side}_{split}_{kind}_paths" for side in ("pos", "neg")]
        a, b = (getattr(d, k) for k in keys)
        if (a is None) != (b is None):
            have, lack = keys if a is not None else keys[::-1]
            raise ConfigError(
                f"{have}{_src(sources, have)} is set but {lack} is not: give both sides of the "
                "pairs, or neither"
            )
        if a is not None and (len(a) != n or len(b) != n):
            raise ConfigError(
                f"{keys[0]} and {keys[1]}{_src(sources, *keys)} have {len(a)} and {len(b)} "
                f"entries; give one per pos_{split}_data_paths entry ({n})"
            )
    if neg is None and pos is None and getattr(d, f"pos_{split}_label_data_paths"):
        raise ConfigError(f"pos_{split}_label_data_paths needs pos_{split}_data_paths")
