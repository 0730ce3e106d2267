"""Model FLOPs per token, throughput, TFLOP/s per device and MFU.

What is counted: the matrix multiplies of the model that is really built (2 FLOPs per
multiply-add), read from its `ModelArgs` (`megatron/model/args.py`), so the widths are the
built layers' own: the MLP's inner width is `mlp_inner_size` (GPT-NeoX's gated rule
`int(2/3 · intermediate_size) // 2` per branch, rounded to `mlp_multiple_of`), key/value
projections have `num_kv_heads` heads (GQA), the head has the padded vocabulary's rows:

    per layer and token, forward:
        QKV projection      2 · h · (nq + 2 · nkv) · d       d = head dim
        scores and mixing   2 · 2 · k · nq · d    k = keys per query: s, or min(s, W + 1)
        output projection   2 · nq · d · h
        MLP                 2 · h · f · (3 if gated else 2)   f = inner width per branch
        MoE layer's MLP     k · (expert MLP as above) + 2 · h · E (router)
        Mamba layer         2 · h · 2di + 2 · di · (r + 2 · 16) + 2 · r · di + 2 · di · h
                            (in_proj, x_proj, dt_proj, out_proj: di = d_inner, r = dt_rank;
                            in place of attention and MLP; the depthwise convolution and the
                            scan are element-wise, not matmuls, and are not counted)
    per gMLP layer and token (in place of attention and MLP; f = 4 h, s counted in full as
    attention is; `megatron/model/gmlp.py`):
        projections         2 · h · 2f + 2 · f · h
        spatial gating      2 · s · f
        aMLP's attention    2 · 2f · 3a + 2 · 2 · s · a + 2 · a · f    a = gmlp_attn_dim
    logits                  2 · h · V_padded     (2 · h for a reward model's value head)

    an `rwkv` layer instead (a = dim_att, n = head_size, f = ffn_dim; megatron/model/rwkv.py):
        token-shift mixes   2 · h · 160 · 2          (rank-32 projection of 5 mixes, both ways)
        r, k, v, g, output  2 · h · a · 5
        decay               2 · 64 · (h + a)         (rank-64 data-dependent decay)
        WKV recurrence      2 · 2 · a · n            (read the n × n state per head, update it)
        channel-mix         2 · h · (2 f + h)

A mixture-of-experts layer (every `moe_expert_interval`-th) counts the `k` experts each token
runs (tokens dropped over capacity are still counted) and its router, not all `E` experts.

Causal attention is counted in full (the whole `s × s` score matrix, k = s), as Megatron,
GPT-NeoX and PaLM's MFU do and as `torch.utils.flop_counter` counts both explicit-softmax
attention and `scaled_dot_product_attention`; it is not halved for the causal mask. With a
sliding window (`sliding_window_width` W) the math needs at most W + 1 keys per query (itself
and the W before it), so k = min(s, W + 1): the window's band, by the same rule (the causal
triangle at the start of the sequence is not subtracted, as it is not for full attention).
These are model FLOPs, what the math needs: our backends compute the whole `s × s` score
matrix and mask it (so a FLOP counter over them sees `s`), a flash kernel with a window does
not, and MFU must not depend on which ran. A Mistral-7B shape at 32k tokens with W = 4096
would otherwise be overstated about 1.9×. Tied or untied heads cost the same; embedding
lookups, norms, rotary/ALiBi, activations and the loss are not matmuls and are not counted.

A training step costs 3× the forward (backward = 2× forward). Activation recomputation is not
counted: these are model FLOPs, not hardware FLOPs (PaLM's definition of MFU), so MFU is
comparable between runs with and without checkpointing.

What a step counts, for every objective (`step_work`, the one definition behind the start-up
report, the run summary and the logged `tokens_per_sec`, `tflops_per_gpu` and `mfu`):

    tokens    the tokens of the sequences the policy trains on, `seq_length` each (padding
              included): `train_batch_size` sequences (`normal`, `kto`), or twice that for the
              pairwise objectives (`dpo`, `rm`: a sample is a chosen and a rejected sequence)
    FLOPs     tokens × (3 × forward of the policy
                        + 1 × forward of the frozen reference model, when one runs: DPO and
                          KTO, a quarter of such a step; none with reference log-probabilities
                          read from the data, `precompute_model_name`, or `dpo_reference_free`)

so tokens/s is tokens / time, TFLOP/s is FLOPs / time / devices and MFU is TFLOP/s / peak:
every forward and backward the step ran, the reference's included, none twice.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from megatron.model.activations import build_activation
from megatron.model.args import ModelArgs
from megatron.model.gmlp import GMLP_FF_MULT, is_gmlp_layer
from megatron.model.mamba import D_STATE, mamba_dt_rank, mamba_inner_size
from megatron.model.mlp import mlp_inner_size
from megatron.model.moe import is_moe_layer
from megatron.model.rwkv import DECAY_RANK, MIX_RANK, rwkv_widths

# Dense (no 2:4 sparsity) peak TFLOP/s per device by matmul precision: bf16/fp16 tensor
# cores, TF32 tensor cores, and IEEE fp32. Matched against torch.cuda.get_device_name() in this
# order (first match wins). None: the device has no such path (V100 bf16) or no published
# figure we trust; MFU is then omitted.
PEAK_TFLOPS: list[tuple[str, dict[str, float | None]]] = [
    ("H200", {"bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0}),
    ("H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.0}),
    ("H100", {"bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0}),
    ("GH200", {"bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0}),
    ("B200", {"bf16": 2250.0, "fp16": 2250.0, "tf32": 1100.0, "fp32": 80.0}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    ("A800", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    ("A10G", {"bf16": 70.0, "fp16": 70.0, "tf32": 35.0, "fp32": None}),
    ("L40S", {"bf16": 362.0, "fp16": 362.0, "tf32": 183.0, "fp32": 91.6}),
    ("L4", {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    ("A6000", {"bf16": 155.0, "fp16": 155.0, "tf32": 77.0, "fp32": 38.7}),
    ("V100", {"bf16": None, "fp16": 125.0, "tf32": None, "fp32": 15.7}),
    ("MI300X", {"bf16": 1307.0, "fp16": 1307.0, "tf32": 654.0, "fp32": 163.0}),
    ("MI250X", {"bf16": 383.0, "fp16": 383.0, "tf32": 95.7, "fp32": 95.7}),
]


@dataclass(frozen=True)
class ModelShape:
    """The matmul widths of a built model (derived from its `ModelArgs`, never set apart)."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    seq_length: int
    vocab_size: int
    """Rows of the output head: the padded vocabulary (1 for a reward model's value head)."""
    mlp_inner_size: int
    """Inner width of one MLP branch, as `megatron/model/mlp.py` builds it."""
    gated_mlp: bool
    moe_layers: int = 0
    """Layers whose MLP is a mixture of experts."""
    moe_num_experts: int = 1
    moe_top_k: int = 1
    gated_experts: bool = False
    sliding_window: int | None = None
    """`sliding_window_width` W: each query attends to itself and the W keys before it."""
    mamba_layers: int = 0
    """`mamba` layers (a Mamba mixer in place of attention and MLP)."""
    mamba_inner_size: int = 0
    mamba_dt_rank: int = 0
    rwkv_layers: int = 0
    """Layers that are RWKV layers (`rwkv` in `attention_config`), not transformer layers."""
    rwkv_widths: tuple[int, int, int] = (0, 0, 0)
    """Their `(dim_att, head_size, ffn_dim)`."""
    gmlp_layers: int = 0
    """gMLP blocks (`gmlp` and `amlp` layers), which have no attention and no MLP."""
    amlp_layers: int = 0
    """Those of them with aMLP's tiny attention of `gmlp_attn_dim`."""
    gmlp_attn_dim: int = 0

    @property
    def attended_keys(self) -> int:
        """Keys each query's attention is counted over: the sequence, or the window."""
        if self.sliding_window is None:
            return self.seq_length
        return min(self.seq_length, self.sliding_window + 1)

    @classmethod
    def from_args(cls, args: ModelArgs) -> ModelShape:
        """The shape of the model `build_gpt(args)` builds."""
        return cls(
            num_layers=args.num_layers,
            hidden_size=args.hidden_size,
            num_attention_heads=args.num_attention_heads,
            num_kv_heads=args.kv_heads,
            head_dim=args.head_dim,
            seq_length=args.seq_length,
            vocab_size=1 if args.value_head else args.vocab_size,
            mlp_inner_size=mlp_inner_size(args),
            gated_mlp=build_activation(args.activation).gated,
            moe_layers=sum(is_moe_layer(args, i) for i in range(args.num_layers)),
            moe_num_experts=args.moe_num_experts,
            moe_top_k=args.moe_top_k,
            gated_experts=build_activation(args.activation).gated or args.moe_glu,
            sliding_window=args.sliding_window_width,
            mamba_layers=sum(args.attention_type(i) == "mamba" for i in range(args.num_layers)),
            mamba_inner_size=mamba_inner_size(args),
            mamba_dt_rank=mamba_dt_rank(args),
            rwkv_layers=sum(args.attention_type(i) == "rwkv" for i in range(args.num_layers)),
            rwkv_widths=rwkv_widths(args) if "rwkv" in args.layer_attention_types else (0, 0, 0),
            gmlp_layers=sum(is_gmlp_layer(args, i) for i in range(args.num_layers)),
            amlp_layers=sum(args.attention_type(i) == "amlp" for i in range(args.num_layers)),
            gmlp_attn_dim=args.gmlp_attn_dim,
        )


