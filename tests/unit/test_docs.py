"""The documents in docs/ (the site's pages) stay true to the code, and the site builds.

Every repository path written in backticks exists; every `path.py::name` is defined in that
file; every other backticked Python name is defined (or is a string) somewhere in the code;
every relative link resolves; and the room table of docs/architecture.md allows every import a
room really makes. Every page is in mkdocs.yml's navigation and in the README's map, and
`mkdocs build --strict` (broken links and anchors included) passes without a warning.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

from tests.docs_site import build_site, nav_pages

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").rglob("*.md"))
README = ROOT / "README.md"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
PATH_ROOTS = ("megatron/", "tests/", "tools/", "configs/", "docs/", "bench/", "csrc/")
PATH_ROOTS += ("requirements/", ".ci/")
SOURCE_DIRS = ("megatron", "tests", "tools", "bench")
# Names from outside this repository that the documents mention in backticks.
EXTERNAL = {"Literal", "PipelineModule", "deepspeed", "torch", "os", "transformers", "lm_eval"}
EXTERNAL |= {"datasets", "ultrafeedback_binarized"}  # Hugging Face's library and a data set of it
EXTERNAL |= {"get_pos_neg_logp", "mics_shard_size"}  # GPT-NeoX's helper, DeepSpeed's old key
BACKTICKS = re.compile(r"`([^`\n]+)`")
NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def _code_spans(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # drop fenced blocks
    return BACKTICKS.findall(text)


def _is_path(span: str) -> bool:
    top_level = "/" not in span and (ROOT / span).is_file()  # deepy.py, Makefile
    return span.startswith(PATH_ROOTS) or top_level


@cache
def _python_files() -> tuple[Path, ...]:
    files = [p for d in SOURCE_DIRS for p in (ROOT / d).rglob("*.py")]
    return tuple(files + sorted(ROOT.glob("*.py")))


def _defined_in(tree: ast.AST) -> set[str]:
    """Names a module defines at any depth: functions, classes, assignment targets."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
    return names


