"""Model architecture settings (`cfg.model`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from megatron.config.schema import derived

LOSS_CHUNK_TOKENS_MAX = 1024
"""The fused head's chunk (`loss_chunk_tokens`) where the vocabulary allows: at a 50k vocabulary
one chunk's fp32 logits are 206 MB (a 16k-token micro-batch's are 3.3 GB), and the chunk's
matrix multiplies (1024 × h × V/tp) are large enough to run at the matmul's full speed on a
CPU or a GPU."""
LOSS_CHUNK_LOGITS_BYTES = 256 * 2**20  # one chunk's fp32 logits at most, for the auto size


def auto_loss_chunk_tokens(padded_vocab_size: int, tp: int) -> int:
    """`loss_chunk_tokens: null`'s size: the largest power of two up to `LOSS_CHUNK_TOKENS_MAX`
    whose fp32 chunk of logits (tokens × padded vocabulary / tp × 4 bytes) fits in
    `LOSS_CHUNK_LOGITS_BYTES`, and at least 128 tokens."""
    chunk = LOSS_CHUNK_TOKENS_MAX
    while chunk > 128 and chunk * (padded_vocab_size // tp) * 4 > LOSS_CHUNK_LOGITS_BYTES:
        chunk //= 2
    return chunk


def pipeline_bf16(cfg) -> bool:
    """bf16 on DeepSpeed's pipeline engine, where the fused head and loss is off: there
    DeepSpeed's `BF16_Optimizer` never updated the head's weight from the gradient the fused
    loss hands back (the step's gradient norm lacked it and the weight stayed as initialised,
    tied or untied, ZeRO 0 or 1). The loss hands it straight to the parameter, which autograd
    accumulates first; on that engine the hooks DeepSpeed's forward puts on the model's outputs
    run later and start the optimizer's backward prologue, which clears the parameters'
    gradients. The plain engine's bf16 optimizers (`tests/unit/training/
    test_bf16_engines_agree.py`) and fp32 on both engines keep it."""
    return cfg.precision.dtype == "bf16" and bool(cfg.parallel.pipe_parallel_size)


InitMethod = Literal[
    "normal",
    "scaled_normal",
    "orthogonal",
    "scaled_orthogonal",
    "xavier_uniform",
    "xavier_normal",
    "wang_init",
    "small_init",
    "single_residual_scaled_normal",
]


@dataclass(frozen=True)
class ModelConfig:
    num_layers: int | None = None
    """Number of transformer layers."""

    hidden_size: int | None = None
    """Transformer hidden size (width of the residual stream)."""

    num_attention_heads: int | None = None
    """Number of attention (query) heads."""

    num_kv_heads: int | None = None
    """Number of key/value heads for grouped-query attention; null means one per query head."""

    head_dim: int | None = None
    """Width of each attention head; null means `hidden_size / num_attention_heads`. Set it
    where the heads are not a split of the hidden size (Qwen3, Gemma): the query/key/value
    projections are then `heads × head_dim` wide."""

    seq_length: int | None = None
    """Training sequence length in tokens."""

    sliding_window_width: int | None = None
    """Sliding-window attention (Mistral): each token attends to itself and the
    `sliding_window_width` tokens before it (GPT-NeoX's definition; Hugging Face's
    `sliding_window` counts the token itself, so it is this + 1). Null: full causal attention.
    Applies to every layer, every attention backend and cached generation."""

    max_position_embeddings: int | None = None
    """Largest position the positional encoding supports; defaults to `seq_length`."""

    norm: Literal["layernorm", "rmsnorm", "scalenorm", "non_parametric_layernorm"] = "layernorm"
    """Normalisation layer."""

    layernorm_epsilon: float = 1.0e-5
    """Epsilon of layernorm."""

    rms_norm_epsilon: float = 1.0e-8
    """Epsilon of rmsnorm."""

    scalenorm_epsilon: float = 1.0e-8
    """Epsilon of scalenorm."""

    pos_emb: Literal["learned", "rotary", "sinusoidal", "rpe", "alibi", "none"] = "learned"
    """Positional encoding. `rpe`: T5's relative position bias, a learned per-head table of
    `rpe_num_buckets` distance buckets added to every attention layer's scores."""

    rpe_num_buckets: int = 32
    """`pos_emb: rpe`: number of relative-distance buckets (half of them exact distances)."""

    rpe_max_distance: int = 128
    """`pos_emb: rpe`: distance from which on all keys share the last bucket."""

    rotary_pct: float = 1.0
    """Fraction of each head's dimensions that rotary embeddings rotate (0 < pct <= 1)."""

    rotary_emb_base: int = 10000
    """Base of the rotary embedding frequencies."""

    rope_scaling: dict[str, Any] | None = None
    """RoPE scaling, as Hugging Face transformers' `rope_parameters` define it: `rope_type`
    `linear`, `dynamic` (NTK, from `max_position_embeddings` on), `yarn` or `llama3` with that
    rule's fields, e.g. `{rope_type: yarn, factor: 4.0, original_max_position_embeddings: 2048}`
    (`megatron/config/groups/rope_scaling.py` lists them). Null: unscaled."""

    no_weight_tying: bool = False
    """Untie the input embedding and the output head (separate weights)."""

    gpt_j_residual: bool = False
    """Parallel residual (GPT-J/NeoX): attention and MLP read the same input and are summed."""

    gpt_j_tied: bool = False
    """With `gpt_j_residual`, use one shared norm for attention and MLP."""

    activation: Literal[
        "gelu", "gelu_tanh", "geglu", "swiglu", "silu", "relu", "reglu", "relu_squared"
    ] = "gelu"
    """MLP activation; the gated variants (geglu, swiglu, reglu) use two input projections.
    `gelu` is exact (erf) GeLU, `gelu_tanh` its tanh approximation (what GPT-NeoX's
    `bias_gelu_fusion: true` computes, and maps to)."""

    intermediate_size: int | None = None
    """MLP size as GPT-NeoX defines it (default 4 × hidden, written as the number into a
    checkpoint's config.json unless a `mamba` or `rwkv` layer reads an unset value). Gated
    activations (geglu, swiglu, reglu) use 2/3 of it for their two input projections: each
    branch is `int(2/3 × size) // 2` wide, so GPT-NeoX's Llama-7B value 32768 gives Llama's
    11008."""

    mlp_multiple_of: int = 1
    """Round the MLP inner width up to a multiple of this (Llama uses 256)."""

    init_method: InitMethod = "normal"
    """Initialisation of the input projections and embeddings."""

    output_layer_init_method: InitMethod = "scaled_normal"
    """Initialisation of the layers that write into the residual stream."""

    init_method_std: float = 0.02
    """Standard deviation of the normal initialisations."""

    use_bias_in_norms: bool = True
    """Norm layers carry a bias."""

    use_bias_in_attn_linear: bool = True
    """Attention projections carry biases."""

    use_bias_in_qkv: bool = False
    """Give the query/key/value projection a bias even with `use_bias_in_attn_linear: false`
    (Qwen2: biased q/k/v, unbiased output projection)."""

    use_bias_in_mlp: bool = True
    """MLP projections carry biases."""

    hidden_dropout: float = 0.0
    """Dropout on the outputs of attention and MLP."""

    attention_dropout: float = 0.0
    """Dropout on attention probabilities."""

    attention_config: list[Any] | None = None
    """Attention type per layer as GPT-NeoX writes it, e.g. `[[["global"], 12]]`. Types:
    `global` (masked softmax; fused kernel when `scaled_upper_triang_masked_softmax_fusion`),
    `flash` or `sdpa` (torch scaled_dot_product_attention), `mamba` (a Mamba block in place of
    the whole layer, `megatron/model/mamba.py`), `rwkv` (an RWKV-6 layer in place of the
    transformer layer: `megatron/model/rwkv.py`), `gmlp` (a gMLP block: a spatial gating unit
    in place of attention and MLP) and `amlp` (gMLP with a tiny single-head attention of
    `gmlp_attn_dim`). Default: all `global`."""

    dim_att: int | None = None
    """Width of the time-mix (attention) projections of `rwkv` layers; null means
    `hidden_size`. Split into `num_attention_heads` heads."""

    head_size: int | None = None
    """Head width of `rwkv` layers: always `dim_att / num_attention_heads` (GPT-NeoX computes
    it); a value given must equal that."""

    ffn_dim: int | None = None
    """Key width of the channel-mix (MLP) of `rwkv` layers; null means `intermediate_size`, else
    3.5 × `hidden_size`, rounded down to a multiple of 32 (GPT-NeoX's rule)."""

    gmlp_attn_dim: int = 64
    """Width of the single-head attention of `amlp` layers."""

    scaled_upper_triang_masked_softmax_fusion: bool = False
    """Use the fused CUDA causal scale-mask-softmax kernel where it applies."""

    scaled_masked_softmax_fusion: bool = False
    """Use the fused CUDA scale-mask-softmax kernel for explicit masks where it applies."""

    rope_fusion: bool = False
    """Use the fused CUDA rotary embedding kernel where it applies."""

    attention_softmax_in_fp32: bool = False
    """Compute the attention softmax in fp32 when training in fp16/bf16."""

    apply_query_key_layer_scaling: bool = False
    """Scale attention scores down by the layer number before softmax (fp16 stability)."""

    use_qk_layernorm: bool = False
    """Normalise queries and keys before the dot product: the configured `norm` over each
    head's `head_dim` dims, one weight for all query heads and one for all key heads, before
    the rotary embedding (with `norm: rmsnorm`, Qwen3's `q_norm`/`k_norm`)."""

    z_loss: float = 0.0
    """Coefficient of the z-loss (PaLM): adds `z_loss × mean(logsumexp(logits)²)` over the
    tokens the loss counts (the same loss-mask average as the cross entropy). 0: off. With
    `train_impl: rm` it is GPT-NeoX's reward penalty instead, `z_loss × mean(r_chosen² +
    r_rejected²)` (`megatron/training/objectives/rm.py`)."""

    loss_chunk_tokens: int | None = None
    """Compute the output head and the language-model loss together, this many tokens at a
    time, so that no tokens × vocabulary logits tensor is ever written: each chunk's logits,
    its cross entropy (and z-loss) and at once its gradient of the hidden states and of the
    head weight, then the next chunk (`megatron/parallel/chunked_cross_entropy.py`). The same
    loss and gradients as the full logits, and the head's FLOPs are the unfused head's; memory
    drops by the logits, their fp32 softmax and their gradient (tokens × padded vocabulary / tp
    each). null (the default): on, with `auto_loss_chunk_tokens`'s size, 1024 tokens or fewer
    so that one chunk's fp32 logits stay within 256 MiB (1024 at GPT-2's 50k vocabulary, 256 at
    Qwen3's 152k on one tensor-parallel rank); off for `train_impl: rm`, which ends in a value
    head, and for bf16 on the pipeline engine (`pipeline_bf16`), which refuses a value > 0. 0:
    off, the head writes the full logits and the loss reads them
    (`megatron/parallel/cross_entropy.py`). DPO and KTO take their log-probabilities (policy
    and reference) the same way, their backward recomputing each chunk's logits (one more head
    matmul). In fp16 the language-model loss makes the logits' gradient in the forward, before
    the loss scale: each chunk's is lifted by a power of two into fp16's range for the fp16
    matmuls, and both gradients are held in fp32 until the loss scale multiplies them (the
    hidden states' adds tokens × h × 2 bytes over an fp16 one), so an overflow reaches the
    dynamic loss scaler as on the unfused path. Under ZeRO stage 3 the loss gathers the head's
    partitioned weight itself. `train_impl: rm` refuses a value > 0. Evaluation losses take the
    same path; generation and the other tools write logits."""

    checkpoint_activations: bool = False
    """Recompute activations in the backward pass (activation checkpointing)."""

    checkpoint_num_layers: int = 1
    """Transformer layers per activation checkpoint."""

    partition_activations: bool = False
    """Shard checkpointed activations across tensor-parallel ranks."""

    contiguous_checkpointing: bool = False
    """Copy checkpointed activations into contiguous memory."""

    checkpoint_in_cpu: bool = False
    """Move checkpointed activations to CPU memory."""

    synchronize_each_layer: bool = False
    """Synchronise the whole device at the start and end of each checkpointed layer's forward
    and backward (4 waits per checkpoint per micro-batch). Cannot change a result; warned
    about when on (`checks/device_syncs.py`)."""

    profile_backward: bool = False
    """Time the backward pass of checkpointed layers."""

    mamba_selective_scan_fusion: bool = False
    """`mamba` layers: run the selective scan with `mamba-ssm`'s CUDA kernel (the same
    function as the PyTorch reference scan used otherwise, and on CPU). Needs `mamba-ssm`."""

    mamba_causal_conv_fusion: bool = False
    """`mamba` layers: run the causal convolution with `causal-conv1d`'s CUDA kernel (the same
    function as the PyTorch convolution used otherwise). Needs `causal-conv1d`."""

    mamba_inner_func_fusion: bool = False
    """`mamba` layers: run the whole mixer after `in_proj` with `mamba-ssm`'s fused
    `mamba_inner_fn` on CUDA (supersedes the two switches above; the same function). Needs
    `mamba-ssm` and `causal-conv1d`; cannot be combined with `mamba_use_bias_in_linears`."""

    mamba_selective_fp32_params: bool = True
    """`mamba` layers: keep `A_log` and `D`, their gradients and optimizer state in fp32 inside
    an fp16/bf16 run (GPT-NeoX's default), as optimizer groups of their own; dt_proj's bias is
    cast to the run's dtype, as in GPT-NeoX. Not with ZeRO offload or a `grad_accum_dtype` of
    another dtype. False: they train in the run's dtype (the scan still reads them in fp32)."""

    mamba_use_bias_in_conv: bool = True
    """`mamba` layers: the depthwise causal convolution has a bias."""

    mamba_use_bias_in_linears: bool = False
    """`mamba` layers: `in_proj`, `x_proj` and `out_proj` have biases (`dt_proj` always has
    one)."""

    padded_vocab_size: int | None = derived()
    """Vocabulary size padded to a multiple of `make_vocab_size_divisible_by` × tensor-parallel
    size (derived from the tokenizer); a resumed run keeps its checkpoint's padded size when
    the tensor-parallel size divides it (`megatron/training/setup/resume_vocab.py`)."""

    true_vocab_size: int | None = derived()
    """The tokenizer's vocabulary size (derived). The rows from it up to `padded_vocab_size`
    are padding: their logits are masked out of the loss, its gradient, evaluation and
    sampling, so the loss does not depend on the padding (GPT-NeoX lets them take probability
    mass)."""

    layer_attention_types: tuple[str, ...] = derived(())
    """Attention type of each layer, expanded from `attention_config` (derived)."""


def mlp_size(intermediate_size: int | None, hidden_size: int) -> int:
    """`intermediate_size` as GPT-NeoX resolves it: 4 × hidden when unset."""
    return intermediate_size or 4 * hidden_size


# Layer types for which an unset `intermediate_size` means another width than 4 × hidden
# (Mamba's inner width 2 × hidden, RWKV's channel-mix 3.5 × hidden): the key stays unset there.
OWN_WIDTH_LAYERS = ("mamba", "rwkv")


def recorded_intermediate_size(model: dict) -> int | None:
    """`intermediate_size` as a checkpoint's `config.json` records it, from the flat model keys:
    the number when unset (GPT-NeoX's converter builds its Hugging Face config from it),
    except beside layers that read an unset value otherwise (`OWN_WIDTH_LAYERS`)."""
    size, hidden = model.get("intermediate_size"), model.get("hidden_size")
    types = model.get("layer_attention_types") or ()
    if size is not None or not hidden or set(types) & set(OWN_WIDTH_LAYERS):
        return size
    return mlp_size(None, hidden)


BLOCK_LAYER_TYPES = ("mamba", "rwkv", "gmlp", "amlp")
"""`attention_config` types whose layer replaces a whole transformer layer, attention and MLP
(`megatron/model/specs.py::BLOCK_LAYERS` builds them)."""


def rwkv_ffn_dim(ffn_dim: int | None, intermediate_size: int | None, hidden_size: int) -> int:
    """The channel-mix width of `rwkv` layers: `ffn_dim`, else `intermediate_size` or 3.5 ×
    `hidden_size` rounded down to a multiple of 32 (GPT-NeoX's rule)."""
    return ffn_dim or (intermediate_size or int(3.5 * hidden_size)) // 32 * 32


def heads_split_hidden(layer_types: tuple[str, ...] | list[str]) -> bool:
    """Whether `num_attention_heads` must divide `hidden_size`: not when every layer is a
    `mamba` layer (no attention; GPT-NeoX's Mamba configs say 12 heads at hidden 1024)."""
    return not layer_types or set(layer_types) != {"mamba"}
