"""Host reads and device synchronisations per optimizer step over the configurations users run.

Each case trains the tiny model with `pretrain` (the assembly `train.py` runs) and counts, with
`tests/device_costs.py::HostReads`, two whole iterations after a warm-up one
(`tests/step_reads.py`): what a GPU would wait for in every step of such a run. The main path
reads one value per step, the non-finite step check's flag (`docs/performance.md`). `TABLE`
holds what each case reads today: a case that reads MORE fails, naming the file:line of each
read; one that reads FEWER fails too, so that a fix that removes a read tightens its row.

The cases: both engines (`pipe_parallel_size` 0: plain, 1: pipeline) in fp32, bf16 and fp16
at the ZeRO stages each takes (plain 0-3, pipeline 0-1); on the pipeline engine in fp32, the
model variants (MoE routers, Mamba, RWKV, gMLP, positional encodings, sliding window, GQA,
rope_fusion), the objectives (`train_impl`) and the features that hang off the step; MoE and
the objectives on the plain engine too (`plain-*`), and on 2 data-parallel ranks (`dp2-*`) what
depends on their number. Keys as `configs/README.md` documents them. Each step is 2
micro-batches of the 2-layer model (27 parameter tensors): a count per layer, micro-batch or
parameter tensor grows with the model. A read of a value that lives on the host on a GPU too
counts here like a device read (`tests/step_reads.py`); the reasons mark those.
"""

from __future__ import annotations

import pytest

from tests.distributed import run_distributed
from tests.step_reads import count_runs
from tests.tiny import tiny_settings

pytestmark = pytest.mark.slow

BASE = dict(save=None, load=None, train_iters=10, log_interval=1000, eval_interval=1000,
            eval_iters=1, steps_per_print=1000)  # fmt: skip
PRECISIONS = {
    "fp32": {},
    "bf16": dict(precision="bfloat16"),
    "fp16": dict(fp16={"enabled": True, "loss_scale": 0, "initial_scale_power": 8}),
}
ENGINES = {"plain": (0, (0, 1, 2, 3)), "pipe": (1, (0, 1))}  # pipe_parallel_size, ZeRO stages
MOE = dict(moe_num_experts=4, moe_aux_loss_coeff=0.01)
CURRICULUM = {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 8,
              "max_difficulty": 32, "schedule_type": "fixed_linear",
              "schedule_config": {"total_curriculum_step": 4, "difficulty_step": 8}}  # fmt: skip
VARIANTS = {
    "moe-topk": dict(MOE, moe_router_type="topk", moe_top_k=2, moe_token_dropping=True),
    "moe-sinkhorn": dict(MOE, moe_router_type="sinkhorn", moe_token_dropping=True),
    "moe-dropless": dict(MOE, moe_router_type="topk", moe_top_k=2, moe_token_dropping=False),
    "mamba": dict(attention_config=[[["mamba"], 2]]),  # fused kernels off: the reference scan
    "rwkv": dict(attention_config=[[["rwkv"], 2]], hidden_dropout=0.0, attention_dropout=0.0),
    "gmlp": dict(attention_config=[[["gmlp"], 2]]),
    "alibi": dict(pos_emb="alibi"),
    "rpe": dict(pos_emb="rpe"),
    "sliding-window": dict(sliding_window_width=8),
    "gqa": dict(num_kv_heads=2),
    "rope-fusion": dict(rope_fusion=True),  # no CUDA kernel on a CPU: the reference rotary
}
ONEBIT = {"lr": 2.0e-3, "freeze_step": 1}  # the counted steps come after the freeze
FEATURES = {
    "log-grad-norm": dict(log_grad_norm=True),
    "curriculum": dict(curriculum_learning=CURRICULUM),
    "distro": dict(optimizer={"type": "Distro", "params": {"lr": 2.0e-3}}),
    "onebit-adam-frozen": dict(optimizer={"type": "OneBitAdam", "params": ONEBIT}),
    "checkpoint-activations": dict(checkpoint_activations=True),
    "synchronize-each-layer": dict(checkpoint_activations=True, synchronize_each_layer=True),
}

