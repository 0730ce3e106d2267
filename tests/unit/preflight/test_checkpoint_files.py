"""The `load` pre-flight compares a folder's weight files with the model the config builds
(issue 27): a folder as GPT-NeoX saves it (its layer numbering, no `config.json`, no
`trainer_state.pt`: index 0 the embedding, 2 .. L+1 the layers, L+3 the final norm, L+4 the
untied head) resumes; a missing layer file, a file of another shape, extra layers, or our old
numbering (a layer 01 file) are refused before launch, naming the file and the fix; at another
layout it is refused with a `tools/reshard.py` command that asks for its run's config files
(the folder has none) and, given them, writes a folder the run resumes."""

from __future__ import annotations

import torch

from megatron.preflight import ERROR, OK, WARNING
from tests.tiny import write_config
from tests.unit.preflight.test_checkpoints import TINY, config, levels, load_findings, write

UNTIED = dict(no_weight_tying=True)
FILE = "layer_{:02d}-model_00-model_states.pt"


def neox_folder(tmp_path, world_size=1, tp=1, **keys):
    """Our checkpoint without our own files: the files GPT-NeoX writes (module docstring)."""
    folder = write(tmp_path, config(world_size, **UNTIED, **keys), tp=tp)
    (folder / "trainer_state.pt").unlink()
    (folder / "config.json").unlink()
    return folder


def test_a_neox_folder_resumes_and_its_files_are_checked(tmp_path):
    folder = neox_folder(tmp_path)
    assert sorted(p.name for p in folder.glob("layer_*")) == [
        FILE.format(i) for i in (0, 2, 3, 5, 6)
    ]
    found = load_findings(tmp_path, **UNTIED)
    assert levels(found) == [WARNING]  # no config.json: the shapes come from the files
    assert all("layer_" not in f.message for f in found)


def test_a_missing_layer_file_is_named(tmp_path):
    folder = neox_folder(tmp_path)
    (folder / FILE.format(5)).unlink()
    errors = [f for f in load_findings(tmp_path, **UNTIED) if f.level == ERROR]
    assert len(errors) == 1
    assert f"{FILE.format(5)} is missing (layer 5: norm.weight" in errors[0].message
    assert "Set the model keys" in errors[0].message


def test_another_model_is_named_file_by_file(tmp_path):
    neox_folder(tmp_path)
    (error,) = [f for f in load_findings(tmp_path, hidden_size=32, **UNTIED) if f.level == ERROR]
    assert FILE.format(0) in error.message and "'word_embeddings.weight' is (512, 64)" in (
        error.message
    )
    (error,) = [f for f in load_findings(tmp_path, num_layers=1, **UNTIED) if f.level == ERROR]
    assert "hold layers this model does not build" in error.message


def test_our_old_numbering_is_refused_with_the_migration(tmp_path):
    folder = write(tmp_path, config(**UNTIED))
    torch.save({}, folder / FILE.format(1))  # the old layer list's position stage
    (error,) = [f for f in load_findings(tmp_path, **UNTIED) if f.level == ERROR]
    assert "the layer numbering of our checkpoints before issue 27" in error.message
    assert f"python tools/reshard.py --checkpoint {folder}" in error.message


def test_our_own_folder_still_passes(tmp_path):
    write(tmp_path, config(**UNTIED))
    assert levels(load_findings(tmp_path, **UNTIED)) == [OK]


def test_a_zero3_folder_of_this_model_passes(tmp_path):
    """DeepSpeed's ZeRO-3 save holds the module in partitioned `zero_pp_rank_*` files and
    writes no `mp_rank_00_model_states.pt`: there is no module file to compare."""
    keys = dict(pipe_parallel_size=0, zero_optimization={"stage": 3}, **UNTIED)
    folder = write(tmp_path, config(**keys), pp=0)
    (folder / "mp_rank_00_model_states.pt").rename(
        folder / "zero_pp_rank_0_mp_rank_00_model_states.pt"
    )
    torch.save({}, folder / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    assert levels(load_findings(tmp_path, **keys)) == [OK]


def test_a_neox_folder_at_another_layout_is_refused_with_a_reshard_that_works(tmp_path):
    """GPT-NeoX's folder has no config.json, so the named command asks for its run's config
    files (`--config`); given them, it writes a folder this run resumes."""
    from tools import reshard

    folder = neox_folder(tmp_path / "neox", world_size=2, tp=2, model_parallel_size=2)
    for t in range(2):  # GPT-NeoX's AnnealingLR state and DeepSpeed's record of the batch
        path = folder / f"mp_rank_{t:02d}_model_states.pt"
        state = torch.load(path, weights_only=False)
        state["lr_scheduler"] = dict(start_lr=1.0e-3, warmup_iter=1, num_iters=2,
                                     decay_style="cosine", end_iter=8, min_lr=1.0e-4)  # fmt: skip
        state["ds_config"] = {"train_batch_size": 2}
        torch.save(state, path)
    (error,) = [f for f in load_findings(tmp_path / "neox", **UNTIED) if f.level == ERROR]
    command = error.message.split("run python tools/reshard.py ")[1].split(" and load")[0]
    assert command.endswith("--zero-stage 0 --config <the config files of the run that saved it>")
    files = str(write_config(tmp_path, {**TINY, **UNTIED, "model_parallel_size": 2}))
    command = command.replace("<the config files of the run that saved it>", files)
    assert reshard.main(command.replace("<new folder>", str(tmp_path / "tp1")).split()) == 0
    assert levels(load_findings(tmp_path / "tp1", **UNTIED)) == [OK]
