"""Text generation and evaluation settings (`cfg.generation`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class GenerationConfig:
    text_gen_type: Literal["unconditional", "input-file", "interactive", "precompute"] | None = None
    """What `generate.py` does; by default (as in GPT-NeoX) `input-file` when
    `sample_input_file` is set, else `unconditional`."""

    temperature: float = 0.0
    """Sampling temperature; 0 is greedy."""

    top_k: int = 0
    """Sample from the k most likely tokens (0 disables)."""

    top_p: float = 0.0
    """Nucleus sampling probability mass (0 disables)."""

    maximum_tokens: int = 64
    """Tokens to generate per sample."""

    prompt_end: str = "\n"
    """Separator of prompts in the input file."""

    sample_input_file: str | None = None
    """Prompts for `input-file` generation."""

    sample_output_file: str = "samples.jsonl"
    """Where generated samples are written (jsonl)."""

    num_samples: int = 1
    """Unconditional samples to generate."""

    recompute: bool = False
    """Recompute the whole sequence each step instead of using a key/value cache."""

    eval_results_prefix: str = ""
    """Prefix of the evaluation results file."""

    eval_tasks: list[str] | None = None
    """lm-eval tasks for `eval.py`."""
