"""Model FLOPs per token, throughput, TFLOP/s per device and MFU.

FLOPs count matrix multiplies only (2 per multiply-add), from the model shape:

    per layer and token, forward:
        QKV projection      2 · h · (h + 2 · h_kv)           h_kv = kv_heads · head_dim
        scores and mixing   2 · 2 · s · h                     (full s × s, as PaLM and Megatron)
        output projection   2 · h · h
        MLP                 2 · h · f · (3 if gated else 2)
    logits                  2 · h · V

A training step costs 3× the forward (backward = 2× forward): the PaLM-style
"6N + attention" model FLOPs. Activation recomputation is not counted (model FLOPs, not
hardware FLOPs), so MFU is comparable between runs with and without it.
"""

from __future__ import annotations

from dataclasses import dataclass

GATED_ACTIVATIONS = ("geglu", "swiglu", "reglu")

# Dense peak TFLOP/s per device: bf16/fp16 tensor cores, and fp32 as TF32 tensor cores.
# Matched against torch.cuda.get_device_name() in this order (first match wins).
PEAK_TFLOPS: list[tuple[str, dict[str, float]]] = [
    ("H200", {"bf16": 989.0, "fp16": 989.0, "fp32": 494.0}),
    ("H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "fp32": 378.0}),
    ("H100", {"bf16": 989.0, "fp16": 989.0, "fp32": 494.0}),
    ("GH200", {"bf16": 989.0, "fp16": 989.0, "fp32": 494.0}),
    ("B200", {"bf16": 2250.0, "fp16": 2250.0, "fp32": 1100.0}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "fp32": 156.0}),
    ("A800", {"bf16": 312.0, "fp16": 312.0, "fp32": 156.0}),
    ("A10G", {"bf16": 70.0, "fp16": 70.0, "fp32": 35.0}),
    ("L40S", {"bf16": 362.0, "fp16": 362.0, "fp32": 183.0}),
    ("L4", {"bf16": 121.0, "fp16": 121.0, "fp32": 60.0}),
    ("A6000", {"bf16": 155.0, "fp16": 155.0, "fp32": 77.0}),
    ("V100", {"bf16": 0.0, "fp16": 125.0, "fp32": 15.7}),
    ("MI300X", {"bf16": 1307.0, "fp16": 1307.0, "fp32": 654.0}),
    ("MI250X", {"bf16": 383.0, "fp16": 383.0, "fp32": 95.7}),
]


@dataclass(frozen=True)
class ModelShape:
    """What the FLOPs count needs to know about the model."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    seq_length: int
    vocab_size: int
    intermediate_size: int
    num_kv_heads: int | None = None
    gated_mlp: bool = False


def default_intermediate_size(hidden: int, activation: str, multiple_of: int = 1) -> int:
    """4 × hidden, or 2/3 of that for gated activations, rounded up to `multiple_of`."""
    size = 4 * hidden
    if activation in GATED_ACTIVATIONS:
        size = int(2 * size / 3)
    multiple_of = max(1, multiple_of)
    return multiple_of * ((size + multiple_of - 1) // multiple_of)


def shape_from_config(cfg) -> ModelShape:
    """The shape of `cfg.model` (duck-typed: anything with the GPT-NeoX attribute names)."""
    m = cfg.model
    inter = m.intermediate_size or default_intermediate_size(
        m.hidden_size, m.activation, getattr(m, "mlp_multiple_of", 1)
    )
    return ModelShape(
        num_layers=m.num_layers,
        hidden_size=m.hidden_size,
        num_attention_heads=m.num_attention_heads,
        seq_length=m.seq_length,
        vocab_size=m.padded_vocab_size,
        intermediate_size=inter,
        num_kv_heads=m.num_kv_heads,
        gated_mlp=m.activation in GATED_ACTIVATIONS,
    )


def forward_flops_per_token(shape: ModelShape) -> float:
    """Forward-pass matmul FLOPs per token (see the module docstring)."""
    h, s = shape.hidden_size, shape.seq_length
    head_dim = h // shape.num_attention_heads
    h_kv = (shape.num_kv_heads or shape.num_attention_heads) * head_dim
    qkv = 2 * h * (h + 2 * h_kv)
    attention = 2 * 2 * s * h
    dense = 2 * h * h
    mlp = 2 * h * shape.intermediate_size * (3 if shape.gated_mlp else 2)
    logits = 2 * h * shape.vocab_size
    return float(shape.num_layers * (qkv + attention + dense + mlp) + logits)


def training_flops_per_token(shape: ModelShape) -> float:
    """Forward + backward: 3 × the forward FLOPs."""
    return 3.0 * forward_flops_per_token(shape)


def peak_tflops(dtype: str, override: float | None = None, device_name: str | None = None):
    """Peak TFLOP/s of one device: `override` (peak_theoretical_tflops), else the table by
    device name; None on CPU or an unknown device (MFU is then omitted)."""
    if override:
        return float(override)
    if device_name is None:
        import torch

        if not torch.cuda.is_available():
            return None
        device_name = torch.cuda.get_device_name()
    for pattern, peaks in PEAK_TFLOPS:
        if pattern in device_name:
            return peaks.get(dtype) or None
    return None


@dataclass
class Throughput:
    """Per-interval speed figures; `mfu` is None without a known peak."""

    tokens_per_sec: float
    tflops_per_gpu: float
    mfu: float | None


def throughput(
    tokens: int, seconds: float, flops_per_token: float, world_size: int, peak: float | None
) -> Throughput:
    """Speed of `tokens` (global, all ranks) trained in `seconds` on `world_size` devices."""
    seconds = max(seconds, 1e-9)
    tokens_per_sec = tokens / seconds
    tflops = tokens_per_sec * flops_per_token / max(world_size, 1) / 1e12
    mfu = tflops / peak if peak else None
    return Throughput(tokens_per_sec, tflops, mfu)
