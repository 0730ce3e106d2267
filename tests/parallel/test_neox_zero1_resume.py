"""A GPT-NeoX run trained with ZeRO stage 1 (as Pythia's were) continues here: iteration, LR
schedule and optimizer state, over 2 data-parallel gloo ranks, through `pretrain`.

The folder is made as GPT-NeoX would leave it: our run trains 3 steps at ZeRO-1 and saves,
then the folder is turned into GPT-NeoX's form. Our own files go (`trainer_state.pt`,
`config.json`, `rng_state_rank*.pt`, `complete`); each `mp_rank_00_model_states.pt` gets the
entries GPT-NeoX's `save_ds_checkpoint` passes to DeepSpeed (`iteration`, `args`) and its
`AnnealingLR.state_dict()` under `lr_scheduler`, written out here from GPT-NeoX's definitions
(`start_lr`, `warmup_iter` = warmup × iterations, `num_iters` = the iteration, `decay_style`,
`end_iter`, `min_lr`); tensor names become those of GPT-NeoX's current trainer
(`mlp.linear1`/`linear2`; without a pipeline, `sequential.{index}.`), in the layer files and
in DeepSpeed's `param_shapes`.

The `zero_pp_rank_{dp}_mp_rank_00_optim_states.pt` files are kept, since they are what
GPT-NeoX's engine writes: GPT-NeoX pins DeeperSpeed 0.16.5, whose ZeRO-1/2 `state_dict` and
engine save hold the same entries as DeepSpeed 0.19's (the base optimizer's state over the
flat fp32 partitions of each parameter group, the partitions without their padding, the
group paddings, the partition count) except `param_alignment_paddings`, which 0.19 added for
its `parameter_alignment` option (off: every padding 0) and is removed here. The flat groups
are laid out the same way: one per optimizer parameter group, in the group's order (no
round-robin reordering by default in either), and GPT-NeoX's groups are ours
(`get_params_for_weight_decay_optimization`: decayed weights first, then biases and norm
parameters, each in module order, over the same layers), so each partition holds the same
parameters' elements at the same offsets. `param_shapes` records that order by name, and the
resume compares it with this run's before DeepSpeed loads anything.

Checked: the resumed run's losses equal the unbroken run's (1e-6) for the steps after the
resume, so the iteration (data at 3 × batch samples), the LR schedule and the Adam state all
came back. The resumed run's config asks for another peak LR with
`use_checkpoint_lr_scheduler: true`, so a schedule not taken from GPT-NeoX's entries would
show in the losses. GPT-NeoX's ZeRO state of one group (`weight_decay: 0`) is refused with
the reason before DeepSpeed loads anything. Layouts: the pipeline engine
(`pipe_parallel_size: 1`, untied, as Pythia) and the plain engine (`pipe_parallel_size: 0`,
tied), tp 1, dp 2, fp32.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from tests.distributed import run_distributed
from tests.tiny import resolve, tiny_settings

pytestmark = pytest.mark.slow

ITERS, STOP, WARMUP, LR, MIN_LR = 6, 3, 0.2, 2.0e-3, 1.0e-4
LAYOUTS = {
    "pipeline_untied": dict(pipe_parallel_size=1, no_weight_tying=True),
    "plain_tied": dict(pipe_parallel_size=0, no_weight_tying=False),
}


def _settings(folder: Path, lr: float = LR, **changes) -> dict:
    return tiny_settings(
        folder,
        zero_optimization={"stage": 1},
        weight_decay=0.01,  # two groups, as GPT-NeoX keeps when it is not 0
        hidden_dropout=0.0,  # GPT-NeoX's RNG states are not restored
        attention_dropout=0.0,
        optimizer={"type": "Adam", "params": {"lr": lr, "betas": [0.9, 0.95]}},
        lr_decay_style="cosine",
        warmup=WARMUP,
        min_lr=MIN_LR,
        train_iters=ITERS,
        eval_interval=100,
        checkpoint_factor=None,
        **changes,
    )


def _neox_name(name: str, plain: bool, tied: bool) -> str:
    """A tensor's name as GPT-NeoX's current trainer has it (module docstring)."""
    name = name.replace(".dense_h_to_4h.", ".linear1.").replace(".dense_4h_to_h.", ".linear2.")
    if not plain:
        return name
    if tied and name.startswith("tied_modules.embed."):
        name = "0." + name[len("tied_modules.embed.") :]
    return "sequential." + name


def to_neox_folder(folder: Path, plain: bool, tied: bool) -> None:
    """Our ZeRO-1 checkpoint folder as GPT-NeoX leaves one (module docstring)."""
    for name in ("trainer_state.pt", "config.json", "complete"):
        (folder / name).unlink()
    for path in folder.glob("rng_state_rank*.pt"):
        path.unlink()
    for path in folder.glob("layer_*-model_states.pt"):
        state = torch.load(path, weights_only=True)
        torch.save({_neox_name(k, False, tied): v for k, v in state.items()}, path)
    for path in folder.glob("zero_pp_rank_*_optim_states.pt"):
        state = torch.load(path, weights_only=False)
        del state["optimizer_state_dict"]["param_alignment_paddings"]  # not in DeeperSpeed
        torch.save(state, path)
    path = folder / "mp_rank_00_model_states.pt"
    state = torch.load(path, weights_only=False)
    state["param_shapes"] = [
        {_neox_name(k, plain, tied): v for k, v in group.items()} for group in state["param_shapes"]
    ]
    if plain:  # already in sequential names; only the MLP's change
        state["module"] = {_neox_name(k, False, tied): v for k, v in state["module"].items()}
    state["lr_scheduler"] = dict(  # GPT-NeoX's AnnealingLR.state_dict()
        start_lr=LR, warmup_iter=WARMUP * ITERS, num_iters=STOP, decay_style="cosine",
        end_iter=ITERS, min_lr=MIN_LR,
    )  # fmt: skip
    state["iteration"] = STOP
    state["args"] = dict(num_layers=2, hidden_size=64, num_attention_heads=4,
                         max_position_embeddings=32, make_vocab_size_divisible_by=128,
                         padded_vocab_size=512, tokenizer_type="CharLevelTokenizer",
                         model_parallel_size=1)  # fmt: skip
    torch.save(state, path)


def _worker(rank, world_size, root: Path):
    import torch.distributed as dist

    from megatron.training import pretrain

    out = {}
    for name, layout in LAYOUTS.items():
        folder = root / name
        unbroken = pretrain(
            resolve(_settings(folder / "unbroken", save=None, load=None, **layout), 2)
        )
        pretrain(resolve(_settings(folder / "neox", exit_interval=STOP, **layout), 2))
        if rank == 0:
            saved = folder / "neox" / "ckpt" / f"global_step{STOP}"
            to_neox_folder(saved, layout["pipe_parallel_size"] == 0, not layout["no_weight_tying"])
        dist.barrier()
        other = _settings(folder / "neox", lr=5 * LR, use_checkpoint_lr_scheduler=True, **layout)
        resumed = pretrain(resolve(other, 2))
        out[name] = dict(unbroken=unbroken.losses, resumed=resumed.losses)
    saved = root / "pipeline_untied" / "neox" / "ckpt" / f"global_step{STOP}"
    if rank == 0:
        one_group(saved)
    dist.barrier()
    settings = _settings(saved.parent.parent, **LAYOUTS["pipeline_untied"])
    with pytest.raises(ValueError) as refused:
        pretrain(resolve(settings, 2))
    out["refused"] = str(refused.value)
    return out


def one_group(folder: Path) -> None:
    """The `param_shapes` of GPT-NeoX with `weight_decay: 0`: one group, every parameter in
    module order (the layers' in index order, each layer file's in its module's order)."""
    path = folder / "mp_rank_00_model_states.pt"
    state = torch.load(path, weights_only=False)
    shapes = {k: v for group in state["param_shapes"] for k, v in group.items()}
    files = sorted(folder.glob("layer_*-model_states.pt"), key=lambda p: int(p.name[6:8]))
    order = [f"{int(p.name[6:8])}.{k}" for p in files for k in torch.load(p, weights_only=True)]
    state["param_shapes"] = [{k: shapes[k] for k in order if k in shapes}]
    torch.save(state, path)
    for later in folder.parent.glob("global_step*"):  # the resumed run's saves
        if later != folder:
            shutil.rmtree(later)
    (folder.parent / "latest").write_text(folder.name)


def test_a_neox_zero1_run_resumes_exactly(tmp_path):
    out = run_distributed(_worker, 2, tmp_path, timeout=600)[0]
    assert "GPT-NeoX saved one parameter group" in out.pop("refused")
    for name, losses in out.items():
        assert len(losses["unbroken"]) == ITERS, name
        assert losses["resumed"] == pytest.approx(losses["unbroken"][STOP:], abs=1e-6), name
    shutil.rmtree(tmp_path, ignore_errors=True)