# DeepSpeed's optimizer wrappers read nothing of their own: their checks ride on the main
# path's one read (`grad_norm.py`, `fp16_scaler.py`). What else reads, and where:
DROPLESS = "dropless MoE: each MoE layer's per-expert token counts, once per forward (2 layers x "
DROPLESS += "2 micro-batches), which size the experts' inputs (model/moe_dispatch.py)"
RM = "rm: every row has a reward token, asked of the loader's host tensors before their copy to "
RM += "the device (objectives/rm.py::require_reward_tokens): no GPU wait"
SYNC_LAYERS = "4 synchronisations per checkpointed layer and micro-batch, as asked "
SYNC_LAYERS += "(deepspeed/runtime/activation_checkpointing/checkpointing.py:589, 649, 674, 777)"

# features whose reads depend on the data-parallel size: also run on 2 ranks
DATA_PARALLEL = ("onebit-adam-frozen", "distro", "checkpoint-save-interval-minutes")

# case: (host reads per step, device synchronisations per step, why above the main path's 1)
TABLE = {
    "plain-fp32-zero0": (1, 0, ""),
    "plain-fp32-zero1": (1, 0, ""),
    "plain-fp32-zero2": (1, 0, ""),
    "plain-fp32-zero3": (1, 0, ""),
    "plain-bf16-zero0": (1, 0, ""),
    "plain-bf16-zero1": (1, 0, ""),
    "plain-bf16-zero2": (1, 0, ""),
    "plain-bf16-zero3": (1, 0, ""),
    "plain-fp16-zero0": (1, 0, ""),
    "plain-fp16-zero1": (1, 0, ""),
    "plain-fp16-zero2": (1, 0, ""),
    "plain-fp16-zero3": (1, 0, ""),
    "pipe-fp32-zero0": (1, 0, ""),
    "pipe-fp32-zero1": (1, 0, ""),
    "pipe-bf16-zero0": (1, 0, ""),
    "pipe-bf16-zero1": (1, 0, ""),
    "pipe-fp16-zero0": (1, 0, ""),
    "pipe-fp16-zero1": (1, 0, ""),
    "moe-topk": (1, 0, ""),
    "moe-sinkhorn": (1, 0, ""),
    "moe-dropless": (5, 0, DROPLESS),
    "plain-moe-topk": (1, 0, ""),
    "plain-moe-sinkhorn": (1, 0, ""),
    "plain-moe-dropless": (5, 0, DROPLESS),
    "mamba": (1, 0, ""),
    "rwkv": (1, 0, ""),
    "gmlp": (1, 0, ""),
    "alibi": (1, 0, ""),
    "rpe": (1, 0, ""),
    "sliding-window": (1, 0, ""),
    "gqa": (1, 0, ""),
    "rope-fusion": (1, 0, ""),
    "sft": (1, 0, ""),
    "dpo": (1, 0, ""),
    "kto": (1, 0, ""),
    "rm": (3, 0, RM),
    "plain-sft": (1, 0, ""),
    "plain-dpo": (1, 0, ""),
    "plain-kto": (1, 0, ""),
    "plain-rm": (3, 0, RM),
    "log-grad-norm": (1, 0, ""),
    "curriculum": (1, 0, ""),
    "distro": (1, 0, ""),
    "onebit-adam-frozen": (1, 0, ""),
    "checkpoint-activations": (1, 0, ""),
    "synchronize-each-layer": (1, 16, SYNC_LAYERS),
    "checkpoint-save-interval-minutes": (1, 0, ""),
    "dp2": (1, 0, ""),
    "dp2-onebit-adam-frozen": (1, 0, ""),
    "dp2-distro": (1, 0, ""),
    "dp2-checkpoint-save-interval-minutes": (1, 0, ""),
}
# Cases a CPU cannot build, with the reason.
SKIPPED = {
    "mamba-fused-kernels": "mamba-ssm's and causal-conv1d's kernels run on CUDA only; the case "
    "mamba runs the reference scan, the same function",
}


