"""`tools/convert_to_hf.py` on real checkpoint folders (written by `write_checkpoint`).

- A model the target class cannot express (QK-norm) is refused by the command line with exit
  status 2, the option named, and no output folder; the message is all that is printed (on a
  CPU machine DeepSpeed's import warned before it that it found no GPU).
- A good export prints the tool's three lines (read, exported, verified) and nothing else:
  transformers' progress bars are off.
- `--verify` exits with status 1 when the exported weights do not reproduce ours: the export
  is corrupted on disk between the tool's export and its verification (the tool's own
  `export_hf` call, wrapped by the test), and 0 when they do.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from megatron.checkpoint_tools import ModelSchema, write_checkpoint
from megatron.checkpoint_tools.hf_import import RECORD_DEFAULTS
from megatron.config import config_from_dict
from megatron.model import ModelArgs
from tests.tiny import HF_TOKENIZER, HF_VOCAB, REPO
from tests.unit.tools.test_hf_export import random_state

safetensors_torch = pytest.importorskip("safetensors.torch")


def checkpoint(folder: Path, **model_keys) -> Path:
    keys = dict(
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        seq_length=16,
        pos_emb="rotary",
        rotary_pct=0.5,
        gpt_j_residual=True,
        tokenizer_type="HFTokenizer",
        vocab_file=str(HF_TOKENIZER),
        **RECORD_DEFAULTS,
    )
    cfg = config_from_dict({**keys, **model_keys}, vocab_size=HF_VOCAB)
    args = ModelArgs.from_config(cfg)
    write_checkpoint(
        folder,
        schema=ModelSchema(args),
        state=random_state(args),
        tp=1,
        pp=1,
        iteration=1,
        config_dict=cfg.to_dict(),
    )
    return folder


def test_inexpressible_model_is_refused_by_the_command_line(tmp_path):
    ckpt = checkpoint(tmp_path / "ckpt", use_qk_layernorm=True)
    out = tmp_path / "hf"
    done = subprocess.run(
        [sys.executable, "tools/convert_to_hf.py", "--checkpoint", str(ckpt)]
        + ["--output", str(out), "--verify"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2, done.stderr
    assert "GPTNeoXForCausalLM" in done.stderr and "use_qk_layernorm=True" in done.stderr
    assert done.stdout == "" and done.stderr.startswith("convert_to_hf.py: "), done.stdout
    assert not out.exists()


def test_an_export_prints_its_own_lines_and_no_progress_bars(tmp_path):
    ckpt = checkpoint(tmp_path / "ckpt")
    done = subprocess.run(
        [sys.executable, "tools/convert_to_hf.py", "--checkpoint", str(ckpt)]
        + ["--output", str(tmp_path / "hf"), "--verify"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # transformers' "Writing model shards", "Loading weights" bars
    lines = done.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["read", "exported", "verify:"], lines


def test_verify_fails_when_the_export_does_not_reproduce_ours(tmp_path, monkeypatch, capsys):
    from tools import convert_to_hf as tool

    ckpt = checkpoint(tmp_path / "ckpt")
    good = ["--checkpoint", str(ckpt), "--output", str(tmp_path / "good"), "--verify"]
    assert tool.main(good) == 0
    assert capsys.readouterr().out.rstrip().endswith(": ok")

    real_export = tool.export_hf

    def export_then_corrupt(state, args, output, **kwargs):
        result = real_export(state, args, output, **kwargs)
        weights = Path(output) / "model.safetensors"
        tensors = safetensors_torch.load_file(weights)
        name = "gpt_neox.layers.1.mlp.dense_4h_to_h.weight"
        tensors[name] = tensors[name] * 1.05  # a 5% error in one layer
        safetensors_torch.save_file(tensors, weights, metadata={"format": "pt"})
        return result

    monkeypatch.setattr(tool, "export_hf", export_then_corrupt)
    status = tool.main(["--checkpoint", str(ckpt), "--output", str(tmp_path / "bad"), "--verify"])
    assert status == 1
    captured = capsys.readouterr()
    assert "MISMATCH" in captured.out
    assert "does not reproduce the checkpoint's logits" in captured.err
