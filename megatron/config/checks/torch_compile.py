"""What `torch_compile` cannot be combined with, refused at resolution with the reason.

`torch_compile` (training group) compiles each transformer layer with `torch.compile`
(`megatron/model/gpt.py::compile_transformer_layers`). Two things inside or around a layer
defeat it, and each is refused here rather than left to run differently from what the config says:

- dropout: every dropout draws from the tensor-parallel RNG tracker, which swaps generator
  states around the call; Dynamo cannot trace a generator's `set_state` (a graph break at
  every dropout), and inside a graph inductor draws its own random numbers, so the masks
  would not be the eager run's;
- the fused CUDA kernels (`torch.ops.megatron_fused_softmax`, `torch.ops.megatron_fused_rotary`)
  have no fake-tensor implementation, so Dynamo cannot trace them; inductor fuses the softmax
  and the rotation itself. The same holds for Mamba's `mamba-ssm`/`causal-conv1d` kernels
  (`MAMBA_FUSION_KEYS`).

ZeRO stage 3 is allowed: DeepSpeed excludes its parameter-gathering hooks from compilation
(`torch.compiler.disable`), which splits each layer's graph at every sub-module, but the
losses are the eager run's (`tests/parallel/test_train_compiled.py`).

One combination depends on the machine, so the worker refuses it when it builds the model
(`validate_torch_compile_device`): bf16 on a CPU, where inductor's C++ backend (torch 2.13)
writes code that does not compile for our layers' backward (a bf16 reduction stored to two
outputs declares its variable twice: "conflicting declaration 'auto at_BFloat16_tmp_acc0_vec'").
"""

from __future__ import annotations

from megatron.config.config import Config
from megatron.config.schema import ConfigError
from megatron.config.schema import set_in as _src

HOW = "set torch_compile: false, or"
MAMBA_FUSION_KEYS = (
    "mamba_selective_scan_fusion",
    "mamba_causal_conv_fusion",
    "mamba_inner_func_fusion",
)


def _fused_kernels_in_use(cfg: Config) -> list[str]:
    """The fusion keys that select a fused kernel somewhere in this model."""
    m = cfg.model
    types = m.layer_attention_types or ("global",)  # empty: every layer is `global`
    keys = []
    if "global" in types:
        keys += [
            k
            for k in ("scaled_upper_triang_masked_softmax_fusion", "scaled_masked_softmax_fusion")
            if getattr(m, k)
        ]
    if m.rope_fusion and m.pos_emb == "rotary":
        keys.append("rope_fusion")
    if "mamba" in types:
        keys += [k for k in MAMBA_FUSION_KEYS if getattr(m, k)]
    return keys


def validate_torch_compile(cfg: Config, sources: dict[str, str]) -> None:
    """Refuse `torch_compile: true` with what it cannot compile (see the module docstring)."""
    if not cfg.training.torch_compile:
        return
    where = _src(sources, "torch_compile")
    m = cfg.model
    dropout = [k for k in ("hidden_dropout", "attention_dropout") if getattr(m, k) > 0]
    if dropout:
        values = ", ".join(f"{k} {getattr(m, k)}" for k in dropout)
        raise ConfigError(
            f"torch_compile{where} cannot be combined with dropout ({values}"
            f"{_src(sources, *dropout)}): dropout draws from the tensor-parallel RNG tracker, "
            "whose generator state swaps torch.compile cannot trace, and compiled code draws "
            f"other random numbers than eager; {HOW} set {' and '.join(dropout)} to 0"
        )
    fused = _fused_kernels_in_use(cfg)
    if fused:
        raise ConfigError(
            f"torch_compile{where} cannot compile the fused CUDA kernels selected by "
            f"{', '.join(fused)}{_src(sources, *fused)} (custom operators without a fake-tensor "
            f"implementation; inductor fuses the softmax and rotary embedding itself); {HOW} "
            f"set {' and '.join(fused)} to false"
        )


def validate_torch_compile_device(cfg: Config, on_gpu: bool) -> None:
    """Refuse `torch_compile: true` in bf16 on a CPU (see the module docstring)."""
    if cfg.training.torch_compile and cfg.precision.dtype == "bf16" and not on_gpu:
        raise ConfigError(
            "torch_compile with bf16 precision cannot run on a CPU: torch.compile's C++ backend "
            "generates code for the layers' bf16 backward that does not compile (inductor's "
            f"CPU code generation); {HOW} train in fp32 on the CPU, or use a GPU"
        )
