"""The package's import graph: no circles between modules, and `megatron/training/` imported
only by `train.py`, `bench/` and `megatron/planning/`, which models a run before launch (what
other rooms share with training lives below it).

Every import counts: at module level, inside a function, behind a type-checking guard. A
circle means two files that cannot be read (or moved) one without the other; the room table
of docs/architecture.md (`test_docs.py`) checks the arrows between rooms, this test the
arrows between modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRAINING = "megatron.training"
# These may import training: the worker entry point, the benchmarks and the plan of a run.
MAY_IMPORT_TRAINING = ("train.py", "bench/", "megatron/planning/")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The package modules `path` imports (`from a.b import c` counts `a.b.c` when that is a
    module, else `a.b`)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full if full in modules else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found & modules


def import_graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in (ROOT / "megatron").rglob("*.py")}
    names = set(paths)
    return {name: _imports(path, names) - {name} for name, path in paths.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def test_the_package_has_no_import_circles():
    found = circles(import_graph())
    assert not found, "modules that import each other (directly or around a circle):\n" + (
        "\n".join(" <-> ".join(group) for group in found)
    )


def test_circles_finds_a_circle_of_three_and_not_a_chain():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def _imports_training(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        if any(n == TRAINING or n.startswith(TRAINING + ".") for n in names):
            return True
    return False


def test_only_train_py_and_bench_import_training():
    outside = [p for p in ROOT.glob("*.py")]
    outside += [p for d in ("megatron", "tools") for p in (ROOT / d).rglob("*.py")]
    importers = [
        p.relative_to(ROOT).as_posix()
        for p in outside
        if not p.is_relative_to(ROOT / "megatron" / "training") and _imports_training(p)
    ]
    assert all(i.startswith(MAY_IMPORT_TRAINING) for i in importers), importers
    assert "train.py" in importers  # the scan sees the one entry point that must import it
