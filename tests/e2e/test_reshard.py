"""Resharding end to end on CPU: the step-2 checkpoints of the (tp=2, pp=2) runs go to (1, 1)
and to the plain engine (1, 0) with `tools/reshard.py`, and the (1, 1) one on to (2, 1). At
each new layout the model (loaded by `megatron.inference` at that layout) gives the (2, 2)
logits, and training resumed from it (optimizer state resharded) repeats the unbroken run's
step-3 loss, for the GPT-NeoX-style and the Llama-style model.
"""

from __future__ import annotations

import pytest

from tests.distributed import run_distributed
from tests.tiny import HF_VOCAB, resolve
from tests.unit.tools.tiny_checkpoints import ARCHS, probe_and_generate, trained

pytestmark = pytest.mark.slow


def reshard(source, output, tp: int, pp: int) -> str:
    from tools import reshard as tool

    argv = ["--checkpoint", str(source), "--output", str(output)]
    argv += ["--model-parallel-size", str(tp), "--pipe-parallel-size", str(pp)]
    assert tool.main(argv) == 0
    return str(output)


def _probe_and_resume(rank, world_size, runs):
    from megatron.launcher.worker import initialize_distributed
    from megatron.training import pretrain

    out = {}
    for key, settings in runs.items():
        cfg = resolve(settings, world_size, vocab_size=HF_VOCAB)
        probes = probe_and_generate(cfg, initialize_distributed(cfg))
        result = pretrain(cfg)
        out[key] = {"logits": probes["logits"], "losses": result.losses}
    return out


def _runs(tmp_path, checkpoints: dict, tp: int, pp: int) -> dict:
    """Resume settings `{(arch, layout): settings}` from `{arch: resharded folder}`."""
    runs = {}
    for arch, folder in checkpoints.items():
        settings = dict(trained()[arch]["settings"])
        settings.update(
            model_parallel_size=tp,
            pipe_parallel_size=pp,
            load=folder,
            save=None,
            log_dir=str(tmp_path / f"{arch}_{tp}_{pp}" / "logs"),
        )
        runs[(arch, (tp, pp))] = settings
    return runs


def _check(results, reference):
    for key in results[0]:
        arch, _ = key
        last = next(r[key] for r in results if r[key]["logits"] is not None)
        assert (last["logits"] - reference[arch]["logits"]).abs().max() < 1e-5, key
        step3 = reference[arch]["losses"][2]
        for r in results:
            assert len(r[key]["losses"]) == 1, key  # resumed at step 2 of 3
            assert r[key]["losses"][0] == pytest.approx(step3, abs=1e-5), key


def test_reshard_to_1_1_plain_and_2_1_keeps_logits_and_resumes_the_loss(tmp_path):
    reference = trained()
    to_11, to_plain, to_21 = {}, {}, {}
    for arch in ARCHS:
        step2 = reference[arch]["folder"] / "ckpt" / "global_step2"
        to_11[arch] = reshard(step2, tmp_path / "tp1pp1" / arch, tp=1, pp=1)
        to_plain[arch] = reshard(step2, tmp_path / "tp1pp0" / arch, tp=1, pp=0)
        to_21[arch] = reshard(to_11[arch], tmp_path / "tp2pp1" / arch, tp=2, pp=1)

    one_rank = {**_runs(tmp_path, to_11, 1, 1), **_runs(tmp_path, to_plain, 1, 0)}
    _check(run_distributed(_probe_and_resume, 1, one_rank), reference)
    _check(run_distributed(_probe_and_resume, 2, _runs(tmp_path, to_21, 2, 1)), reference)


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