def shape_from_config(cfg) -> ModelShape:
    """The shape of the model a resolved config builds (its padded vocabulary included)."""
    return ModelShape.from_args(ModelArgs.from_config(cfg))


def forward_flops_per_token(shape: ModelShape) -> float:
    """Forward-pass matmul FLOPs per token (see the module docstring)."""
    h, keys, d = shape.hidden_size, shape.attended_keys, shape.head_dim
    q_width, kv_width = shape.num_attention_heads * d, shape.num_kv_heads * d
    qkv = 2 * h * (q_width + 2 * kv_width)
    attention = 2 * 2 * keys * q_width  # q k^T and probs v: each query against `keys` keys
    dense = 2 * q_width * h
    mlp = 2 * h * shape.mlp_inner_size * (3 if shape.gated_mlp else 2)
    expert = 2 * h * shape.mlp_inner_size * (3 if shape.gated_experts else 2)
    moe = shape.moe_top_k * expert + 2 * h * shape.moe_num_experts
    logits = 2 * h * shape.vocab_size
    di, r = shape.mamba_inner_size, shape.mamba_dt_rank
    mamba = 2 * h * 2 * di + 2 * di * (r + 2 * D_STATE) + 2 * r * di + 2 * di * h
    blocks = shape.mamba_layers + shape.rwkv_layers + shape.gmlp_layers
    transformer_layers = shape.num_layers - blocks
    dense_layers = transformer_layers - shape.moe_layers
    per_layer = qkv + attention + dense
    return float(
        transformer_layers * per_layer
        + dense_layers * mlp
        + shape.moe_layers * moe
        + shape.mamba_layers * mamba
        + shape.rwkv_layers * _rwkv_layer_flops(shape)
        + _gmlp_flops(shape)
        + logits
    )