def _layouts() -> dict:
    cases = {}
    for engine, (pp, stages) in ENGINES.items():
        for precision, keys in PRECISIONS.items():
            for stage in stages:
                layout = dict(pipe_parallel_size=pp, zero_optimization={"stage": stage})
                cases[f"{engine}-{precision}-zero{stage}"] = {**keys, **layout}
    return cases


def _objectives(folder) -> dict:
    from tests.parallel.test_post_training_resume import write_datasets

    data = write_datasets(folder)
    kto = data["kto"]
    sft = {key: kto[key] for key in kto if "reward" not in key and key != "train_impl"}
    return {
        "sft": dict(sft, data_path=None),
        "dpo": dict(data["dpo"], data_path=None),
        "kto": dict(kto, data_path=None),
        "rm": dict(data["dpo"], train_impl="rm", data_path=None),
    }


def _on_both_engines(cases: dict) -> dict:
    """`cases` on the pipeline engine, and as `plain-{name}` on the plain one."""
    plain = {f"plain-{name}": dict(keys, pipe_parallel_size=0) for name, keys in cases.items()}
    return {**cases, **plain}


def _groups(folder) -> list[tuple[int, dict]]:
    """The cases as flat config keys, in groups that each run in one spawn: (ranks, cases)."""
    cache = dict(BASE, data_cache_path=str(folder / "index_cache"))
    minutes = dict(checkpoint_save_interval_minutes=60.0, save=str(folder / "ckpt"))
    features = dict(FEATURES, **{"checkpoint-save-interval-minutes": minutes})
    moe = {name: VARIANTS[name] for name in VARIANTS if name.startswith("moe")}
    variants = {**VARIANTS, **_on_both_engines(moe)}
    data_parallel = {f"dp2-{name}": features[name] for name in DATA_PARALLEL}
    groups = [(1, _layouts()), (1, variants), (1, _on_both_engines(_objectives(folder)))]
    groups += [(1, features), (2, {"dp2": {}, **data_parallel})]
    return [(ranks, _settings(folder, cache, cases)) for ranks, cases in groups]


def _settings(folder, common: dict, cases: dict) -> dict:
    """`{name: flat config keys}`: the tiny run under `folder / name` with `common`."""
    return {
        name: tiny_settings(folder / name, **{**common, **keys}) for name, keys in cases.items()
    }


class Measured:
    """The counts of each case, measured a group at a time, when a case of it is first asked
    for (on rank 0: every rank runs the same step)."""

    def __init__(self, folder):
        self.groups, self.counts = _groups(folder), {}

    def __getitem__(self, case: str) -> dict:
        if case not in self.counts:
            ranks, cases = next(group for group in self.groups if case in group[1])
            self.counts.update(run_distributed(count_runs, ranks, cases, timeout=600)[0])
        return self.counts[case]


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    return Measured(tmp_path_factory.mktemp("reads"))


def _cases():
    yield from TABLE
    for name, reason in SKIPPED.items():
        yield pytest.param(name, marks=pytest.mark.skip(reason=reason))


@pytest.mark.parametrize("case", list(_cases()))
def test_reads_per_step_are_the_tables(measured, case):
    reads, syncs, _ = TABLE[case]
    got = measured[case]
    assert "error" not in got, f"{case}: {got.get('error')}"
    assert all(got["applied"]), f"{case}: a counted step was skipped ({got['applied']})"
    for kind, allowed in (("reads", reads), ("syncs", syncs)):
        message = f"{case}: {got[kind]} {kind} per step, the table allows {allowed}"
        assert got[kind] <= allowed, f"{message}; by place: {got['where']}"
        assert got[kind] >= allowed, f"{message}: tighten the table (now: {got['where']})"


def test_every_case_is_in_the_table_with_a_reason_above_the_main_path(tmp_path):
    names = [name for _, cases in _groups(tmp_path) for name in cases]
    assert sorted(names) == sorted(TABLE)
    for name, (reads, syncs, why) in TABLE.items():
        assert why or (reads, syncs) == (1, 0), f"{name}: say why it reads more than 1"
