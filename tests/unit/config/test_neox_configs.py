"""GPT-NeoX config files load unchanged and resolve to the values they say."""

from pathlib import Path

import pytest
import yaml

from megatron.config import deepspeed_config, load_config
from megatron.config.config import KEY_TO_GROUP
from megatron.config.ds_export import QUIET_STEPS_PER_PRINT
from megatron.config.neox.keys import NEOX_KEYS, RENAMED

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "data" / "configs"


def test_guide_example_loads_unchanged():
    warn: list[str] = []
    cfg = load_config([FIXTURES / "neox_guide_example.yml"], warn=warn)
    assert len(warn) == 1 and "'synchronize_each_layer'" in warn[0]  # its cost, warned
    assert cfg.parallel.pipe_parallel_size == 1 and cfg.parallel.model_parallel_size == 1
    m = cfg.model
    assert (m.num_layers, m.hidden_size, m.num_attention_heads) == (12, 768, 12)
    assert (m.seq_length, m.max_position_embeddings) == (2048, 2048)
    assert (m.norm, m.pos_emb, m.no_weight_tying) == ("rmsnorm", "none", True)
    assert m.checkpoint_activations and m.partition_activations and m.synchronize_each_layer
    assert cfg.optimizer.optimizer_type == "Adam" and cfg.optimizer.lr == 0.0006
    assert cfg.optimizer.optimizer_params == {"max_grad_norm": 1.0, "betas": [0.9, 0.95]}
    assert cfg.parallel.zero_optimization["allgather_partitions"] is True
    assert cfg.precision.dtype == "fp16"
    assert cfg.training.train_batch_size == 4 and cfg.training.gradient_accumulation_steps == 1
    assert (cfg.lr.lr_decay_style, cfg.lr.decay_iters, cfg.lr.warmup_iters) == (
        "cosine",
        320000,
        3200,
    )
    assert cfg.data.split == "949,50,1"
    assert cfg.checkpointing.keep_last_n_checkpoints == 4
    assert cfg.logging.wall_clock_breakdown is True
    ds = deepspeed_config(cfg)
    assert ds["fp16"] == {
        "enabled": True,
        "loss_scale": 0,
        "loss_scale_window": 1000,
        "hysteresis": 2,
        "min_loss_scale": 1,
    }
    assert ds["zero_optimization"]["stage"] == 0 and ds["gradient_clipping"] == 1.0
    assert ds["wall_clock_breakdown"] is True
    # DeepSpeed's progress print only with --verbose (the console has our iteration line)
    assert ds["steps_per_print"] == QUIET_STEPS_PER_PRINT
    assert deepspeed_config(cfg, verbose=True)["steps_per_print"] == 10


def test_pythia_style_neox_config():
    warn: list[str] = []
    cfg = load_config(
        [FIXTURES / "pythia-160m-neox.yml"], world_size=8, vocab_size=50277, warn=warn
    )
    # GPT-NeoX's default output layer split is accepted silently; its fused bias-GeLU is GeLU's
    # tanh approximation, so that is what the model computes.
    assert not any("output_layer_parallelism" in w for w in warn)
    assert cfg.unimplemented == {"output_layer_parallelism": "column", "bias_gelu_fusion": True}
    m = cfg.model
    assert m.activation == "gelu_tanh"
    assert (m.pos_emb, m.rotary_pct, m.gpt_j_residual) == ("rotary", 0.25, True)
    assert m.layer_attention_types == ("flash",) * 12
    assert m.padded_vocab_size == 50304
    assert cfg.parallel.data_parallel_size == 8 and cfg.training.train_batch_size == 256
    assert cfg.checkpointing.extra_save_iters[:3] == [0, 1, 2]
    assert cfg.tokenizer.tokenizer_type == "HFTokenizer"
    assert deepspeed_config(cfg)["fp16"]["initial_scale_power"] == 12
    # DeepSpeed's own fp16 section takes it (the file's `"fp16": true` inside is GPT-NeoX's)
    from deepspeed.runtime.precision_config import get_float16_config

    assert get_float16_config(deepspeed_config(cfg)).initial_scale_power == 12
    # Its overlap_comm, on the pipeline engine, which never overlaps the gradient reduction:
    # DeepSpeed's fp16 ZeRO 1 optimizer warned on every rank that it disabled it. Passed as off.
    assert cfg.parallel.zero_optimization["overlap_comm"] is True
    assert deepspeed_config(cfg)["zero_optimization"]["overlap_comm"] is False
    plain = cfg.replace(pipe_parallel_size=0)  # the plain engine overlaps it with the backward
    assert deepspeed_config(plain)["zero_optimization"]["overlap_comm"] is True


def test_fp16_section_with_a_type_trains_in_fp16_as_in_gpt_neox(tmp_path):
    """GPT-NeoX's pythia/1B.yml says `"type": "bfloat16"` inside its fp16 section; its
    DeepSpeed ignores the key and trains in fp16. So does a run here, saying so, and the
    section DeepSpeed gets is one DeepSpeed's own fp16 model accepts."""
    from deepspeed.runtime.precision_config import get_float16_config

    section = {"enabled": True, "type": "bfloat16", "auto_cast": True, "loss_scale": 0}
    path = tmp_path / "pythia-1b-fp16.yml"
    model = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32}
    path.write_text(yaml.safe_dump({**model, "fp16": section, "train_micro_batch_size_per_gpu": 1}))
    warn: list[str] = []
    cfg = load_config([path], world_size=1, vocab_size=50277, warn=warn)
    assert cfg.precision.dtype == "fp16"
    assert any("fp16.type 'bfloat16'" in w and "trains in fp16" in w for w in warn), warn
    fp16 = get_float16_config(deepspeed_config(cfg))
    assert fp16.enabled and fp16.auto_cast and fp16.loss_scale == 0


