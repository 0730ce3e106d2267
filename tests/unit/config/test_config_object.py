"""The resolved config: one owner per key, frozen, bundle round trip, describe/README."""

import dataclasses
from pathlib import Path

import pytest

from megatron.config import GROUPS, KEY_TO_GROUP, decode_bundle, encode_bundle, load_config
from megatron.config.bundle import config_from_argv
from megatron.config.describe import describe_key, render_markdown
from megatron.config.schema import field_docs

from .conftest import MINIMAL

ROOT = Path(__file__).resolve().parents[3]


def test_every_key_is_declared_in_exactly_one_group():
    declared = [f.name for cls in GROUPS.values() for f in dataclasses.fields(cls)]
    assert len(declared) == len(set(declared)) == len(KEY_TO_GROUP)


def test_every_field_has_a_docstring():
    missing = [
        f"{group}.{f.name}"
        for group, cls in GROUPS.items()
        for f in dataclasses.fields(cls)
        if not field_docs(cls).get(f.name)
    ]
    assert missing == []


def test_resolved_config_is_frozen(write):
    cfg = load_config([write("a.yml", MINIMAL)], warn=[])
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.model.hidden_size = 3  # type: ignore[misc]


def test_bundle_round_trip_is_exact(write):
    cfg = load_config(
        [write("a.yml", MINIMAL + 'attention_config: [[["flash"], 2]]\n')],
        world_size=2,
        vocab_size=1000,
        warn=[],
    )
    text = encode_bundle(cfg)
    assert set(text) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_=")
    again = decode_bundle(text)
    assert again == cfg
    assert config_from_argv(["--megatron_config", text, "--local_rank=0"]) == cfg


def test_a_config_saved_before_the_interval_key_was_renamed_keeps_its_interval(write):
    """Checkpoints written until `expert_interval` became `moe_expert_interval` store the old
    key (its default was 2): their model is read back with the interval it was built with."""
    from megatron.config import Config

    saved = load_config([write("a.yml", MINIMAL + "moe_num_experts: 4\n")], warn=[]).to_dict()
    saved["expert_interval"] = 2
    del saved["moe_expert_interval"]
    assert Config.from_dict(saved).moe.moe_expert_interval == 2
    current = {**saved, "moe_expert_interval": 3}
    assert Config.from_dict(current).moe.moe_expert_interval == 3


def test_replace_changes_flat_keys(write):
    cfg = load_config([write("a.yml", MINIMAL)], warn=[])
    new = cfg.replace(train_iters=99, hidden_dropout=0.5)
    assert new.training.train_iters == 99 and new.model.hidden_dropout == 0.5
    assert cfg.training.train_iters == 10


def test_describe_a_key():
    text = describe_key("rotary-pct")
    assert "rotary_pct" in text and "[model]" in text and "float" in text and "rotat" in text


def test_configs_readme_is_current():
    expected = render_markdown()
    actual = (ROOT / "configs" / "README.md").read_text()
    assert actual == expected, (
        "regenerate: python deepy.py --describe --markdown > configs/README.md"
    )


def test_each_group_heading_names_the_group_and_says_what_it_holds():
    # A config dataclass has no docstring of its own: its __doc__ is the generated signature,
    # which once made each heading a line of several thousand characters.
    lines = render_markdown().splitlines()
    for group, cls in GROUPS.items():
        at = lines.index(f"## `{group}`: `{cls.__name__}`")
        assert f"`cfg.{group}`" in lines[at + 2], (group, lines[at + 2])
