"""MkDocs hook: the key reference page is generated from the config classes at build time.

`docs/config-keys.md` holds an introduction and the marker below; the build replaces the
marker with `render_markdown()`, the same text as `python deepy.py --describe --markdown`
(and `configs/README.md`), so the page cannot drift from the code. Its title is the page's
own.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- generated: python deepy.py --describe --markdown -->"


def _reference() -> str:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # this checkout's code, not an installed copy
    from megatron.config.describe import render_markdown

    text = render_markdown()
    return re.sub(r"\A# [^\n]*\n", "", text)  # the page has its own title


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, _reference())
