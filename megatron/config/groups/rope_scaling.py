"""The `rope_scaling` key: which RoPE scaling rules exist and which fields each one takes.

The rules and their field names are those of Hugging Face transformers' `rope_parameters`
(`rope_type` plus the rule's own fields), so a Hugging Face config maps onto the key field by
field; the rotary base and fraction stay in `rotary_emb_base` and `rotary_pct`. The arithmetic
lives in `megatron/model/rope_scaling.py`; this file (no torch) says what a valid value is, so a
config is refused before launch and a `ModelArgs` built by hand is refused the same way.

    rope_scaling: {rope_type: yarn, factor: 4.0, original_max_position_embeddings: 4096}
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron.config.schema import ConfigError


@dataclass(frozen=True)
class RopeScalingFields:
    """The fields one rule needs (`required`) and may take (`optional`) besides `rope_type`."""

    required: tuple[str, ...]
    optional: tuple[str, ...] = ()
    what: str = ""


RULES: dict[str, RopeScalingFields] = {
    "linear": RopeScalingFields(("factor",), what="positions divided by factor"),
    "dynamic": RopeScalingFields(
        ("factor",),
        what="NTK base grown with the sequence beyond max_position_embeddings",
    ),
    "yarn": RopeScalingFields(
        ("factor", "original_max_position_embeddings"),
        (
            "attention_factor",
            "beta_fast",
            "beta_slow",
            "mscale",
            "mscale_all_dim",
            "truncate",
        ),
        what="YaRN: per-frequency interpolation ramp and a cos/sin attention factor",
    ),
    "llama3": RopeScalingFields(
        ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
        what="Llama 3.1: low frequencies divided by factor, a smooth band, high ones kept",
    ),
}


def _number(key: str, name: str, value, *, minimum: float, strict: bool = False) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or value < minimum or (strict and value == minimum):
        bound = f"> {minimum}" if strict else f">= {minimum}"
        raise ConfigError(f"{key}.{name} {value!r} is not valid: it must be a number {bound}")


def _check_values(key: str, kind: str, value: dict) -> None:
    _number(key, "factor", value["factor"], minimum=1.0)
    length = value.get("original_max_position_embeddings", 1)
    if not isinstance(length, int) or isinstance(length, bool) or length < 1:
        raise ConfigError(
            f"{key}.original_max_position_embeddings {length!r} is not valid: a positive integer"
        )
    positive = ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim")
    for name in (*positive, "low_freq_factor", "high_freq_factor"):
        if value.get(name) is not None:
            _number(key, name, value[name], minimum=0.0, strict=True)
    if "truncate" in value and not isinstance(value["truncate"], bool):
        raise ConfigError(f"{key}.truncate {value['truncate']!r} is not valid: true or false")
    if kind == "llama3" and value["high_freq_factor"] <= value["low_freq_factor"]:
        raise ConfigError(
            f"{key}: high_freq_factor {value['high_freq_factor']} must exceed low_freq_factor "
            f"{value['low_freq_factor']}"
        )
    if kind == "yarn" and (value.get("beta_fast") or 32) < (value.get("beta_slow") or 1):
        raise ConfigError(f"{key}: beta_fast must be >= beta_slow (defaults 32 and 1)")


def check_rope_scaling(value: dict | None, pos_emb: str, key: str = "rope_scaling") -> None:
    """Raise `ConfigError` naming `key` unless `value` is null or a valid scaling rule."""
    if value is None:
        return
    if pos_emb != "rotary":
        raise ConfigError(f"{key} scales rotary embeddings: it needs pos_emb rotary, not {pos_emb}")
    valid = ", ".join(RULES)
    if not isinstance(value, dict) or "rope_type" not in value:
        hint = " (write the rule as rope_type, not type)" if isinstance(value, dict) else ""
        raise ConfigError(f"{key} {value!r} needs a rope_type: one of {valid}{hint}")
    kind = value["rope_type"]
    if kind not in RULES:
        raise ConfigError(f"{key}.rope_type {kind!r} is not supported; valid: {valid}")
    rule = RULES[kind]
    missing = [name for name in rule.required if value.get(name) is None]
    if missing:
        raise ConfigError(f"{key} ({kind}) is missing {missing}; it needs {list(rule.required)}")
    unknown = sorted(set(value) - {"rope_type", *rule.required, *rule.optional})
    if unknown:
        raise ConfigError(
            f"{key} ({kind}) does not take {unknown}; it takes {list(rule.required)}"
            + (f" and optionally {list(rule.optional)}" if rule.optional else "")
        )
    _check_values(key, kind, value)
