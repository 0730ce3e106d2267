"""The documentation site as the tests build and read it: one definition of the build
(`mkdocs build --strict`, as `make docs` runs it) and of the pages in mkdocs.yml's nav."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def build_site(site: Path) -> subprocess.CompletedProcess:
    """Build the site into `site`; skips the test where MkDocs or its theme is not installed."""
    pytest.importorskip("mkdocs", reason="MkDocs comes with requirements/requirements-dev.txt")
    pytest.importorskip("material", reason="the Material theme (mkdocs-material)")
    # Material's end-of-life notice, printed on every build, says nothing about these pages.
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def nav_pages() -> dict[str, str]:
    """{page (its path under docs/): title} of every page in mkdocs.yml's navigation."""
    pages: dict[str, str] = {}

    def walk(entries):
        for entry in entries:
            for title, target in entry.items():
                if isinstance(target, list):
                    walk(target)
                else:
                    pages[target] = title

    walk(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    return pages
