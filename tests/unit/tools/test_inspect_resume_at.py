"""`tools/inspect_checkpoint.py --resume-at`: a checkpoint written in DeepSpeed's files (by the
checkpoint tools' writer, at tp=1, pp=1) is resumable directly at its own layout and at another
data-parallel size (with the RNG notice), needs `tools/reshard.py` at another tensor-parallel
size (the pre-flight's rule and command), and cannot be laid out over tp=3 (4 heads)."""

from __future__ import annotations

import pytest
import torch

from tests.tiny import resolve, tiny_settings


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from megatron.checkpoint_tools import ModelSchema, write_checkpoint
    from megatron.model import ModelArgs

    folder = tmp_path_factory.mktemp("inspect")
    cfg = resolve(tiny_settings(folder), 1)
    schema = ModelSchema(ModelArgs.from_config(cfg))
    gen = torch.Generator().manual_seed(0)
    state = {n: torch.randn(s.shape, generator=gen) for n, s in schema.params.items()}
    write_checkpoint(
        folder / "ckpt",
        schema=schema,
        state=state,
        tp=1,
        pp=1,
        iteration=4,
        config_dict=cfg.to_dict(),
        trainer_state={"iteration": 4, "consumed_samples": 32},
    )
    return folder / "ckpt"


def _verdict(checkpoint, capsys, target: str) -> str:
    from tools import inspect_checkpoint

    argv = ["--checkpoint", str(checkpoint), "--no-norms", "--resume-at", target]
    assert inspect_checkpoint.main(argv) == 0
    out = capsys.readouterr().out
    assert "optimizer   AdamW" in out and "layout      tp=1 pp=1 zero=0 dp=1" in out
    return next(line for line in out.splitlines() if line.startswith("resume"))


def test_resume_verdicts(checkpoint, capsys):
    same = _verdict(checkpoint, capsys, "tp=1,pp=1,dp=1,zero=0")
    assert same.startswith("resume      direct") and "RNG" not in same
    more_dp = _verdict(checkpoint, capsys, "tp=1,pp=1,dp=2,zero=0")
    assert more_dp.startswith("resume      direct") and "RNG streams restart" in more_dp
    tp2 = _verdict(checkpoint, capsys, "tp=2,pp=1,dp=1,zero=0")
    assert tp2.startswith("resume      reshard") and "python tools/reshard.py" in tp2
    assert "--model-parallel-size 2 --pipe-parallel-size 1" in tp2
    tp3 = _verdict(checkpoint, capsys, "tp=3,pp=1,dp=1,zero=0")
    assert tp3.startswith("resume      cannot")


def test_bad_resume_at_names_the_part():
    from tools.inspect_checkpoint import parse_resume_at

    with pytest.raises(ValueError, match="'tq=2' is not valid"):
        parse_resume_at("tq=2,pp=1,dp=1,zero=0")
    with pytest.raises(ValueError, match="give zero too"):
        parse_resume_at("tp=2,pp=1,dp=1")
