"""Resharding end to end on CPU: the step-2 checkpoints of the (tp=2, pp=2) runs go to (1, 1)
with `tools/reshard.py`, and that one to (2, 1). At each new layout the model (loaded by
`megatron.inference` at that layout) gives the (2, 2) logits, and training resumed from it
(optimizer state resharded) repeats the unbroken run's step-3 loss, for the GPT-NeoX-style and
the Llama-style model.
"""

from __future__ import annotations

import pytest

from tests.distributed import run_distributed
from tests.unit.tools.tiny_checkpoints import ARCHS, probe_and_generate, resolve, trained

pytestmark = pytest.mark.slow


def reshard(source, output, tp: int, pp: int) -> str:
    from tools import reshard as tool

    argv = ["--checkpoint", str(source), "--output", str(output)]
    assert (
        tool.main(argv + ["--model-parallel-size", str(tp), "--pipe-parallel-size", str(pp)]) == 0
    )
    return str(output)


def _probe_and_resume(rank, world_size, runs):
    from megatron.training import pretrain
    from megatron.training.initialize import initialize_distributed

    out = {}
    for arch, settings in runs.items():
        cfg = resolve(settings, world_size)
        probes = probe_and_generate(cfg, initialize_distributed(cfg))
        result = pretrain(cfg)
        out[arch] = {"logits": probes["logits"], "losses": result.losses}
    return out


def _check(results, reference, layout):
    for arch in ARCHS:
        last = next(r[arch] for r in results if r[arch]["logits"] is not None)
        assert (last["logits"] - reference[arch]["logits"]).abs().max() < 1e-5, (arch, layout)
        for r in results:
            assert len(r[arch]["losses"]) == 1, (arch, layout)  # resumed at step 2 of 3
            step3 = reference[arch]["losses"][2]
            assert r[arch]["losses"][0] == pytest.approx(step3, abs=1e-5), (arch, layout)


def _resume_settings(tmp_path, name, checkpoint, tp, pp):
    runs = {}
    for arch in ARCHS:
        base = dict(trained()[arch]["settings"])
        base.update(
            model_parallel_size=tp,
            pipe_parallel_size=pp,
            load=checkpoint[arch],
            save=None,
            log_dir=str(tmp_path / name / arch / "logs"),
        )
        runs[arch] = base
    return runs


def test_reshard_tp2_pp2_to_1_1_to_2_1_keeps_logits_and_resumes_the_loss(tmp_path):
    reference = trained()
    to_11, to_21 = {}, {}
    for arch in ARCHS:
        step2 = reference[arch]["folder"] / "ckpt" / "global_step2"
        to_11[arch] = reshard(step2, tmp_path / "tp1pp1" / arch, tp=1, pp=1)
        to_21[arch] = reshard(to_11[arch], tmp_path / "tp2pp1" / arch, tp=2, pp=1)

    results = run_distributed(_probe_and_resume, 1, _resume_settings(tmp_path, "r11", to_11, 1, 1))
    _check(results, reference, "(1, 1)")
    results = run_distributed(_probe_and_resume, 2, _resume_settings(tmp_path, "r21", to_21, 2, 1))
    _check(results, reference, "(2, 1)")


def test_inspect_shows_the_same_norms_at_every_layout(tmp_path, capsys):
    from tools import inspect_checkpoint

    run = trained()["llama"]
    step2 = run["folder"] / "ckpt" / "global_step2"
    other = reshard(step2, tmp_path / "plain_tp1", tp=1, pp=0)
    tables = []
    for folder in (step2, other):
        assert inspect_checkpoint.main(["--checkpoint", str(folder)]) == 0
        tables.append(capsys.readouterr().out)
    assert "iteration   2" in tables[0] and "layout      tp=2 pp=2" in tables[0]
    assert "layout      tp=1 pp=0" in tables[1]
    norms = [[line for line in t.splitlines() if "norm " in line] for t in tables]
    assert len(norms[0]) == 17 and norms[0] == norms[1]  # 7 per layer, final norm, emb, head