def _rwkv_layer_flops(shape: ModelShape) -> float:
    """Forward matmul FLOPs per token of one RWKV layer (the module docstring's table)."""
    h, (a, n, f) = shape.hidden_size, shape.rwkv_widths
    mixes = 2 * 2 * h * 5 * MIX_RANK
    projections = 2 * h * a * 5
    decay = 2 * DECAY_RANK * (h + a)
    wkv = 2 * 2 * a * n
    channel_mix = 2 * h * (2 * f + h)
    return mixes + projections + decay + wkv + channel_mix


def _gmlp_flops(shape: ModelShape) -> int:
    """Forward FLOPs per token of the gMLP and aMLP layers (see the module docstring)."""
    h, s, a = shape.hidden_size, shape.seq_length, shape.gmlp_attn_dim
    f = GMLP_FF_MULT * h
    gmlp = 2 * h * 2 * f + 2 * f * h + 2 * s * f
    tiny_attention = 2 * 2 * f * 3 * a + 2 * 2 * s * a + 2 * a * f
    return shape.gmlp_layers * gmlp + shape.amlp_layers * tiny_attention


def training_flops_per_token(shape: ModelShape) -> float:
    """Forward + backward: 3 × the forward FLOPs."""
    return 3.0 * forward_flops_per_token(shape)


