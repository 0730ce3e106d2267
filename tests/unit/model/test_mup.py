"""muP against Microsoft's `mup` package (the reference GPT-NeoX itself calls): base shapes,
infshapes, the optimizer's LR and weight-decay scales (MuAdam, MuSGD), the init, the readout
(MuReadout's formula), the attention scale; and `use_mup: false` leaves the model unchanged."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from megatron.config import ConfigError
from megatron.config.resolve import config_from_dict
from megatron.model.args import ModelArgs
from megatron.model.gpt import build_gpt
from megatron.model.mup import split_groups
from megatron.model.mup_shapes import base_shapes
from megatron.model.param_groups import param_groups

mup = pytest.importorskip("mup")

BASE = ModelArgs(num_layers=2, hidden_size=16, num_attention_heads=2, vocab_size=32, seq_length=8)


def wide(width: int, **kw) -> ModelArgs:
    return dataclasses.replace(BASE, hidden_size=width, head_dim=width // 2, **kw)


def mup_base_file(tmp_path) -> str:
    """mup's own base shapes: the base model against one twice as wide."""
    path = str(tmp_path / "base.bsh")
    mup.make_base_shapes(build_gpt(BASE), build_gpt(wide(32)), savefile=path)
    return path


def test_base_shapes_are_mups(tmp_path):
    import yaml

    theirs = yaml.safe_load(open(mup_base_file(tmp_path)))
    assert base_shapes(BASE, 2) == theirs


def test_lr_and_weight_decay_scales_are_muadam_and_musgd(tmp_path):
    ours = build_gpt(wide(64, use_mup=True, mup_base_shapes=base_shapes(BASE, 2)))
    ref = build_gpt(wide(64))
    mup.set_base_shapes(ref, mup_base_file(tmp_path), rescale_params=False)
    names = {id(p): n for n, p in ref.named_parameters()}
    for optimizer, mu in (("Adam", mup.MuAdam), ("SGD", mup.MuSGD)):
        expected = {}
        for g in mu(param_groups(ref, 0.1), lr=1.0).param_groups:
            for p in g["params"]:
                expected[names[id(p)]] = (pytest.approx(g["lr"]), pytest.approx(g["weight_decay"]))
        ours_names = {id(p): n for n, p in ours.named_parameters()}
        got = {}
        for g in split_groups(param_groups(ours, 0.1), optimizer):
            for p in g["params"]:
                got[ours_names[id(p)]] = (g.get("lr_scale", 1.0), g["weight_decay"])
        assert got == expected, optimizer


def test_init_scales_matrix_like_weights_as_mup(tmp_path):
    ref = build_gpt(wide(64))  # the same seed: the standard init's draws
    ours = build_gpt(
        wide(64, use_mup=True, mup_base_shapes=base_shapes(BASE, 2), mup_init_scale=0.5)
    )
    mup.set_base_shapes(ref, mup_base_file(tmp_path), rescale_params=False)
    theirs = dict(ref.named_parameters())
    for name, p in ours.named_parameters():
        shape = theirs[name].infshape
        # mup.init.normal_: std × width_mult^-1/2 for (inf, inf) tensors; GPT-NeoX × init scale
        factor = (shape.width_mult() ** -0.5 if shape.ninf() == 2 else 1.0) * 0.5
        expected = theirs[name] * (factor if p.dim() >= 2 else 1.0)
        torch.testing.assert_close(p, expected, msg=name)


def hidden_and_logits(model, tokens):
    seen = {}
    norm = dict(model.named_children())[str(BASE.num_layers + 3)]
    norm.register_forward_hook(lambda m, i, out: seen.update(hidden=out))
    logits = model(tokens, torch.arange(tokens.shape[1]).expand_as(tokens))
    return seen["hidden"], logits


