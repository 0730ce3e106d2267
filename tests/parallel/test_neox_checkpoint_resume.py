"""Training continues from a folder GPT-NeoX wrote (issue 27), through the product's engine and
`CheckpointIO.load`, on one gloo rank (pipeline engine, one stage).

The folder is written here as GPT-NeoX's tools lay it out, from GPT-NeoX's definitions, not
from our code: a `transformers` `GPTNeoXForCausalLM` (untied, parallel residual, partial
rotary) goes into the layer files as GPT-NeoX's HF-to-sequential converter shards it (layer
00 `word_embeddings.weight`; layers 2 .. L+1 the Hugging Face layer's own tensor names; L+3
`norm.weight`/`norm.bias`; L+4 `final_linear.weight`), beside the `mp_rank_00_model_states.pt`
a GPT-NeoX save leaves (DeepSpeed's entries with `module` None for the pipeline engine, its
`iteration`, `args` and `AnnealingLR.state_dict()`: `start_lr`, `warmup_iter`, `num_iters`,
`decay_style`, `end_iter`, `min_lr`) and no `trainer_state.pt`.

- `finetune: true`: the first training loss equals transformers' loss on the same batch
  (1e-6).
- A full resume takes the iteration, the RNG streams GPT-NeoX keeps in the engine-state file
  (the next draw of each is the one GPT-NeoX's load would give), the LR schedule and the Adam
  state, which GPT-NeoX
  numbers over its two parameter groups (`get_params_for_weight_decay_optimization`: every
  module's non-bias weights decayed; biases and the norms' parameters not; module order).
- GPT-NeoX with `weight_decay: 0` keeps one group; that state does not fit our two, and the
  resume is refused with the reason.
- A folder lacking a layer file, or in our old numbering (a layer 01 file), is refused naming
  the file, or the migration, not with DeepSpeed's bare assertion.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from tests.distributed import run_distributed

transformers = pytest.importorskip("transformers")

LAYERS, HIDDEN, HEADS, VOCAB, SEQ, MICRO = 2, 32, 4, 128, 16, 2
RNG_SEED = 4321
ITERATION, TRAIN_ITERS, WARMUP = 5, 20, 2
SCHEDULE = dict(start_lr=1.0e-3, warmup_iter=WARMUP, num_iters=ITERATION, decay_style="cosine",
                end_iter=TRAIN_ITERS, min_lr=1.0e-4)  # fmt: skip


def hf_model():
    config = transformers.GPTNeoXConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, intermediate_size=4 * HIDDEN, rotary_pct=0.25,
        rotary_emb_base=10000, max_position_embeddings=SEQ, use_parallel_residual=True,
        hidden_act="gelu", layer_norm_eps=1e-5, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.GPTNeoXForCausalLM(config).eval()
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():  # visible noise everywhere, norms around 1
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1.0 + 0.1 * noise if "norm" in name else 0.2 * noise)
    return model


def neox_layer_files(hf) -> dict[str, dict]:
    """GPT-NeoX's HF-to-sequential converter's layer files (module docstring), tp 1."""
    files = {"layer_00": {"word_embeddings.weight": hf.gpt_neox.embed_in.weight}}
    for i, layer in enumerate(hf.gpt_neox.layers):
        state = {k: v for k, v in layer.state_dict().items() if not k.endswith("attention.bias")}
        files[f"layer_{i + 2:02d}"] = state
    norm = hf.gpt_neox.final_layer_norm
    files[f"layer_{LAYERS + 3:02d}"] = {"norm.weight": norm.weight, "norm.bias": norm.bias}
    head = hf.get_output_embeddings()  # `embed_out` (`lm_head` in transformers 5)
    files[f"layer_{LAYERS + 4:02d}"] = {"final_linear.weight": head.weight}
    return {f"{k}-model_00-model_states.pt": {n: t.clone() for n, t in v.items()}
            for k, v in files.items()}  # fmt: skip


def neox_param_groups(module, weight_decay: float) -> list[list[str]]:
    """GPT-NeoX's optimizer groups over `module`'s parameters, by name (module docstring)."""
    decay, no_decay = [], []
    for path, sub in module.named_modules():
        for name, p in sub._parameters.items():
            if p is None:
                continue
            full = f"{path}.{name}" if path else name
            norm = path.endswith("norm") or weight_decay == 0.0
            (no_decay if norm or name == "bias" else decay).append(full)
    return [no_decay] if weight_decay == 0.0 else [decay, no_decay]


def _config(folder, finetune: bool):
    from megatron.config import config_from_dict

    return config_from_dict(
        dict(
            num_layers=LAYERS,
            hidden_size=HIDDEN,
            num_attention_heads=HEADS,
            seq_length=SEQ,
            max_position_embeddings=SEQ,
            pos_emb="rotary",
            rotary_pct=0.25,
            gpt_j_residual=True,
            no_weight_tying=True,
            norm="layernorm",
            layernorm_epsilon=1.0e-5,
            activation="gelu",
            hidden_dropout=0.0,
            attention_dropout=0.0,
            make_vocab_size_divisible_by=VOCAB,
            pipe_parallel_size=1,
            model_parallel_size=1,
            optimizer={"type": "Adam", "params": {"lr": 1.0e-3, "betas": [0.9, 0.95]}},
            weight_decay=0.01,
            lr_decay_style="cosine",
            warmup=WARMUP / TRAIN_ITERS,
            min_lr=1.0e-4,
            train_iters=TRAIN_ITERS,
            train_micro_batch_size_per_gpu=MICRO,
            gradient_accumulation_steps=1,
            load=str(folder),
            finetune=finetune,
            seed=1,
            distributed_backend="gloo",
        ),  # fmt: skip
        vocab_size=VOCAB,
        world_size=1,
    )


def _engine(cfg):
    from megatron.parallel import ParallelTopology, get_rng_tracker
    from megatron.parallel.random import seed_everything
    from megatron.training.checkpoint.checkpoint_io import CheckpointIO
    from megatron.training.objectives import build_objective
    from megatron.training.setup.engine import build_engine

    topo = ParallelTopology.from_config(cfg)
    goal = build_objective(cfg, topo.tp_group)
    seed_everything(cfg.training.seed)
    parts = build_engine(cfg, topo, TRAIN_ITERS, goal)
    io = CheckpointIO(parts.engine, None, cfg.to_dict(), tracker=get_rng_tracker())  # as pretrain
    return parts, io, topo, goal


def _first_loss(parts, topo, goal, tokens) -> float:
    from megatron.training.setup.batches import BatchSettings, ModelBatches
    from megatron.training.step.steps import engine_steps

    steps = engine_steps(parts.engine, topo, goal, None)
    return float(
        steps.train_step(ModelBatches(iter([{"text": tokens}]), BatchSettings(), None, goal))
    )


def _worker(rank, world_size, folder, tokens, broken):
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    out = {}
    parts, io, topo, goal = _engine(_config(folder, finetune=True))
    assert io.load(str(folder.parent), finetune=True) is None
    out["finetune_loss"] = _first_loss(parts, topo, goal, tokens)
    module = parts.engine.module
    out["groups"] = groups = neox_param_groups(module, 0.01)

    shapes = {n: tuple(p.shape) for n, p in module.named_parameters()}
    _write_optimizer(folder, groups, shapes)
    parts, io, topo, goal = _engine(_config(folder.parent, finetune=False))
    state = io.load(str(folder.parent))
    io.restore_rng(state)
    out["draws"] = draws()  # the streams GPT-NeoX saved, restored as its load restores them
    parts.lr_scheduler.load_state_dict(state["lr_scheduler"])
    names = {id(p): n for n, p in parts.engine.module.named_parameters()}
    optimizer = parts.engine.optimizer
    out["resumed"] = dict(
        iteration=state["iteration"], consumed=state["consumed_samples"],
        num_iters=parts.lr_scheduler.settings.num_iters,
        exp_avg={names[id(p)]: s["exp_avg"].unique().tolist() for p, s in optimizer.state.items()},
    )  # fmt: skip
    out["resumed_loss"] = _first_loss(parts, topo, goal, tokens)

    _write_optimizer(folder, neox_param_groups(module, 0.0), shapes)
    parts, io, topo, goal = _engine(_config(folder.parent, finetune=False))
    with pytest.raises(ValueError) as refused:
        io.load(str(folder.parent))
    out["refused"] = str(refused.value)

    for name, root in broken.items():  # what DeepSpeed would meet with a bare assertion
        parts, io, *_ = _engine(_config(root, finetune=True))
        with pytest.raises((FileNotFoundError, ValueError)) as refused:
            io.load(str(root), finetune=True)
        out[name] = str(refused.value)
    return out


def write_neox_folder(root, hf):
    """GPT-NeoX's folder (module docstring) without optimizer state yet."""
    folder = root / f"global_step{ITERATION}"
    folder.mkdir(parents=True)
    for name, state in neox_layer_files(hf).items():
        torch.save(state, folder / name)
    args = dict(num_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=HEADS,
                max_position_embeddings=SEQ, make_vocab_size_divisible_by=VOCAB,
                padded_vocab_size=VOCAB, tokenizer_type="GPT2BPETokenizer",
                model_parallel_size=1)  # fmt: skip
    torch.save(
        dict(module=None, optimizer=None, lr_scheduler=SCHEDULE, iteration=ITERATION,
             args=args, dp_world_size=1, mp_world_size=1, global_steps=ITERATION,
             global_samples=ITERATION * MICRO, skipped_steps=0, ds_version="0.19.0",
             **neox_rng_entries()),
        folder / "mp_rank_00_model_states.pt",
    )  # fmt: skip
    (root / "latest").write_text(folder.name)
    return folder


