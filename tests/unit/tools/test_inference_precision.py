"""The inference model holds a bf16 run's weights as training does: DeepSpeed's engine casts the
parameters to bf16 and keeps the buffers (ALiBi's slopes) in fp32, and so does
`InferenceModel.from_config`. Then the same weights give the same logits in `eval.py` or
generation as in training's evaluation. 16 heads: ALiBi's slopes for them are the powers of
2^-0.5, whose odd powers bf16 rounds; the rounded slopes move the (bf16) score bias from
distances of about 100 on, so the sequence is 128 long."""

from __future__ import annotations

import copy
import types

import torch
from deepspeed.runtime.engine import DeepSpeedEngine

from megatron.inference import model as inference
from megatron.model import build_model
from megatron.parallel import ParallelTopology
from tests.tiny import tiny_config


def training_cast(module: torch.nn.Module) -> torch.nn.Module:
    """The model as DeepSpeed's bf16 engine holds it: its own cast, called on a copy."""
    trained = copy.deepcopy(module)
    engine = types.SimpleNamespace(module=trained)
    DeepSpeedEngine._cast_module_mixed_precision(engine, torch.bfloat16, None, False)
    return trained


def test_bf16_alibi_logits_equal_the_training_models(monkeypatch):
    cfg = tiny_config(
        pos_emb="alibi",
        num_attention_heads=16,
        hidden_size=64,
        seq_length=128,
        max_position_embeddings=128,
        precision="bf16",
        loss_chunk_tokens=0,  # the training model's logits, compared below
    )
    topology = ParallelTopology(1, 1, world_size=1)
    torch.manual_seed(0)
    built = build_model(cfg, topology)
    with torch.no_grad():  # larger weights than the init: attention far from uniform
        for p in built.parameters():
            p.mul_(3.0)
    trained = training_cast(built).eval()

    def load_weights(module, path, topo):
        module.load_state_dict(built.state_dict())

    monkeypatch.setattr(inference, "load_weights", load_weights)
    monkeypatch.setattr(
        inference, "inference_device_and_dtype", lambda cfg: (torch.device("cpu"), torch.bfloat16)
    )
    model = inference.InferenceModel.from_config(cfg, topology, "unused", vocab_size=100)

    slopes = [b for name, b in model.module.named_buffers() if name.endswith("slopes")]
    assert slopes and all(b.dtype == torch.float32 for b in slopes)
    tokens = torch.randint(0, 100, (2, 128), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(128).expand(2, 128)
    with torch.no_grad():
        expected = trained(tokens, positions).float()[..., :100]
    assert torch.equal(model.forward(tokens, positions), expected)
