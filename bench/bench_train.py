"""Training throughput of our trainer against a plain PyTorch loop, on the same batches.

    python bench/bench_train.py [configs/small.yml configs/local.yml] [--steps 20] [--warmup 3]
                                [--set KEY=VALUE ...] [--engines pipeline,plain] [--out FILE]

Builds the config's model (one rank, CPU gloo or one GPU) in our trainer, on DeepSpeed's
pipeline engine (`pipe_parallel_size: 1`) and on its plain engine (`pipe_parallel_size: 0`),
and the same-shape `transformers.GPTNeoXForCausalLM` trained by a plain loop (forward, cross
entropy, backward, clip to `gradient_clipping`, `torch.optim.AdamW` with the same settings).
Every contender trains `--warmup` untimed then `--steps` timed global batches, the same
batches read from the config's training data, taking turns batch by batch (fair under a
changing machine load). Reports tokens/s
and achieved GFLOP/s (model FLOPs, `megatron/training/metrics/flops.py`), prints a table and writes
the JSON to `--out` (default `bench/results/train_small_cpu.json`), as the other benchmarks do.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "bench" / "results" / "train_small_cpu.json"
sys.path.insert(0, str(REPO))

from megatron.config import load_config  # noqa: E402
from megatron.training.metrics.flops import shape_from_config, training_flops_per_token  # noqa: E402


def resolve(files, overrides, **changes):
    from megatron.data import build_tokenizer

    sets = overrides + [f"{k}={json.dumps(v)}" for k, v in changes.items()]
    cfg = load_config(files, sets, world_size=1, warn=[])
    return load_config(
        files, sets, world_size=1, vocab_size=build_tokenizer(cfg).vocab_size, warn=[]
    )


def fixed_batches(cfg, count: int):
    """`count` global batches of model inputs from the start of the training split."""
    from megatron.data import build_tokenizer
    from megatron.parallel import ParallelTopology
    from megatron.training.setup.batches import BatchSettings
    from megatron.training.setup.data import BatchFactory, build_datasets

    t = cfg.training
    train, _, _ = build_datasets(cfg, count)
    settings = BatchSettings.from_config(cfg, build_tokenizer(cfg).eod)
    batches = BatchFactory(cfg, ParallelTopology(1, 1), settings)(train, 0)
    return [[next(batches) for _ in range(t.gradient_accumulation_steps)] for _ in range(count)]


def interleaved_seconds(steps: dict, batches, warmup: int) -> dict[str, float]:
    """Seconds each step function spends on the timed batches. The contenders take turns,
    one global batch each, so a machine whose load changes during the run slows them alike."""
    seconds = dict.fromkeys(steps, 0.0)
    for i, batch in enumerate(batches):
        for name, step in steps.items():
            start = time.perf_counter()
            step(batch)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            if i >= warmup:
                seconds[name] += time.perf_counter() - start
    return seconds


def ours(cfg, batches):
    """A step function of our trainer (DeepSpeed engine, our model) on one global batch."""
    from megatron.launcher.worker import initialize_distributed
    from megatron.parallel.random import seed_everything
    from megatron.training.setup.engine import build_engine
    from megatron.training.step.steps import engine_steps

    topology = initialize_distributed(cfg)
    seed_everything(cfg.training.seed)
    engine = build_engine(cfg, topology, len(batches)).engine
    steps = engine_steps(engine, topology)
    return lambda batch: steps.train_step(iter(batch))


def hf_model(cfg):
    """`GPTNeoXForCausalLM` of the same shape (tied or untied head as configured)."""
    import transformers

    m = cfg.model
    shape = shape_from_config(cfg)
    config = transformers.GPTNeoXConfig(
        vocab_size=m.padded_vocab_size,
        hidden_size=m.hidden_size,
        num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_attention_heads,
        intermediate_size=shape.mlp_inner_size,
        max_position_embeddings=m.max_position_embeddings or m.seq_length,
        rotary_pct=m.rotary_pct if m.pos_emb == "rotary" else 1.0,
        use_parallel_residual=m.gpt_j_residual,
        hidden_dropout=m.hidden_dropout,
        attention_dropout=m.attention_dropout,
        layer_norm_eps=m.layernorm_epsilon,
        tie_word_embeddings=not m.no_weight_tying,
        hidden_act="gelu",
    )
    torch.manual_seed(cfg.training.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return transformers.GPTNeoXForCausalLM(config).to(device).train()


def plain_loop(cfg):
    """A step function of a plain PyTorch loop over the HF model on one global batch."""
    model = hf_model(cfg)
    device = next(model.parameters()).device
    params = dict(cfg.optimizer.optimizer_params or {})
    if "betas" in params:
        params["betas"] = tuple(params["betas"])
    opt = torch.optim.AdamW(
        model.parameters(), lr=cfg.optimizer.lr, weight_decay=cfg.optimizer.weight_decay, **params
    )
    clip = cfg.optimizer.gradient_clipping

    def step(batch):
        for (tokens, positions), (labels, mask) in batch:
            logits = model(tokens.to(device), position_ids=positions.to(device)).logits
            losses = torch.nn.functional.cross_entropy(
                logits.float().flatten(0, 1), labels.to(device).flatten(), reduction="none"
            )
            mask = mask.to(device).flatten()
            loss = (losses * mask).sum() / mask.sum() / len(batch)
            loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    except OSError:
        pass
    return platform.processor() or "cpu"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("configs", nargs="*", default=["configs/small.yml", "configs/local.yml"])
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--engines", default="pipeline,plain")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON file to write")
    args = parser.parse_args(argv)
    os.environ.setdefault("MASTER_PORT", "29517")

    cfg = resolve(args.configs, args.overrides)
    total = args.warmup + args.steps
    batches = fixed_batches(cfg, total)
    tokens = args.steps * cfg.training.train_batch_size * cfg.model.seq_length
    flops = training_flops_per_token(shape_from_config(cfg))
    engines = {"pipeline": 1, "plain": 0}
    steps = {}
    for engine in args.engines.split(","):
        if engine not in engines:
            parser.error(f"--engines: '{engine}' is not one of {', '.join(engines)}")
        engine_cfg = resolve(args.configs, args.overrides, pipe_parallel_size=engines[engine])
        steps[f"ours, {engine} engine"] = ours(engine_cfg, batches)
    steps["plain PyTorch loop, HF GPTNeoXForCausalLM"] = plain_loop(cfg)
    rows = []
    for name, seconds in interleaved_seconds(steps, batches, args.warmup).items():
        rows.append(
            {
                "contender": name,
                "seconds": seconds,
                "tokens_per_sec": tokens / seconds,
                "gflops_per_sec": tokens / seconds * flops / 1e9,
            }
        )
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else cpu_name()
    result = {
        "config": args.configs,
        "overrides": args.overrides,
        "device": device or "cpu",
        "threads": torch.get_num_threads(),
        "steps": args.steps,
        "tokens_per_step": cfg.training.train_batch_size * cfg.model.seq_length,
        "model_flops_per_token": flops,
        "rows": rows,
    }
    print(f"{'contender':45s} {'tokens/s':>10s} {'GFLOP/s':>9s} {'seconds':>8s}")
    for r in rows:
        print(
            f"{r['contender']:45s} {r['tokens_per_sec']:10,.0f} {r['gflops_per_sec']:9.2f} "
            f"{r['seconds']:8.2f}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
