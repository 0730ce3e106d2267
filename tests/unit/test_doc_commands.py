"""Every command in the documentation is tested, or says why it is not.

Each fenced shell block (```bash, ```sh, ```shell, ```console) of README.md and docs/*.md has
a marker line just before it (an HTML comment: invisible on GitHub and on the site):

- `<!-- doc-test: run -->`: the block runs as written, in a sandbox (below).
- `<!-- doc-test: dry-run -->`: each `deepy.py` launch runs with `--dry-run` (config, pre-flight
  checks, memory plan; nothing launched); a tool that only reads what a real run would have
  written (a checkpoint) runs with `--help`, and every option the command gives must be in
  that help; the data builders (`DATA_BUILDERS`) run as written, since what they make is what
  the next command reads.
- `<!-- doc-test: help -->`: every command's script runs with `--help` and every option the
  command gives must be in it: for commands over the reader's own files (their corpus, their
  checkpoint, a Hugging Face model).
- `<!-- doc-test: illustration (why) -->`: not run, with the reason (a GPU, a cluster, the
  network, hours). Its config keys are still checked.

Every `--set KEY=...` (and `--sweep KEY=...`) in any shell block, and every top-level key of
a ```yaml block (unless marked `<!-- doc-test: not a config (why) -->`), must be a key the
config accepts, as `deepy.py` decides it: ours, a GPT-NeoX key, or a renamed one.

A block without a marker fails, as does an unlabelled block that starts like a command (`$ `):
label it `console`. The sandbox is a folder of links to the repository's files with its own
`data/` (the quick start's, `prepare_data.py shakespeare`), `checkpoints/` and `logs/`, a
`python` on PATH that is this test's Python, and a `.venv/bin/activate` that puts it first.
A dry-run or help block's command runs once however many pages show it; all of it takes under
a minute on two CPU cores (the two `tools/plan.py` runs and five dry runs are most of it).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = {"bash", "sh", "shell", "console"}
MARKER = re.compile(r"^\s*<!-- doc-test: (.*?) -->\s*$")
MODES = re.compile(r"^(run|dry-run|help|illustration \((.+)\)|not a config \((.+)\))$")
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
SET_KEY = re.compile(r"--(?:set|sweep)[ =]+['\"]?([A-Za-z_][\w.-]*)=")
# In a dry-run block, these run as written: they make (in seconds) what the next command reads.
DATA_BUILDERS = {"prepare_data.py", "tools/make_preference_data.py"}
# Not linked into the sandbox: what the commands write, and what is not the repository's.
OWN_FOLDERS = {".git", ".venv", "data", "checkpoints", "logs", "site", ".megatron_launch", "hf"}


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    body: list[str]
    marker: str | None
    commands: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def _marker_before(lines: list[str], fence: int) -> str | None:
    """The doc-test marker among the HTML comment lines right above a fence."""
    i = fence - 1
    while i >= 0 and lines[i].strip().startswith("<!--") and lines[i].strip().endswith("-->"):
        match = MARKER.match(lines[i])
        if match:
            return match.group(1)
        i -= 1
    return None


def _commands(lang: str, body: list[str]) -> list[str]:
    """The block's commands, continuation lines joined; a console block's are its `$ ` lines."""
    commands, current = [], None
    for line in body:
        text = line.strip()
        if current is not None:
            current += " " + text
        elif lang == "console":
            if not text.startswith("$ "):
                continue  # output
            current = text[2:]
        elif text and not text.startswith("#"):
            current = text
        else:
            continue
        if current.endswith("\\"):
            current = current[:-1].rstrip()
        else:
            commands.append(current)
            current = None
    return commands


def _blocks() -> list[Block]:
    blocks = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        i = 0
        while i < len(lines):
            match = FENCE.match(lines[i])
            if not match:
                i += 1
                continue
            indent, lang = match.groups()
            start, body = i, []
            i += 1
            while not re.match(r"^\s*```\s*$", lines[i]):
                body.append(lines[i][len(indent) :])
                i += 1
            i += 1
            block = Block(page, start + 1, lang, body, _marker_before(lines, start))
            if lang in SHELL:
                block.commands = _commands(lang, body)
            blocks.append(block)
    return blocks


BLOCKS = _blocks()
SHELL_BLOCKS = [b for b in BLOCKS if b.lang in SHELL]
YAML_BLOCKS = [b for b in BLOCKS if b.lang == "yaml"]


def _mode(block: Block) -> str:
    return (block.marker or "").split(" ")[0]


def test_every_shell_block_is_marked():
    unmarked = [b.id for b in SHELL_BLOCKS if not b.marker or not MODES.match(b.marker)]
    assert not unmarked, (
        f"shell blocks without a valid doc-test marker: {unmarked}; put "
        "`<!-- doc-test: run -->`, `dry-run`, `help` or `illustration (why)` on the line "
        "before the fence"
    )
    not_shell = [b.id for b in SHELL_BLOCKS if b.marker and b.marker.startswith("not a config")]
    assert not not_shell, f"`not a config` marks YAML blocks only: {not_shell}"


def test_unlabelled_blocks_are_not_commands():
    unlabelled = [
        b.id for b in BLOCKS if b.lang in ("", "text") and b.body and b.body[0].startswith("$ ")
    ]
    assert not unlabelled, f"label these command blocks ```console: {unlabelled}"


def test_the_readme_two_commands_stay_where_ci_reads_them():
    """.ci/run reads the block after `<!-- the two commands` with awk: still two lines."""
    program = re.search(r"awk '([^']+)' README\.md", (ROOT / ".ci" / "run").read_text())
    assert program, ".ci/run no longer reads README.md with awk: update this test"
    block = subprocess.run(
        ["awk", program.group(1), "README.md"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert len(block) == 2 and block[0].startswith("make train"), block
    assert block[1].startswith("make test"), block


# Config keys


def _key_problem(key: str) -> str | None:
    """None if `deepy.py` accepts `key` (its head, for a dotted `--set`), else its error."""
    from megatron.config.loader import Setting, normalise_key
    from megatron.config.neox.policy import map_neox_keys
    from megatron.config.schema import ConfigError

    head = normalise_key(key.split(".")[0])
    try:
        map_neox_keys({head: Setting(None, "the docs")}, [])
    except ConfigError as err:
        return str(err)
    return None


@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=lambda b: b.id)
def test_set_keys_exist(block):
    keys = SET_KEY.findall("\n".join(block.body))
    bad = {key: problem for key in keys if (problem := _key_problem(key))}
    assert not bad, f"{block.id}: {bad}"


@pytest.mark.parametrize("block", YAML_BLOCKS, ids=lambda b: b.id)
def test_yaml_keys_exist(block):
    if block.marker and block.marker.startswith("not a config"):
        assert MODES.match(block.marker), f"{block.id}: `not a config (why)` needs its reason"
        return
    settings = yaml.safe_load(textwrap.dedent("\n".join(block.body)))
    assert isinstance(settings, dict), f"{block.id} is not a mapping of config keys"
    bad = {key: problem for key in settings if (problem := _key_problem(str(key)))}
    assert not bad, f"{block.id}: {bad}"


# Running them


def _script(tokens: list[str]) -> int | None:
    """The index of the Python script a `python script.py ...` command runs."""
    for i, token in enumerate(tokens[:-1]):
        if token == "python" and tokens[i + 1].endswith(".py"):
            return i + 1
    return None


def _options(tokens: list[str]) -> list[str]:
    return [t.split("=")[0] for t in tokens if t.startswith("--")]


def _offers(help_text: str, option: str) -> bool:
    """Whether a `--help` text lists `option` (a whole option: `--verify` is not `--verify-x`)."""
    return re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", help_text) is not None


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """Links to the repository's files, the quick start's data, a `python` that is this one."""
    box = tmp_path_factory.mktemp("docs-sandbox")
    for entry in ROOT.iterdir():
        if entry.name not in OWN_FOLDERS:
            (box / entry.name).symlink_to(entry)
    (box / "bin").mkdir()
    python = box / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    python.chmod(0o755)
    (box / ".venv" / "bin").mkdir(parents=True)
    (box / ".venv" / "bin" / "activate").write_text(f'export PATH="{box / "bin"}:$PATH"\n')
    env = {**os.environ, "PATH": f"{box / 'bin'}:{os.environ['PATH']}"}
    env.pop("VIRTUAL_ENV", None)
    build = subprocess.run(
        [sys.executable, "prepare_data.py", "shakespeare"],
        cwd=box, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if build.returncode != 0:
        pytest.skip(f"the quick start's data does not build here: {build.stderr[-500:]}")
    return box, env


_ran: set[str] = set()  # the distinct commands run so far: each runs once


def _help_texts(box: Path, env: dict, scripts: list[str]) -> dict[str, tuple[int, str]]:
    """`script --help` of each script, in one Python (one import of torch for all of them)."""
    runner = textwrap.dedent("""
        import contextlib, io, json, os, runpy, sys
        out = {}
        for script in json.loads(sys.argv[1]):
            sys.argv, buf, code = [script, "--help"], io.StringIO(), 0
            sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
            with contextlib.redirect_stdout(buf):
                try:
                    runpy.run_path(script, run_name="__main__")
                except SystemExit as exit:
                    code = exit.code or 0
            sys.path.pop(0)
            out[script] = [code, buf.getvalue()]
        print(json.dumps(out))
    """)
    run = subprocess.run(
        [sys.executable, "-c", runner, json.dumps(scripts)],
        cwd=box, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return {k: tuple(v) for k, v in json.loads(run.stdout.splitlines()[-1]).items()}


def _plan(block: Block) -> tuple[list[str], list[list[str]]]:
    """(the shell lines the block runs, the commands whose script runs with `--help`)."""
    mode = _mode(block)
    lines, helped = [], []
    for command in block.commands:
        tokens = shlex.split(command, comments=True)
        at = _script(tokens)
        if mode != "run" and at is not None:
            script = tokens[at]
            if mode == "help" or (script != "deepy.py" and script not in DATA_BUILDERS):
                helped.append(tokens)
                continue
            if script == "deepy.py" and not {"--dry-run", "--describe"} & set(tokens):
                tokens.append("--dry-run")
        elif mode != "run" and tokens[:1] != ["source"]:
            pytest.fail(f"{block.id}: `{command}` is not a Python script: mark the block run")
        lines.append(shlex.join(tokens))
    return lines, helped


RUN_BLOCKS = [b for b in SHELL_BLOCKS if _mode(b) in ("run", "dry-run", "help")]


@pytest.fixture(scope="module")
def help_texts(sandbox) -> dict[str, tuple[int, str]]:
    box, env = sandbox
    scripts = {c[_script(c)] for b in RUN_BLOCKS for c in _plan(b)[1]}
    return _help_texts(box, env, sorted(scripts))


def _run_script(block: Block, box: Path, env: dict, lines: list[str]) -> None:
    script = "set -euo pipefail\n" + "\n".join(lines) + "\n"
    run = subprocess.run(
        ["bash", "-c", script], cwd=box, env=env, capture_output=True, text=True, timeout=600
    )
    said = run.stderr[-4000:] or run.stdout[-4000:]  # the failing command's error is last
    assert run.returncode == 0, f"{block.id} failed (exit {run.returncode}):\n{script}\n{said}"


@pytest.mark.parametrize("block", RUN_BLOCKS, ids=lambda b: b.id)
def test_commands_run(block, sandbox, help_texts):
    box, env = sandbox
    lines, helped = _plan(block)
    for tokens in helped:
        script = tokens[_script(tokens)]
        code, text = help_texts[script]
        assert code == 0, f"{block.id}: {script} --help exited {code}"
        missing = [o for o in _options(tokens) if not _offers(text, o)]
        assert not missing, f"{block.id}: {script} has no option {missing}"
    if _mode(block) != "run":  # a dry run writes nothing: one that ran before need not again
        lines = [line for line in dict.fromkeys(lines) if line not in _ran]
        _ran.update(lines)
    if [line for line in lines if line != "source .venv/bin/activate"]:
        _run_script(block, box, env, lines)
