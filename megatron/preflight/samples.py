"""Pre-flight check of `sample_output_file`: generate.py never overwrites earlier samples.

A file already there with samples in it is left alone: the launch is refused with the next
free name (`samples-2.jsonl`, ...) to set instead. The worker creates the file exclusively
(`claim_sample_file`), so a launch the pre-flight did not see cannot overwrite one either.
A folder that cannot be written is refused too. Nothing is created here.
"""

from __future__ import annotations

import os
from pathlib import Path

from megatron.checkpoint.size import existing_ancestor
from megatron.config import Config, ConfigError
from megatron.preflight.findings import ERROR, OK, Finding, register

NAME = "sample_output_file"
WRITES_SAMPLES = ("unconditional", "input-file", "interactive")


def next_free_name(path: Path) -> Path:
    """`samples.jsonl` -> the first of `samples-2.jsonl`, `samples-3.jsonl`, ... not there."""
    n = 2
    while (candidate := path.with_name(f"{path.stem}-{n}{path.suffix}")).exists():
        n += 1
    return candidate


def sample_file_problem(name: str) -> str | None:
    """Why generate.py must not write its samples to `name`, or None."""
    path = Path(name)
    if path.is_dir():
        return f"sample_output_file '{name}' is a folder; set it to a file path (a .jsonl)"
    if path.exists() and path.stat().st_size > 0:
        lines = sum(1 for _ in path.open("rb"))
        return (
            f"'{path.absolute()}' already holds {lines} line(s), from an earlier run; it is not "
            f"overwritten: --set sample_output_file={next_free_name(path)}, or remove it"
        )
    base = existing_ancestor(path.absolute().parent)
    if not base.is_dir() or not os.access(base, os.W_OK | os.X_OK):
        return f"sample_output_file '{name}' cannot be written here ('{base}' is not writable)"
    return None


def claim_sample_file(name: str) -> Path:
    """Create the (empty) sample file, refusing one with samples in it; return its path."""
    problem = sample_file_problem(name)
    if problem:
        raise ConfigError(problem)
    path = Path(name).absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("", encoding="utf-8")
    return path


@register(NAME, reads_worker_files=True)
def check_sample_file(cfg: Config, script: str) -> list[Finding]:
    """generate.py's samples go to a new file, named in the report."""
    gen = cfg.generation
    if Path(script).name != "generate.py" or gen.text_gen_type not in WRITES_SAMPLES:
        return []
    problem = sample_file_problem(gen.sample_output_file)
    if problem:
        return [Finding(NAME, ERROR, problem)]
    where = Path(gen.sample_output_file).absolute()
    return [Finding(NAME, OK, f"samples will be written to '{where}'")]
