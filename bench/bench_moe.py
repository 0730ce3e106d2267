"""Mixture of experts against the dense model of the same active parameters, on the same batches.

    python bench/bench_moe.py [configs/moe-small.yml configs/local.yml] [--steps 20] [--warmup 3]
                              [--set KEY=VALUE ...] [--tiny] [--out FILE]

Builds the config's MoE model and a dense twin in our trainer (one rank, DeepSpeed engine,
the step driver of `megatron/training/step/steps.py`, as `bench_train.py` does) and trains both on
the same global batches from the config's training data, taking turns batch by batch (the
machine is shared: a load change slows both alike, so the ratio stays fair). The MoE / dense
speed is given as the ratio of total tokens/s and as the median over steps of the two
back-to-back step times, which a load changing during the run moves less.

The dense twin has the same active parameters per token: the same config with
`moe_num_experts: 1` and every layer's MLP `intermediate_size` = the MoE model's active MLP
width averaged over the layers, `(dense_layers * ffn + moe_layers * top_k * ffn) / num_layers`
(configs/moe-small.yml: (2 * 512 + 2 * 2 * 512) / 4 = 768). The MLP weights a token runs
through are then equal; the MoE model keeps its routers (`E * h` per MoE layer) and `k - 1`
extra output biases per MoE layer, which the table shows as the active-parameter difference
(counts from `megatron/model/counting.py`, FLOPs from `megatron/training/metrics/flops.py`).

Per-expert token counts are the router's own assignments, read by a forward hook on each MoE
layer's router (`Route.indices`) during every step (warmup included). With
`moe_token_dropping` they are the assignments before capacity dropping. Prints a table and
writes `bench/results/moe_small_cpu_<cpu>.json` (`--tiny`: a 2-layer toy for CI).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_train import REPO, cpu_name, fixed_batches, resolve  # noqa: E402  (repo on sys.path)

from megatron.model.args import ModelArgs  # noqa: E402
from megatron.model.counting import active_parameters, count_parameters  # noqa: E402
from megatron.model.mlp import mlp_inner_size  # noqa: E402
from megatron.model.moe import is_moe_layer, moe_layers  # noqa: E402
from megatron.training.metrics.flops import shape_from_config, training_flops_per_token  # noqa: E402

TINY = dict(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32,
            max_position_embeddings=32, moe_num_experts=4,
            train_micro_batch_size_per_gpu=4)  # fmt: skip


def dense_width(cfg) -> int:
    """`intermediate_size` of the dense twin: the MoE model's active MLP width per layer."""
    from megatron.model.activations import build_activation

    args = ModelArgs.from_config(cfg)
    if build_activation(args.activation).gated or args.moe_glu:
        raise ValueError("bench_moe matches widths of ungated MLPs only; use activation: gelu")
    moe = sum(is_moe_layer(args, i) for i in range(args.num_layers))
    width = (args.num_layers - moe + moe * args.moe_top_k) * mlp_inner_size(args)
    if width % args.num_layers:
        raise ValueError(f"active MLP width {width} does not split over {args.num_layers} layers")
    return width // args.num_layers


class Contender:
    """One model in our trainer: its step function, losses, seconds and router counts."""

    def __init__(self, cfg, steps_total: int):
        from megatron.launcher.worker import initialize_distributed
        from megatron.parallel.random import seed_everything
        from megatron.training.setup.engine import build_engine
        from megatron.training.step.steps import engine_steps

        topology = initialize_distributed(cfg)
        seed_everything(cfg.training.seed)
        self.cfg = cfg
        self.engine = build_engine(cfg, topology, steps_total).engine
        self.steps = engine_steps(self.engine, topology)
        self.losses, self.step_seconds = [], []
        self.counts = []
        for i, layer in enumerate(moe_layers(self.engine.module)):
            self.counts.append(torch.zeros(layer.num_experts, dtype=torch.int64))
            layer.router.register_forward_hook(self._counter(i))

    def _counter(self, i: int):
        def hook(module, inputs, route):
            flat = route.indices.detach().reshape(-1).cpu()
            self.counts[i] += torch.bincount(flat, minlength=len(self.counts[i]))

        return hook

    def run(self, batch, timed: bool) -> None:
        start = time.perf_counter()
        loss = self.steps.train_step(iter(batch))
        if timed:
            self.step_seconds.append(time.perf_counter() - start)
        self.losses.append(float(loss))


