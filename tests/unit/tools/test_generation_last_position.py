"""Generation computes the output head for the last position only
(`InferenceModel.forward(last_only=True)`): no tensor of prompt length x vocabulary is written
during a step, and the last position's logits are the full forward's (in one process, and at
tp 2, each rank's vocabulary shard of the last position gathered, against the one-process
full forward).

A 2-layer GPT 16 wide over GPT-NeoX's padded vocabulary (50304 rows, 50277 tokens) and a
300-token prompt, tied and untied heads (the equality also with MoE, Mamba and RWKV layers),
with `tests/device_costs.py::LargeTensors` recording each op's outputs (as
`tests/unit/training/test_loss_buffers.py` counts the training loss's logits-sized buffers).
Before, the prompt step wrote the logits of every position, then their fp32 copy: 300 x 50304
elements each.
"""

from __future__ import annotations

import pytest
import torch

from megatron.inference import InferenceModel, SamplingSettings, generate
from megatron.model import ModelArgs, build_gpt, full_state_dict, load_full_state_dict
from megatron.parallel import ParallelTopology
from tests.device_costs import LargeTensors
from tests.distributed import run_distributed

VOCAB, TOKENS, PROMPT = 50304, 50277, 300
HEADS = {"tied": {}, "untied": {"no_weight_tying": True}}
MOE = dict(moe_num_experts=4, moe_top_k=2, moe_router_type="topk", moe_expert_interval=1)
# the layers before the head see every position whatever they are
FAMILIES = {
    **HEADS,
    "moe": MOE,
    "mamba": {"layer_attention_types": ("mamba", "global"), "norm": "rmsnorm"},
    "rwkv": {"layer_attention_types": ("rwkv", "global")},
}


def model_args(head: str) -> ModelArgs:
    return ModelArgs(
        num_layers=2,
        hidden_size=16,
        num_attention_heads=2,
        vocab_size=VOCAB,
        true_vocab_size=TOKENS,
        seq_length=PROMPT + 8,
        pos_emb="rotary",
        seed=3,
        **FAMILIES[head],
    )


def tiny_model(head: str) -> InferenceModel:
    args = model_args(head)
    torch.manual_seed(0)
    module = build_gpt(args)
    topology = ParallelTopology(1, 1, world_size=1)
    return InferenceModel(module, args, topology, torch.device("cpu"), torch.float32, TOKENS)


def prompt(batch: int = 1) -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, TOKENS, (batch, PROMPT), generator=generator).tolist()


@pytest.mark.parametrize("recompute", [False, True], ids=["kv_cache", "recompute"])
@pytest.mark.parametrize("head", sorted(HEADS))
def test_no_prompt_by_vocabulary_tensor_while_generating(head, recompute):
    model = tiny_model(head)
    settings = SamplingSettings(maximum_tokens=2, recompute=recompute)
    with LargeTensors() as buffers:
        generate(model, prompt(), settings)
    large = [b for b in buffers.buffers if torch.Size(b.shape).numel() >= PROMPT * VOCAB // 2]
    assert not large, buffers.report(large)
    # the head still ran: a (1, 1, 50304) row of logits per step
    assert any(b.shape[-1] == VOCAB for b in buffers.buffers), buffers.report()


@pytest.mark.parametrize("head", sorted(FAMILIES))
def test_last_position_logits_are_the_full_forwards(head):
    model = tiny_model(head)
    tokens = torch.tensor(prompt(batch=2))
    positions = torch.arange(PROMPT).expand(2, PROMPT)
    full = model.forward(tokens, positions)  # (b, s, V): scoring's default
    last = model.forward(tokens, positions, last_only=True)
    assert full.shape == (2, PROMPT, TOKENS) and last.shape == (2, 1, TOKENS)
    assert last.dtype == torch.float32
    torch.testing.assert_close(last, full[:, -1:], rtol=1e-5, atol=1e-5)


def _tp2_last(rank, world_size, head, state, tokens):
    topology = ParallelTopology(tp_size=2, pp_size=0)
    args = model_args(head)
    module = build_gpt(args, topology)
    load_full_state_dict(module, state, topology.tp_group)
    model = InferenceModel(module, args, topology, torch.device("cpu"), torch.float32, TOKENS)
    positions = torch.arange(tokens.shape[1]).expand(tokens.shape)
    return model.forward(tokens, positions, last_only=True)


@pytest.mark.parametrize("head", sorted(HEADS))
def test_last_position_logits_at_tp2_are_the_full_forwards(head):
    model = tiny_model(head)
    tokens = torch.tensor(prompt(batch=2))
    full = model.forward(tokens, torch.arange(PROMPT).expand(2, PROMPT))
    state = {k: v.clone() for k, v in full_state_dict(model.module).items()}
    for last in run_distributed(_tp2_last, 2, head, state, tokens):
        assert last.shape == (2, 1, TOKENS)
        torch.testing.assert_close(last, full[:, -1:], rtol=1e-5, atol=1e-5)
