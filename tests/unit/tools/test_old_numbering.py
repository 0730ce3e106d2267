"""Checkpoints we wrote before issue 27, in the old layer numbering, still read (and migrate).

The old numbering, written out here from the layer list we used until then (not from the
code that reads it): with L transformer layers,

    0         WordEmbeddingPipe: `word_embeddings.weight` (the tied `embed` module if tied)
    1         PositionEmbeddingPipe: `position_embeddings.weight` with learned positions, else
              nothing; DeepSpeed wrote its file either way (an empty state)
    2 .. L+1  the transformer layers (unchanged)
    L+2       the final norm
    L+3       the untied head (tied: no file)

and the plain engine's `module` held the model's own names with those indices
(`{index}.{name}`, `tied_modules.embed.word_embeddings.weight`), not GPT-NeoX's sequential
names. The checkpoint tools read such a folder as it was, and `tools/reshard.py` rewrites it in
GPT-NeoX's numbering (the migration the pre-flight names).
"""

from __future__ import annotations

import pytest
import torch

from megatron.checkpoint_tools import CheckpointReader
from tests.unit.tools.test_neox_layout import _write

LAYER = "layer_{:02d}-model_{:02d}-model_states.pt"


def to_old_numbering(folder, layers: int, tp: int, pp: int, tied: bool) -> None:
    """Rewrite a folder of GPT-NeoX's numbering (test_neox_layout.py) in the old one."""
    if pp:
        for t in range(tp):
            embedding = torch.load(folder / LAYER.format(0, t))
            positions = {k: v for k, v in embedding.items() if k.startswith("position_")}
            words = {k: v for k, v in embedding.items() if k not in positions}
            torch.save(words, folder / LAYER.format(0, t))
            torch.save(positions, folder / LAYER.format(1, t))
            for new, old in ((layers + 3, layers + 2), (layers + 4, layers + 3)):
                if (folder / LAYER.format(new, t)).is_file():
                    (folder / LAYER.format(new, t)).rename(folder / LAYER.format(old, t))
        return
    for path in folder.glob("mp_rank_*_model_states.pt"):
        saved = torch.load(path, weights_only=False)
        old = {}
        for name, value in saved["module"].items():
            index, local = name.removeprefix("sequential.").split(".", 1)
            index = int(index)
            if index == 0 and local.startswith("position_"):
                old[f"1.{local}"] = value
            elif index == 0 and tied:
                old[f"tied_modules.embed.{local}"] = value
            else:
                old[f"{index - 1 if index >= layers + 3 else index}.{local}"] = value
        saved["module"] = old
        torch.save(saved, path)


def _old_folder(tmp_path, arch, tp, pp):
    cfg, state, folder = _write(tmp_path / "old", arch, tp, pp)
    to_old_numbering(folder, cfg.model.num_layers, tp, pp, not cfg.model.no_weight_tying)
    return cfg, state, folder


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_old_numbering_is_really_old(tmp_path):
    """The fixture's folder is not in GPT-NeoX's numbering (a layer 1 file, the head at L+3)."""
    _, _, folder = _old_folder(tmp_path, "pythia_untied", 1, 2)
    assert {p.name for p in folder.glob("layer_*")} == {
        LAYER.format(i, 0) for i in (0, 1, 2, 3, 4, 5, 6)
    }


def _cases():
    for arch in ("learned_positions_tied", "pythia_untied"):
        for tp, pp in ((1, 2), (2, 1), (1, 0), (2, 0)):
            yield arch, tp, pp


@pytest.mark.parametrize("arch, tp, pp", list(_cases()))
def test_tools_read_and_migrate_an_old_numbering_folder(tmp_path, arch, tp, pp):
    from tools import reshard

    _, state, folder = _old_folder(tmp_path, arch, tp, pp)
    assert _same(CheckpointReader(folder).state_dict(), state)

    out = tmp_path / "new"
    argv = ["--checkpoint", str(folder), "--output", str(out), "--model-parallel-size",
            str(tp), "--pipe-parallel-size", str(pp)]  # fmt: skip
    assert reshard.main(argv) == 0
    migrated = CheckpointReader(out)
    assert not migrated.old_numbering
    assert _same(migrated.state_dict(), state)