def neox_rng_entries() -> dict:
    """The RNG entries GPT-NeoX's `save_ds_checkpoint` adds to the engine-state file (its
    `random.getstate()`, `np.random.get_state()`, `torch.get_rng_state()` and its tracker's
    states; no CUDA one on a CPU), of streams seeded apart from anything the run seeds."""
    import random

    import numpy as np

    random.seed(RNG_SEED)
    np.random.seed(RNG_SEED)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(RNG_SEED + 1)
        tracker = torch.get_rng_state()
        torch.manual_seed(RNG_SEED)
        entries = dict(random_rng_state=random.getstate(), np_rng_state=np.random.get_state(),
                       torch_rng_state=torch.get_rng_state(),
                       rng_tracker_states={"model-parallel-rng": tracker})  # fmt: skip
    random.seed()
    np.random.seed()
    return entries


def draws() -> list[float]:
    """One draw of each stream: Python's, NumPy's, torch's and the tensor-parallel tracker's."""
    import random

    import numpy as np

    from megatron.parallel import get_rng_tracker

    with get_rng_tracker().fork("model-parallel-rng"):
        tracked = float(torch.rand(()))
    return [random.random(), float(np.random.rand()), float(torch.rand(())), tracked]


def _write_optimizer(folder, groups: list[list[str]], shapes: dict) -> None:
    """Torch Adam's state as GPT-NeoX's engine saves it (no ZeRO, fp32): parameters numbered
    over its groups in order; parameter k's `exp_avg` is k + 1 everywhere."""
    index, state, param_groups = 0, {}, []
    for group in groups:
        ids = []
        for name in group:
            state[index] = dict(step=torch.tensor(float(ITERATION)),
                                exp_avg=torch.full(shapes[name], float(index + 1)),
                                exp_avg_sq=torch.full(shapes[name], 1.0e-4))  # fmt: skip
            ids.append(index)
            index += 1
        decay = 0.01 if len(groups) == 2 and not param_groups else 0.0
        param_groups.append(dict(lr=1.0e-3, betas=(0.9, 0.95), eps=1.0e-8,
                                 weight_decay=decay, amsgrad=False, params=ids))  # fmt: skip
    path = folder / "mp_rank_00_model_states.pt"
    saved = torch.load(path, weights_only=False)
    saved["optimizer"] = dict(state=state, param_groups=param_groups)
    torch.save(saved, path)