@pytest.mark.parametrize("tied", [True, False])
def test_readout_is_mureadout(tied):
    """MuReadout: logits = W (h / width_mult) / output temperature."""
    base = dataclasses.replace(BASE, no_weight_tying=not tied)
    args = wide(64, no_weight_tying=not tied, use_mup=True, mup_output_temp=2.0)
    args = dataclasses.replace(args, mup_base_shapes=base_shapes(base, 2))
    model = build_gpt(args)
    hidden, logits = hidden_and_logits(model, torch.randint(0, 32, (2, 8)))
    weight = dict(model.named_parameters())[
        "tied_modules.embed.word_embeddings.weight" if tied else "6.final_linear.weight"
    ]
    expected = F.linear(hidden.transpose(0, 1) / (4.0 * 2.0), weight)
    torch.testing.assert_close(logits, expected)


@pytest.mark.parametrize("kind", ["global", "sdpa"])
def test_attention_divides_by_head_width(kind):
    """muP's attention: softmax(q k^T / (d × temp)) v (GPT-NeoX's norm_factor = head width)."""
    from megatron.model.attention_backends import ATTENTION_BACKENDS

    args = wide(64, use_mup=True, mup_base_shapes=base_shapes(BASE, 2), mup_attn_temp=0.5)
    q, k, v = (torch.randn(8, 1, 2, 32) for _ in range(3))  # (s, b, heads, d)
    actual = ATTENTION_BACKENDS[kind][False](args, 1).eval()(q, k, v)
    scores = torch.einsum("sbhd,tbhd->bhst", q, k) / (32 * 0.5)
    causal = torch.ones(8, 8, dtype=torch.bool).triu(1)
    probs = scores.masked_fill(causal, float("-inf")).softmax(-1)
    expected = torch.einsum("bhst,tbhd->sbhd", probs, v)
    torch.testing.assert_close(actual.reshape(expected.shape), expected)


def test_mup_keys_change_nothing_without_use_mup():
    tokens = torch.randint(0, 32, (2, 8))
    plain = build_gpt(BASE)
    tuned = build_gpt(
        dataclasses.replace(
            BASE, mup_embedding_mult=3.0, mup_attn_temp=2.0, mup_output_temp=2.0, mup_init_scale=2.0
        )
    )
    assert torch.equal(hidden_and_logits(plain, tokens)[1], hidden_and_logits(tuned, tokens)[1])


TINY = {
    "num_layers": 1,
    "hidden_size": 8,
    "num_attention_heads": 2,
    "seq_length": 8,
    "train_micro_batch_size_per_gpu": 1,
}


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"use_mup": True}, "needs base_shapes_file"),
        ({"use_mup": True, "base_shapes_file": "/no/such.bsh"}, "does not exist"),
        (
            {"use_mup": True, "save_base_shapes": True},
            r"save_base_shapes: true .* needs base_shapes_file",
        ),
        ({"coord_check": True}, "tools/coord_check.py"),
        (
            {
                "use_mup": True,
                "save_base_shapes": True,
                "base_shapes_file": "base.bsh",
                "optimizer": {"type": "Lion"},
            },
            "optimizer.type 'Lion'",
        ),
    ],
)
def test_config_refusals(extra, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict({**TINY, **extra}, vocab_size=32)


def test_mup_keys_without_use_mup_warn():
    warn: list[str] = []
    config_from_dict({**TINY, "mup_embedding_mult": 2.0}, vocab_size=32, warn=warn)
    assert any("mup_embedding_mult" in w and "without use_mup" in w for w in warn)


def test_embedding_multipliers_are_gpt_neox_places():
    """(words + positions × rp mult) × embedding mult (GPT-NeoX's word_embeddings.py)."""
    from megatron.model.embedding import EmbeddingPipe

    torch.manual_seed(0)
    plain = EmbeddingPipe(BASE)
    args = dataclasses.replace(
        BASE, use_mup=True, mup_rp_embedding_mult=3.0, mup_embedding_mult=5.0
    )
    ours = EmbeddingPipe(args)
    ours.load_state_dict(plain.state_dict())
    tokens = torch.randint(0, 32, (2, 8))
    positions = torch.arange(8).expand(2, 8)
    words = plain.word_embeddings(tokens)
    expected = (words + 3.0 * plain.position_embeddings(positions)) * 5.0
    torch.testing.assert_close(ours((tokens, positions))[0], expected)
