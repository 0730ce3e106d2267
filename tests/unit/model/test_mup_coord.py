"""muP's coordinate check (Tensor Programs V, section 7.3) against Microsoft's `mup` package:
`coord_data`'s activation sizes are the ones mup's own coordinate check records (its training
loop, its forward hooks, its `l1`, MuAdam under muP with mup's own base shapes) on the same
models and data; and on mup's numbers the sizes grow with the width in the standard
parametrisation and stay flat under muP."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from megatron.model.args import ModelArgs
from megatron.model.gpt import build_gpt
from megatron.model.mup_coord import coord_data, widen
from megatron.model.mup_shapes import base_shapes

mup = pytest.importorskip("mup")
coord_check = pytest.importorskip("mup.coord_check")

BASE = ModelArgs(num_layers=2, hidden_size=16, num_attention_heads=2, vocab_size=64, seq_length=16)
WIDTHS = [16, 64, 256]
LR, STEPS, BATCH = 1e-2, 4, 4
# ours -> mup's module name: the model's own output, a layer's hidden states, the final norm
MODULES = {"logits": "", "layer 2": "model.2:out[0]", "layer 3": "model.3:out[0]",
           "layer 5": "model.5"}  # fmt: skip


class Logits(nn.Module):
    """Our model as mup's loop calls it: `model(tokens)`, logits out."""

    def __init__(self, model, positions):
        super().__init__()
        self.model, self.positions = model, positions

    def forward(self, tokens):
        return self.model(tokens, self.positions)


def _l1(x):  # mup's `l1`, and nothing for the position ids a layer passes on
    return x.abs().mean() if x.is_floating_point() else torch.tensor(float("nan"))


def mups_coord_data(use_mup: bool, tmp_path) -> dict[int, dict[str, list[float]]]:
    """mup's `_get_coord_data` over our models, as `{width: {module: [l1 at step 1..]}}`."""
    tokens = torch.randint(
        0, BASE.vocab_size, (BATCH, BASE.seq_length + 1), generator=torch.Generator().manual_seed(0)
    )  # coord_data's batch (its seed 0)
    positions = torch.arange(BASE.seq_length).expand(BATCH, -1)
    shapes = str(tmp_path / "base.bsh")
    mup.make_base_shapes(build_gpt(BASE), build_gpt(widen(BASE, 32, None)), savefile=shapes)

    def model_of(width):
        def make():
            model = build_gpt(widen(BASE, width, base_shapes(BASE, 2) if use_mup else None))
            if use_mup:
                mup.set_base_shapes(model, shapes, rescale_params=False)
            return Logits(model, positions)

        return make

    adam = mup.MuAdam if use_mup else torch.optim.Adam
    frame = coord_check._get_coord_data(
        {w: model_of(w) for w in WIDTHS}, [(tokens[:, :-1], tokens[:, 1:].reshape(-1))],
        lambda model: adam(model.parameters(), lr=LR), nsteps=STEPS, flatten_output=True,
        filter_module_by_name=lambda name: name.split(":")[0] in {"", "model.2", "model.3",
                                                                   "model.5"},
        output_fdict={"l1": _l1}, cuda=False, show_progress=False,
    )  # fmt: skip
    return {
        w: {
            ours: frame[(frame.width == w) & (frame.module == theirs)].sort_values("t").l1.tolist()
            for ours, theirs in MODULES.items()
        }
        for w in WIDTHS
    }


@pytest.fixture(scope="module", params=[False, True], ids=["standard", "mup"])
def both(request, tmp_path_factory):
    use_mup = request.param
    ours = coord_data(BASE, WIDTHS, mup=use_mup, lr=LR, steps=STEPS)
    return use_mup, ours, mups_coord_data(use_mup, tmp_path_factory.mktemp("shapes"))


def test_the_sizes_are_the_ones_mups_coordinate_check_records(both):
    _, ours, theirs = both
    for width in WIDTHS:
        for module in MODULES:
            assert ours[width][module] == pytest.approx(theirs[width][module], rel=1e-4), (
                width,
                module,
            )


@pytest.mark.parametrize("module", ["layer 2", "layer 3", "logits"])
def test_sizes_grow_with_width_in_standard_and_stay_flat_under_mup(both, module):
    use_mup, _, theirs = both
    growth = theirs[WIDTHS[-1]][module][-1] / theirs[WIDTHS[0]][module][-1]
    assert (0.5 < growth < 1.5) if use_mup else (growth > 4)
