"""Every config GPT-NeoX ships, unchanged (`tests/data/configs/neox/`, see its README.md),
resolves here as a user would load it, or is refused with the reason, and the DeepSpeed config
exported from it passes DeepSpeed 0.19.8's own validation.

A model file is loaded as `deepy.py train.py FILE local.yml` would: `local.yml` adds only the
data and tokenizer keys the file leaves out (GPT-NeoX's `configs/local_setup.yml` does that
there). GPT-NeoX's Llama-family files describe only the architecture: they are loaded with its
`llama/train_config.yml`, as its Llama README says. The snippet `sparse.yml` and the set-up
files are loaded after `125M.yml`. Each run gets the world size of one data-parallel rank, the
size DeepSpeed's config check assumes outside a launched job (its batch sizes must agree).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from megatron.config import ConfigError, deepspeed_config, load_config

NEOX = Path(__file__).resolve().parents[2] / "data" / "configs" / "neox"
TRAIN_CONFIG = "llama/train_config.yml"  # GPT-NeoX's training keys for its Llama files
ARCH_ONLY = ("llama/", "llama2/", "mistral/")
AFTER_125M = (
    "sparse.yml",
    "local_setup.yml",
    "local_setup_comet.yml",
    "local_setup_wandb.yml",
    "eleutherai_cluster.yml",
    "slurm_local.yml",
    "docker/pythia-paths.yml",
    "text_generation.yml",
)
LOCAL = {
    "data_path": "data/enwik8/enwik8_text_document",
    "vocab_file": "data/gpt2-vocab.json",
    "merge_file": "data/gpt2-merges.txt",
}
# File -> the refusal it gets, by design (a feature not built here, with the reason).
REFUSED = {
    "1-3B-transformer-engine.yml": "'te_mha' .*TransformerEngine layers are not built",
    "bnb_125M.yml": "'use_bnb_optimizer' .*bitsandbytes 8-bit optimizers are not implemented",
    "sparse.yml": "'sparsity_config' .*DeepSpeed sparse attention .*is not built",
    # Keys of the fork Llemma was trained with; GPT-NeoX's own NeoXArgs rejects them too.
    "llemma/7B.yml": "unknown config key 'decay_lr_to'",
    "llemma/34B.yml": "unknown config key 'attention_type'",
}


def _files() -> list[str]:
    found = sorted(p.relative_to(NEOX).as_posix() for p in NEOX.rglob("*.yml"))
    return [f for f in found if f != TRAIN_CONFIG]


def _chain(name: str) -> list[Path]:
    """The GPT-NeoX files a user passes for `name`, in order."""
    if name in AFTER_125M:
        return [NEOX / "125M.yml", NEOX / name]
    if name.startswith(ARCH_ONLY):
        return [NEOX / name, NEOX / TRAIN_CONFIG]
    return [NEOX / name]


def _keys(paths: list[Path]) -> dict:
    merged: dict = {}
    for path in paths:
        merged.update({k.replace("-", "_"): v for k, v in yaml.safe_load(path.read_text()).items()})
    return merged


def _resolve(name: str, folder: Path):
    chain = _chain(name)
    keys = _keys(chain)
    local = {k: v for k, v in LOCAL.items() if k not in keys}
    if "vocab_file" in keys:  # the file's own tokenizer: no GPT-2 merges beside it
        local.pop("merge_file", None)
    local_file = folder / "local.yml"
    local_file.write_text(yaml.safe_dump(local))
    world = max(keys.get("pipe_parallel_size", 1), 1) * keys.get("model_parallel_size", 1)
    return load_config([*chain, local_file], world_size=world, vocab_size=50277, warn=[])


@pytest.mark.parametrize("name", _files())
def test_gpt_neox_config_resolves_or_is_refused_by_design(name, tmp_path):
    from deepspeed.runtime.config import DeepSpeedConfig

    if name in REFUSED:
        with pytest.raises(ConfigError, match=REFUSED[name]):
            _resolve(name, tmp_path)
        return
    cfg = _resolve(name, tmp_path)
    assert cfg.parallel.data_parallel_size == 1
    ds = DeepSpeedConfig(deepspeed_config(cfg))  # DeepSpeed's pydantic sections and checks
    assert ds.train_batch_size == cfg.training.train_batch_size
    assert (ds.float16_config.enabled, ds.bfloat16_config.enabled) == (
        cfg.precision.dtype == "fp16",
        cfg.precision.dtype == "bf16",
    )
    assert ds.zero_optimization_stage == cfg.parallel.zero_stage


def test_every_expected_refusal_names_a_shipped_file():
    assert set(REFUSED) <= set(_files())