def test_bf16_section_with_fp16_loss_scaling_keys_passes_deepspeed():
    """GPT-NeoX's rwkv/170M.yml (kept unchanged as rwkv-170m-neox.yml) repeats `"bf16": true`
    and fp16's loss-scaling keys in its bf16 section; GPT-NeoX's DeepSpeed ignored them, and
    the section DeepSpeed 0.19 gets must be one its own bf16 model accepts."""
    from deepspeed.runtime.precision_config import get_bfloat16_config

    cfg = load_config([FIXTURES / "rwkv-170m-neox.yml"], world_size=1, vocab_size=50277, warn=[])
    assert cfg.precision.bf16["loss_scale_window"] == 1000  # the file's section, as written
    assert get_bfloat16_config(deepspeed_config(cfg)).enabled


def test_llama_style_neox_config():
    cfg = load_config([FIXTURES / "llama-7b-neox.yml"], world_size=2, vocab_size=32000, warn=[])
    m = cfg.model
    assert (m.norm, m.activation, m.num_kv_heads, m.rotary_pct) == ("rmsnorm", "swiglu", 8, 1.0)
    assert not (m.use_bias_in_attn_linear or m.use_bias_in_mlp or m.use_bias_in_norms)
    assert m.padded_vocab_size == 32000
    assert cfg.precision.dtype == "bf16" and cfg.tokenizer.vocab_file == "tokenizer.model"
    assert cfg.training.train_batch_size == 4 * 8 * 2


@pytest.mark.parametrize(
    "name", ["160M.yml", "small.yml", "llama-small.yml", "qwen3-small.yml", "llama-7B.yml"]
)
def test_shipped_configs_resolve(name):
    extra = [ROOT / "configs" / "local.yml"]
    world = 4 if name == "llama-7B.yml" else 1
    cfg = load_config(
        [ROOT / "configs" / name, *extra], world_size=world, vocab_size=50257, warn=[]
    )
    assert cfg.model.num_layers >= 1 and cfg.data.data_path.endswith("_text_document")


def test_bare_names_are_looked_up_under_configs():
    cfg = load_config(["160M", "local.yml"], world_size=1, vocab_size=50257, warn=[])
    assert cfg.model.hidden_size == 768 and cfg.config_files[0].endswith("configs/160M.yml")


# Every key the configuration guide and the foundation issue name must be known: either a
# field of a group, a renamed key, or accepted as unimplemented.
NEOX_VOCABULARY = """
pipe_parallel_size model_parallel_size num_layers hidden_size num_attention_heads num_kv_heads
seq_length max_position_embeddings norm pos_emb rotary_pct rotary_emb_base no_weight_tying
gpt_j_residual activation init_method output_layer_init_method
scaled_upper_triang_masked_softmax_fusion bias_gelu_fusion attention_config train_iters
train_epochs optimizer zero_optimization zero_allow_untested_optimizer train_batch_size
train_micro_batch_size_per_gpu gradient_accumulation_steps deepspeed_extra_args data_impl split
data_path train_data_paths valid_data_paths test_data_paths train_data_weights valid_data_weights
test_data_weights train_label_data_paths train_reward_data_paths pos_train_data_paths
neg_train_data_paths pos_train_label_data_paths vocab_file merge_file tokenizer_type save load
tensorboard_dir log_dir checkpoint_factor keep_last_n_checkpoints eval_interval eval_iters
lr_decay_iters lr_decay_style warmup min_lr checkpoint_activations checkpoint_num_layers
partition_activations synchronize_each_layer fp16 bf16 precision gradient_clipping weight_decay
hidden_dropout attention_dropout distributed_backend log_interval steps_per_print
wall_clock_breakdown launcher deepspeed_slurm deepspeed_mpi hostfile include exclude num_nodes
num_gpus master_port master_addr wandb_project wandb_group use_wandb seed
train_data_path valid_data_path test_data_path dataset_impl train_impl pack_impl dpo_beta
dpo_fp32 precompute_model_name text_gen_type train_label_data_path train_reward_data_path
pos_train_data_path neg_train_data_path
""".split()


def test_renamed_pairwise_key_is_read_as_the_list_key(tmp_path):
    path = tmp_path / "dpo.yml"
    path.write_text(
        (FIXTURES / "neox_guide_example.yml")
        .read_text()
        .replace(
            '"split": "949,50,1",',
            '"split": "949,50,1",\n"dataset_impl": "pairwise", "pack_impl": "unpacked",\n'
            '"pos_train_data_path": "d/pos", "neg_train_data_path": "d/neg",',
        )
    )
    warn: list[str] = []
    cfg = load_config([path], warn=warn)
    assert cfg.data.pos_train_data_paths == ["d/pos"] and cfg.data.neg_train_data_paths == ["d/neg"]
    assert "pos_train_data_paths" not in cfg.unimplemented
    assert any("now called 'pos_train_data_paths'" in w for w in warn)


def test_neox_vocabulary_is_covered():
    known = set(KEY_TO_GROUP) | set(RENAMED) | set(NEOX_KEYS)
    assert sorted(set(NEOX_VOCABULARY) - known) == []