@dataclass(frozen=True)
class StepWork:
    """What one training step runs (module docstring: "What a step counts")."""

    samples: int
    """Samples per step: `train_batch_size`."""
    sequences_per_sample: int
    """2 for a pairwise objective (chosen and rejected), else 1."""
    seq_length: int
    training_flops_per_token: float
    """The policy's forward and backward."""
    reference_flops_per_token: float = 0.0
    """The frozen reference model's forward over the same tokens (0: none runs)."""

    @property
    def tokens(self) -> int:
        """Tokens the policy trains on per step."""
        return self.samples * self.sequences_per_sample * self.seq_length

    @property
    def flops_per_token(self) -> float:
        """Everything the step runs, per token trained on."""
        return self.training_flops_per_token + self.reference_flops_per_token

    @property
    def flops(self) -> float:
        return self.tokens * self.flops_per_token


def step_work(cfg, objective=None, seq_length: int | None = None) -> StepWork:
    """The work of one step of `cfg`'s run under `objective` (`megatron/training/objectives/`;
    None: the language model), at `seq_length` tokens per sequence (default: the config's; a
    sequence-length curriculum trains on fewer)."""
    shape = shape_from_config(cfg)
    if seq_length is not None:
        shape = replace(shape, seq_length=seq_length)
    reference = objective is not None and objective.needs_reference  # a reference model runs
    return StepWork(
        samples=cfg.training.train_batch_size,
        sequences_per_sample=2 if objective is not None and objective.pairwise else 1,
        seq_length=shape.seq_length,
        training_flops_per_token=training_flops_per_token(shape),
        reference_flops_per_token=forward_flops_per_token(shape) if reference else 0.0,
    )


def matmul_precision(dtype: str) -> str:
    """The precision fp32 matmuls really run at: `tf32` when torch allows TF32 tensor cores
    (`torch.backends.cuda.matmul.allow_tf32`, off by default), else `fp32`; bf16/fp16 as is."""
    if dtype != "fp32":
        return dtype
    return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32"


def peak_tflops(dtype: str, override: float | None = None, device_name: str | None = None):
    """Peak dense TFLOP/s of one device for training in `dtype`: `override`
    (`peak_theoretical_tflops`), else the table's entry for the device name and the matmul
    precision (`matmul_precision`); None on CPU or an unknown device (MFU is then omitted)."""
    if override:
        return float(override)
    if device_name is None:
        if not torch.cuda.is_available():
            return None
        device_name = torch.cuda.get_device_name()
    for pattern, peaks in PEAK_TFLOPS:
        if pattern in device_name:
            return peaks.get(matmul_precision(dtype))
    return None


def peak_description(dtype: str, override: float | None = None, device_name: str | None = None):
    """Which peak MFU is computed against and where it comes from, for the start-up report."""
    if device_name is None and not override:
        device_name = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    peak = peak_tflops(dtype, override, device_name)
    if override:
        return f"MFU against {peak:g} TFLOP/s per device (peak_theoretical_tflops)"
    if peak is None:
        return (
            f"MFU not reported: no known {matmul_precision(dtype)} peak for {device_name} "
            "(set peak_theoretical_tflops)"
        )
    return (
        f"MFU against {peak:g} TFLOP/s per device ({device_name}, dense {matmul_precision(dtype)})"
    )


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
