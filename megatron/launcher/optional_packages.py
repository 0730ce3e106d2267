"""Optional packages a run needs, checked on the launching machine before any worker starts.

    check_optional_packages("train.py", group)   # raises MissingPackageError, naming the pip
                                                 # command that installs what is missing

`group(name)` returns a config group (`logging`, `tokenizer`): `deepy.py` passes the groups of
the merged settings, before the full resolution (which already loads the tokenizer). The table
`OPTIONAL_PACKAGES` is the one place that says which setting needs which package; the
requirement strings are the ones of `requirements/requirements-*.txt` (a test keeps them
equal). Finding a package is `importlib.util.find_spec` (nothing is imported), so the check
costs milliseconds.

The tools check theirs the same way before they start (`check_tool_packages`, the table
`TOOL_PACKAGES`): the Hugging Face conversion needs transformers and safetensors, which the
quick start does not install. Not listed: zstandard (only `tools/preprocess_data.py` reads
`.zst`, and says so itself).
"""

from __future__ import annotations

import importlib.util
import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass

from megatron.config.neox.keys import attention_types
from megatron.launcher.errors import LauncherError

TRAIN, EVAL = "train.py", "eval.py"
HF_TOKENIZERS = ("GPT2BPETokenizer", "HFGPT2Tokenizer", "HFTokenizer")
GroupOf = Callable[[str], object]  # config group by name, e.g. group("logging").use_wandb


class MissingPackageError(LauncherError):
    """The config needs a package this Python cannot import; the message has the pip command."""


@dataclass(frozen=True)
class OptionalPackage:
    """A package that some runs need: `needed_by(script, group)` says why, or None."""

    module: str
    """The import name looked up with `find_spec`."""
    requirement: str
    """What to `pip install`, as written in requirements/."""
    needed_by: Callable[[str, GroupOf], str | None]


def _tensorboard(script: str, group: GroupOf) -> str | None:
    directory = group("logging").tensorboard_dir
    return f"tensorboard_dir: {directory}" if script == TRAIN and directory else None


def _wandb(script: str, group: GroupOf) -> str | None:
    return "use_wandb: true" if script == TRAIN and group("logging").use_wandb else None


def _comet(script: str, group: GroupOf) -> str | None:
    return "use_comet: true" if script == TRAIN and group("logging").use_comet else None


def _lm_eval(script: str, group: GroupOf) -> str | None:
    return "eval.py runs the lm-eval harness" if script == EVAL else None


def _tokenizer(*types: str) -> Callable[[str, GroupOf], str | None]:
    def needed(script: str, group: GroupOf) -> str | None:
        kind = group("tokenizer").tokenizer_type
        return f"tokenizer_type: {kind}" if kind in types else None

    return needed


def _mamba_kernel(*switches: str) -> Callable[[str, GroupOf], str | None]:
    """Needed when a model with `mamba` layers turns on one of these kernel switches (the
    model runs in train.py, generate.py and eval.py alike)."""

    def needed(script: str, group: GroupOf) -> str | None:
        model = group("model")
        if "mamba" not in attention_types(model.attention_config):
            return None
        on = [s for s in switches if getattr(model, s)]
        return ", ".join(f"{s}: true" for s in on) if on else None

    return needed


OPTIONAL_PACKAGES = (
    OptionalPackage("tensorboard", "tensorboard>=2.15", _tensorboard),
    OptionalPackage("wandb", "wandb>=0.17", _wandb),
    OptionalPackage("comet_ml", "comet_ml>=3.45.0", _comet),
    OptionalPackage("lm_eval", "lm-eval[hf]==0.4.13", _lm_eval),
    OptionalPackage("sentencepiece", "sentencepiece>=0.2", _tokenizer("SPMTokenizer")),
    OptionalPackage("tokenizers", "tokenizers>=0.20", _tokenizer(*HF_TOKENIZERS)),
    OptionalPackage(
        "mamba_ssm",
        "mamba-ssm>=1.2.0.post1",
        _mamba_kernel("mamba_selective_scan_fusion", "mamba_inner_func_fusion"),
    ),
    OptionalPackage(
        "causal_conv1d",
        "causal-conv1d>=1.1.0",
        _mamba_kernel("mamba_causal_conv_fusion", "mamba_inner_func_fusion"),
    ),
)


HF = ("transformers>=4.46,<6", "safetensors>=0.4")  # requirements/requirements-hf.txt
TOOL_PACKAGES: dict[str, tuple[tuple[str, str], ...]] = {
    "convert_to_hf.py": (("transformers", HF[0]), ("safetensors", HF[1])),
    "convert_from_hf.py": (("transformers", HF[0]), ("safetensors", HF[1])),
}
"""Per tool: (import name, requirement) of each package it needs beyond the runtime's."""


def check_tool_packages(tool: str) -> None:
    """Raise `MissingPackageError` (the pip command in the message) when `tool` needs a
    package this Python lacks; a tool calls it before it reads anything."""
    missing = [(m, r) for m, r in TOOL_PACKAGES.get(tool, ()) if not is_installed(m)]
    if not missing:
        return
    command = shlex.join(["pip", "install", *(r for _, r in missing)])
    names = ", ".join(m for m, _ in missing)
    raise MissingPackageError(
        f"tools/{tool} needs {names}, not installed in this Python. Install with:\n  "
        f"{command}\n(or pip install -r requirements/requirements-hf.txt). Nothing was read "
        "or written."
    )


def is_installed(module: str) -> bool:
    """Whether `module` can be imported here (looked up, not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a blocked or half-installed package
        return False


def missing_packages(script: str, group: GroupOf) -> list[tuple[OptionalPackage, str]]:
    """(package, the setting that needs it) for every needed package that is not installed."""
    name = os.path.basename(script)
    missing = []
    for package in OPTIONAL_PACKAGES:
        reason = package.needed_by(name, group)
        if reason and not is_installed(package.module):
            missing.append((package, reason))
    return missing


def check_optional_packages(script: str, group: GroupOf) -> None:
    """Raise `MissingPackageError` if the run needs a package that is not installed."""
    missing = missing_packages(script, group)
    if not missing:
        return
    lines = [f"  {p.module} (needed by {why})" for p, why in missing]
    command = shlex.join(["pip", "install", *(p.requirement for p, _ in missing)])
    raise MissingPackageError(
        f"{os.path.basename(script)} with this config needs packages that are not installed:\n"
        + "\n".join(lines)
        + f"\nInstall them with:\n  {command}\nor change the settings named above. "
        "Nothing was launched."
    )