@pytest.mark.slow
def expected_draws() -> list[float]:
    """GPT-NeoX's `load_checkpoint`: `random.setstate`, `np.random.set_state`,
    `torch.set_rng_state` and its tracker's `set_states` of the saved entries, then a draw."""
    import random

    import numpy as np

    from megatron.parallel import get_rng_tracker

    saved = neox_rng_entries()
    random.setstate(saved["random_rng_state"])
    np.random.set_state(saved["np_rng_state"])
    with torch.random.fork_rng(devices=[]):
        torch.set_rng_state(saved["torch_rng_state"])
        tracker = get_rng_tracker()
        before = tracker.get_states()
        tracker.set_states(saved["rng_tracker_states"])
        try:
            return draws()
        finally:
            tracker.set_states(before)


def test_training_continues_from_a_neox_folder_made_from_transformers(tmp_path):
    hf = hf_model()
    tokens = torch.randint(0, VOCAB, (MICRO, SEQ + 1), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        logits = hf(input_ids=tokens[:, :-1]).logits
    flat = logits.reshape(-1, VOCAB)
    expected = float(torch.nn.functional.cross_entropy(flat, tokens[:, 1:].reshape(-1)))
    folder = write_neox_folder(tmp_path / "neox", hf)
    broken = {"missing": tmp_path / "missing", "old": tmp_path / "old"}
    for root in broken.values():
        shutil.copytree(folder.parent, root)
    (broken["missing"] / folder.name / "layer_03-model_00-model_states.pt").unlink()
    torch.save({}, broken["old"] / folder.name / "layer_01-model_00-model_states.pt")
    out = run_distributed(_worker, 1, folder, tokens, broken, timeout=600)[0]

    assert out["finetune_loss"] == pytest.approx(expected, abs=1e-6)
    resumed = out["resumed"]
    assert resumed["iteration"] == ITERATION and resumed["consumed"] == ITERATION * MICRO
    assert resumed["num_iters"] == ITERATION
    numbered = [name for group in out["groups"] for name in group]
    assert sorted(numbered) == sorted(resumed["exp_avg"])
    for index, name in enumerate(numbered):
        assert resumed["exp_avg"][name] == [index + 1.0], name
    assert out["resumed_loss"] == pytest.approx(expected, abs=1e-6)
    assert out["draws"] == expected_draws()
    assert "GPT-NeoX saved one parameter group" in out["refused"]
    assert "no_load_optim: true" in out["refused"]
    assert "layer_03-model_00-model_states.pt" in out["missing"]
    assert "tools/reshard.py" in out["old"]
