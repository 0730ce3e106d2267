"""The reward model's value head (`ModelArgs.value_head`, `train_impl: rm`).

- Its values are the language model's final hidden states (same seed, same body) times the
  `(1, h)` score weight: checked against the LM twin through a hook on the final norm.
- The body keeps the language model's parameter names (tied or not), the head is
  `{L+3}.score.weight`, and the analytic count equals what is built.
- FLOPs per token equal torch's FLOP counter over forward and backward.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from megatron.model import build_gpt, count_parameters, layer_index
from megatron.training.metrics.flops import ModelShape, training_flops_per_token
from tests.flop_counter import flop_counter
from tests.unit.model.tiny import SEQ, llama_args, neox_args

ARGS = {"neox_tied": neox_args, "llama_untied": llama_args}


@pytest.mark.parametrize("make", ARGS.values(), ids=ARGS.keys())
def test_values_are_final_hidden_states_times_the_score_weight(make):
    lm_args = make(hidden_dropout=0.0, attention_dropout=0.0)
    rm = build_gpt(dataclasses.replace(lm_args, value_head=True)).eval()
    lm = build_gpt(lm_args).eval()
    head = f"{layer_index(lm_args, 'head')}.score.weight"
    rm_names = {n for n, _ in rm.named_parameters()}
    lm_names = {n for n, _ in lm.named_parameters()}
    assert rm_names - lm_names == {head}
    assert not any(n.endswith("final_linear.weight") for n in rm_names)
    assert sum(p.numel() for p in rm.parameters()) == count_parameters(rm.args)
    rm_state = rm.state_dict()
    for name, p in lm.named_parameters():  # the same seed builds the same body
        if name in rm_state:
            assert torch.equal(rm_state[name], p), name

    hidden = {}
    norm = lm.get_submodule(str(layer_index(lm_args, "final_norm")))
    norm.register_forward_hook(lambda m, i, out: hidden.update(h=out))
    tokens = torch.randint(0, lm_args.vocab_size, (3, SEQ), generator=torch.Generator())
    positions = torch.arange(SEQ).expand(3, SEQ)
    with torch.no_grad():
        lm(tokens, positions)
        values = rm(tokens, positions)
    expected = hidden["h"].transpose(0, 1) @ rm_state[head][0]  # (b, s, h) @ (h,) -> (b, s)
    assert values.shape == (3, SEQ)
    assert torch.allclose(values, expected, atol=1e-6)


def test_training_flops_match_the_flop_counter():
    args = dataclasses.replace(llama_args(), value_head=True)
    with torch.device("meta"):
        model = build_gpt(args)
        tokens = torch.zeros(1, SEQ, dtype=torch.long)
        with flop_counter() as counter:
            model(tokens, torch.arange(SEQ)[None]).sum().backward()
    counted = counter.get_total_flops() / SEQ
    assert counted == pytest.approx(training_flops_per_token(ModelShape.from_args(args)))
