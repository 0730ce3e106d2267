"""The RoPE scaling rules the config accepts (`megatron/config/groups/rope_scaling.py::RULES`, no
torch) are the ones the model implements (`megatron/model/rope_scaling.py::ROPE_RULES`), and
each model rule reads exactly the fields the config lets through for it: a field the config
accepts but the model ignores, or one the model needs but the config refuses, fails here."""

from __future__ import annotations

import torch

from megatron.config.groups.rope_scaling import RULES
from megatron.model.rope_scaling import ROPE_RULES

# A valid value for every field any rule takes (a field added to RULES needs one here).
VALUES = {
    "factor": 4.0,
    "original_max_position_embeddings": 64,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "attention_factor": 1.2,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 0.5,
    "truncate": False,
}


class ReadFields(dict):
    """A rule's fields that note every key the rule looks up, present or not."""

    def __init__(self, fields: dict, read: set[str]):
        super().__init__(fields)
        self.read = read

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)


def fields_read(kind: str, fields: dict) -> set[str]:
    read: set[str] = set()
    rule = ROPE_RULES[kind]({"rope_type": kind, **fields}, 128)
    rule.fields = ReadFields(rule.fields, read)
    rule.attention_factor()
    rule.inv_freq(10000.0, 16, torch.arange(200))  # beyond max positions: dynamic grows
    rule.longest()
    return read - {"rope_type"}


def test_the_model_implements_every_rule_the_config_accepts():
    assert set(ROPE_RULES) == set(RULES)


def test_each_rule_reads_the_fields_the_config_lets_through():
    for kind, rule in RULES.items():
        required = {name: VALUES[name] for name in rule.required}
        read = fields_read(kind, required)
        for name in rule.optional:  # one at a time: one optional field can gate another
            read |= fields_read(kind, {**required, name: VALUES[name]})
        assert read == {*rule.required, *rule.optional}, kind
        assert set(rule.required) <= fields_read(kind, required), kind