def row(name: str, c: Contender, tokens: int) -> dict:
    cfg = c.cfg
    last = c.losses[-min(5, len(c.losses)) :]
    return {
        "contender": name,
        "moe_num_experts": cfg.moe.moe_num_experts,
        "moe_top_k": cfg.moe.moe_top_k if cfg.moe.moe_num_experts > 1 else None,
        "intermediate_size": cfg.model.intermediate_size,
        "mlp_width": mlp_inner_size(ModelArgs.from_config(cfg)),  # per expert in MoE layers
        "total_parameters": count_parameters(cfg),
        "active_parameters": active_parameters(cfg),
        "built_parameters": sum(p.numel() for p in c.engine.module.parameters()),
        "model_flops_per_token": training_flops_per_token(shape_from_config(cfg)),
        "seconds": sum(c.step_seconds),
        "step_seconds": c.step_seconds,
        "tokens_per_sec": tokens / sum(c.step_seconds),
        "first_loss": c.losses[0],
        "last_loss": c.losses[-1],
        "mean_loss_last_5": sum(last) / len(last),
        "expert_token_counts": [x.tolist() for x in c.counts],
    }


def print_table(rows: list[dict], ratio: float, median: float, steps: int) -> None:
    print(f"{'':28s} {'tokens/s':>9s} {'active':>9s} {'total':>9s} {'loss@' + str(steps):>9s}")
    for r in rows:
        print(
            f"{r['contender']:28s} {r['tokens_per_sec']:9,.0f} {r['active_parameters']:9,d} "
            f"{r['total_parameters']:9,d} {r['last_loss']:9.4f}"
        )
    print(f"MoE / dense tokens/s: {ratio:.3f} (median of step pairs {median:.3f})")
    for i, counts in enumerate(rows[0]["expert_token_counts"]):
        print(f"MoE layer {i} tokens per expert: {counts}")


def cpu_slug() -> str:
    name = re.sub(r"\((r|tm)\)|\(\d+ cores\)|cpu|@.*", "", cpu_name().lower())
    return re.sub(r"[^a-z0-9]+", "_", name).strip("_") or "cpu"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    defaults = ["configs/moe-small.yml", "configs/local.yml"]
    parser.add_argument("configs", nargs="*", default=defaults)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--tiny", action="store_true", help="a 2-layer toy (CI)")
    parser.add_argument("--out", default=None, help="JSON path (default: bench/results/...)")
    args = parser.parse_args(argv)
    os.environ.setdefault("MASTER_PORT", "29519")

    total = args.warmup + args.steps
    changes = dict(TINY if args.tiny else {}, train_iters=total)
    moe_cfg = resolve(args.configs, args.overrides, **changes)
    if moe_cfg.moe.moe_num_experts < 2:
        parser.error(f"{args.configs}: moe_num_experts must be > 1 for a MoE benchmark")
    width = dense_width(moe_cfg)
    dense_changes = dict(changes, moe_num_experts=1, intermediate_size=width)
    dense_cfg = resolve(args.configs, args.overrides, **dense_changes)
    batches = fixed_batches(moe_cfg, total)
    load_before = os.getloadavg()
    dense = Contender(dense_cfg, total)
    models = {"MoE": Contender(moe_cfg, total), f"dense (ffn {width})": dense}
    for i, batch in enumerate(batches):
        for c in models.values():
            c.run(batch, timed=i >= args.warmup)
    tokens_per_step = moe_cfg.training.train_batch_size * moe_cfg.model.seq_length
    rows = [row(name, c, args.steps * tokens_per_step) for name, c in models.items()]
    ratio = rows[0]["tokens_per_sec"] / rows[1]["tokens_per_sec"]
    # each step's dense/MoE time ratio: the two steps ran back to back, so under a load that
    # changes over the run the median of these pairs moves less than the ratio of totals
    pairs = [d / m for m, d in zip(models["MoE"].step_seconds, dense.step_seconds)]
    result = {
        "config": args.configs,
        "overrides": args.overrides + (["--tiny"] if args.tiny else []),
        "device": cpu_name(),
        "threads": torch.get_num_threads(),
        "warmup": args.warmup,
        "steps": args.steps,
        "tokens_per_step": tokens_per_step,
        "tokens_routed": total * tokens_per_step,
        "moe_top_k": moe_cfg.moe.moe_top_k,
        "counts_before_dropping": moe_cfg.moe.moe_token_dropping,
        "dense_match": "moe_num_experts 1, intermediate_size = (dense_layers * ffn + "
        f"moe_layers * top_k * ffn) / num_layers = {width}",
        "load_average_1_5_15_min": {"before": load_before, "after": os.getloadavg()},
        "note": "shared machine (other engineers' jobs running, see the load averages): the "
        "figures are side-by-side ratios within one run; the two models take turns batch by "
        "batch, so the ratio is fair while absolute tokens/s vary with the load",
        "rows": rows,
        "moe_over_dense_tokens_per_sec": ratio,
        "moe_over_dense_median_of_step_pairs": statistics.median(pairs),
    }
    print_table(rows, ratio, statistics.median(pairs), total)
    slug = "tiny" if args.tiny else f"small_cpu_{cpu_slug()}"
    out = Path(args.out) if args.out else REPO / "bench" / "results" / f"moe_{slug}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
