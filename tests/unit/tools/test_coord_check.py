"""`tools/coord_check.py` from the command line, at tiny widths: it draws both plots (real PNG
files, read back by matplotlib) and its JSON shows the standard parametrisation's logits
growing with the width more than muP's (Tensor Programs V, section 7.3)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.tiny import BARE, REPO, write_config

pytest.importorskip("matplotlib")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"  # the PNG specification's first eight bytes


def test_coord_check_draws_both_plots_and_sp_grows_more_than_mup(tmp_path):
    base = dict(
        BARE,
        hidden_size=16,
        num_attention_heads=2,
        tokenizer_type="CharLevelTokenizer",
        optimizer={"type": "Adam", "params": {"lr": 1.0e-3}},
    )
    config = write_config(tmp_path, base)
    out = tmp_path / "coord"
    done = subprocess.run(
        [sys.executable, "tools/coord_check.py", str(config), "--widths", "16,256"]
        + ["--steps", "4", "--batch", "4", "--seq-length", "16", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    from matplotlib.image import imread

    for name in ("sp", "mup"):
        png = out / f"coord_check_{name}.png"
        assert png.read_bytes()[:8] == PNG_SIGNATURE
        height, width = imread(png).shape[:2]
        assert height > 100 and width > 100
    numbers = json.loads((out / "coord_check.json").read_text())

    def growth(kind: str) -> float:
        """The logits' size at width 256 over width 16, after the last step."""
        logits = {w: numbers[kind][w]["logits"][-1] for w in ("16", "256")}
        return logits["256"] / logits["16"]

    # About 14 against 1 here (tests/unit/model/test_mup_coord.py holds the numbers)
    assert growth("sp") > 3 * growth("mup"), numbers