@cache
def _known_names() -> frozenset[str]:
    """Everything the code defines, plus every word of its string constants (record keys);
    a name is also known when the code appends it as a suffix (`_text_document`)."""
    names = set()
    for path in _python_files():
        tree = ast.parse(path.read_text())
        names |= _defined_in(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.update(re.findall(r"\w+", node.value))
    return frozenset(names | {p.stem for p in _python_files()})


def _doc_id(path: Path) -> str:
    return str(path.relative_to(ROOT / "docs"))


def test_the_architecture_document_exists():
    assert ARCHITECTURE.is_file()
    assert "docs/architecture.md" in README.read_text()


def test_every_page_is_in_the_navigation_and_the_readme_map():
    nav = set(nav_pages())
    pages = {_doc_id(p) for p in DOCS}
    assert nav == pages, f"mkdocs.yml's nav and docs/ differ: {sorted(nav ^ pages)}"
    readme = README.read_text()
    unlisted = sorted(page for page in pages - {"index.md"} if f"(docs/{page}" not in readme)
    assert not unlisted, f"the README's map of the documentation leaves out {unlisted}"


def test_the_readme_is_short_and_starts_with_the_two_commands():
    lines = README.read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; move the detail to docs/"
    marker = next(i for i, line in enumerate(lines) if line.startswith("<!-- the two commands"))
    assert marker < 15 and lines[marker + 1] == "```bash"
    assert lines[marker + 2].startswith("make train") and lines[marker + 3].startswith("make test")
    assert lines[marker + 4] == "```"


@pytest.mark.parametrize("doc", DOCS, ids=_doc_id)
def test_named_paths_and_definitions_exist(doc):
    missing = []
    for span in _code_spans(doc):
        path, _, name = span.partition("::")
        path = path.split(" ")[0]  # a command: the script it runs
        if not _is_path(path) or "{" in path or "*" in path:
            continue
        if not (ROOT / path).exists():
            missing.append(span)
        elif name:
            first = name.split(".")[0]
            if first not in _defined_in(ast.parse((ROOT / path).read_text())):
                missing.append(span)
    assert not missing, f"{doc.name} names what does not exist: {missing}"


@pytest.mark.parametrize("doc", [*DOCS, README], ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve(doc):
    targets = re.findall(r"\]\(([^)#\s]+)", doc.read_text())
    broken = [t for t in targets if "://" not in t and not (doc.parent / t).exists()]
    assert not broken, f"{doc.name} links to what does not exist: {broken}"


@pytest.mark.parametrize("doc", DOCS, ids=_doc_id)
def test_named_python_names_exist(doc):
    known = _known_names()
    unknown = [
        span
        for span in _code_spans(doc)
        if NAME.match(span)
        and not _is_path(span)
        and span.split(".")[0] not in EXTERNAL
        and not all(part in known or f"_{part}" in known for part in span.split("."))
    ]
    assert not unknown, f"{doc.name} names what the code does not define: {unknown}"


def _room_table() -> dict[str, set[str]]:
    """{room: rooms it may import} from the `| megatron/<room>/ | ... | may import |` rows."""
    rooms = {}
    for line in ARCHITECTURE.read_text().splitlines():
        match = re.match(r"^\| `megatron/(\w+)/` \|.*\| ([^|]*) \|$", line)
        if match:
            rooms[match.group(1)] = set(re.findall(r"`(\w+)`", match.group(2)))
    return rooms


def _imported_rooms(room: str) -> dict[str, str]:
    """{other room: a file importing it} over every import in `megatron/<room>/`."""
    found = {}
    for path in sorted((ROOT / "megatron" / room).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            modules = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                modules = [node.module]
            elif isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            for module in modules:
                parts = module.split(".")
                if parts[0] == "megatron" and len(parts) > 1 and parts[1] != room:
                    found.setdefault(parts[1], str(path.relative_to(ROOT)))
    return found


def test_room_table_lists_every_package():
    packages = {p.parent.name for p in (ROOT / "megatron").glob("*/__init__.py")}
    assert set(_room_table()) == packages


@pytest.mark.parametrize("room", sorted(_room_table()))
def test_rooms_import_only_what_the_table_allows(room):
    allowed = _room_table()[room]
    back_arrows = {r: f for r, f in _imported_rooms(room).items() if r not in allowed}
    assert not back_arrows, (
        f"megatron/{room}/ imports {back_arrows}; docs/architecture.md allows only "
        f"{sorted(allowed) or 'nothing'} (move the code, or change the design and the table)"
    )


def test_config_imports_neither_torch_nor_deepspeed():
    for path in (ROOT / "megatron" / "config").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                names.append(getattr(node, "module", None) or "")
                assert not any(n.split(".")[0] in ("torch", "deepspeed") for n in names), path


def test_nothing_points_outside_the_repository():
    # Users of the project have only the repository: no reference to a folder beside it.
    outside = "../" + "shared"
    files = [README, ROOT / "mkdocs.yml", *DOCS, *_python_files()]
    files += sorted((ROOT / "docs").rglob("*.py"))  # the site's build hooks
    files += [p for d in ("configs", "megatron") for p in (ROOT / d).rglob("*.md")]
    pointing = [str(p.relative_to(ROOT)) for p in files if outside in p.read_text()]
    assert not pointing, f"these files point outside the repository: {pointing}"


def test_the_site_builds_strict_without_warnings(tmp_path):
    """`mkdocs build --strict`, as `make docs` runs it: a broken link or anchor, or a page
    left out of the navigation, is a warning and fails here. The key reference the build
    generates from the config classes lists every key."""
    from megatron.config import KEY_TO_GROUP

    site = tmp_path / "site"
    run = build_site(site)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    warnings = [line for line in output.splitlines() if "WARNING" in line]
    assert not warnings, "\n".join(warnings)
    reference = (site / "config-keys" / "index.html").read_text()
    assert "generated: python deepy.py" not in reference  # the hook replaced its marker
    missing = [key for key in KEY_TO_GROUP if f"<code>{key}</code>" not in reference]
    assert not missing, f"the generated key reference leaves out {missing[:10]}"
