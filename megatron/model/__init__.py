"""The GPT model: Megatron tensor-parallel layers as DeepSpeed pipeline stages.

Reading order (each file one concern): `args` (the settings) -> `init_methods`, `norms`,
`activations`, `positional` -> `attention_backends` -> `attention`, `mlp` -> `transformer`
-> `embedding`, `head` -> `specs` (the layer list and parameter names) -> `loss` -> `gpt`
(`build_model`). Around it: `counting` (parameter counts), `weights` (full state dicts),
`hf_names` (the Hugging Face rename table), `hf_config` and `hf_families` (Mistral, Qwen2,
Qwen3).

Contract for the training loop:

    model = build_model(cfg, topology)      # PipelineModule if pipe_parallel_size >= 1,
                                            # else GPTModel (plain nn.Module)
    # pipeline engine batches: ((tokens, position_ids), (labels, loss_mask))
    # plain: logits = model(tokens, position_ids); loss = model.loss_fn(logits, (labels, mask))
    count_parameters(cfg)                   # analytic, for the start-up report
    count_model_parameters(model, topology) # what was built (collective over tp x pp)
"""

from megatron.model.args import ModelArgs
from megatron.model.counting import (
    count_model_parameters,
    count_parameters,
    layer_parameters,
    owned_parameters,
    parameter_breakdown,
)
from megatron.model.gpt import (
    PIPELINE_SP_CONFIG,
    GPTModel,
    build_gpt,
    build_model,
    compile_transformer_layers,
    configure_activation_checkpointing,
    pipeline_config_for,
)
from megatron.model.hf_config import hf_config
from megatron.model.hf_families import family_of  # registers Mistral, Qwen2, Qwen3
from megatron.model.hf_mamba import is_mamba_model  # registers Mamba
from megatron.model.hf_mixtral import fuse_stored_experts  # registers Mixtral
from megatron.model.hf_names import HF_ARCHITECTURES, from_hf, fuse_qkv, name_map, split_qkv, to_hf
from megatron.model.loss import loss_fn
from megatron.model.specs import gpt_layer_specs, layer_index, layer_prefix
from megatron.model.weights import full_state_dict, load_full_state_dict

__all__ = [
    "HF_ARCHITECTURES",
    "PIPELINE_SP_CONFIG",
    "GPTModel",
    "ModelArgs",
    "build_gpt",
    "build_model",
    "compile_transformer_layers",
    "configure_activation_checkpointing",
    "count_model_parameters",
    "count_parameters",
    "family_of",
    "fuse_stored_experts",
    "is_mamba_model",
    "from_hf",
    "full_state_dict",
    "fuse_qkv",
    "gpt_layer_specs",
    "hf_config",
    "layer_index",
    "layer_parameters",
    "layer_prefix",
    "load_full_state_dict",
    "loss_fn",
    "name_map",
    "owned_parameters",
    "parameter_breakdown",
    "pipeline_config_for",
    "split_qkv",
    "to_hf",
]
