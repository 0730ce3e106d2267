"""Training throughput of our trainer against a plain PyTorch loop, on the same batches.

    python bench/bench_train.py [configs/small.yml configs/local.yml] [--steps 20] [--warmup 3]
                                [--set KEY=VALUE ...] [--engines pipeline,plain]
                                [--precisions fp32,bf16] [--compiled]
                                [--loss-chunk-tokens N[,N...]] [--vocab-size V] [--out PATH]

Builds the config's model (one rank, CPU gloo or one GPU) in our trainer, on DeepSpeed's
pipeline engine (`pipe_parallel_size: 1`) and on its plain engine (`pipe_parallel_size: 0`),
and the same-shape `transformers.GPTNeoXForCausalLM` trained by a plain loop (forward, cross
entropy, backward, clip to `gradient_clipping`, `torch.optim.AdamW` with the same settings).
For each precision in `--precisions`: fp32, and bf16 (ours: `precision: bfloat16`, DeepSpeed's
bf16 weights with fp32 master weights; the loop: fp32 weights under `torch.autocast` bf16),
skipped with a note where the device has no bf16 kernels. `--compiled` adds the loop over
`torch.compile(model)` and our plain engine with `torch_compile: true`. `--loss-chunk-tokens
N[,N...]` adds each engine again with each `loss_chunk_tokens: N` (the head fused with the loss,
N tokens a chunk; 0: the full logits; a sweep of chunk sizes), the config's own value (null:
on, auto-sized) staying on the other contenders. Every contender trains
`--warmup` untimed then `--steps` timed global batches, the same batches read from the
config's training data, taking turns batch by batch (fair under a changing machine load).
Reports tokens/s, achieved GFLOP/s (model FLOPs, `megatron/training/metrics/flops.py`) and
each contender's speed relative to the eager loop of its precision, prints a table and writes
the JSON (command, device, load average) to the path `--out` names (default
`bench/results/train_small_cpu.json`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "bench" / "results" / "train_small_cpu.json"
sys.path.insert(0, str(REPO))

from megatron.config import load_config  # noqa: E402
from megatron.training.metrics.flops import shape_from_config, training_flops_per_token  # noqa: E402

VOCAB_SIZE = None  # --vocab-size: the model's vocabulary instead of the tokenizer's


def resolve(files, overrides, **changes):
    from megatron.data import build_tokenizer

    sets = overrides + [f"{k}={json.dumps(v)}" for k, v in changes.items()]
    cfg = load_config(files, sets, world_size=1, warn=[])
    vocab = VOCAB_SIZE or build_tokenizer(cfg).vocab_size
    return load_config(files, sets, world_size=1, vocab_size=vocab, warn=[])


def add_vocab_size_argument(parser) -> None:
    help = "a larger vocabulary than the tokenizer's (Qwen3's 151936): the data's ids stay its"
    parser.add_argument("--vocab-size", type=int, help=help)


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


PRECISIONS = {"fp32": "fp32", "bf16": "bfloat16"}  # --precisions name -> config value


def bf16_supported() -> bool:
    """Whether this device has bf16 kernels (a GPU that says so, or a CPU with AVX512-BF16/AMX)."""
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def interleaved_seconds(steps: dict, batches, warmup: int) -> dict[str, list[float]]:
    """Seconds each step function spends on each timed batch. The contenders take turns,
    one global batch each, so a machine whose load changes during the run slows them alike."""
    seconds = {name: [] for name in steps}
    for i, batch in enumerate(batches):
        for name, step in steps.items():
            start = time.perf_counter()
            step(batch)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            if i >= warmup:
                seconds[name].append(time.perf_counter() - start)
    return seconds


def ours(cfg, batches):
    """A step function of our trainer (DeepSpeed engine, our model) on one global batch."""
    from megatron.launcher.worker import initialize_distributed
    from megatron.parallel.random import seed_everything
    from megatron.training.setup.engine import build_engine
    from megatron.training.step.nonfinite import NonFiniteSteps
    from megatron.training.step.steps import engine_steps

    topology = initialize_distributed(cfg)
    seed_everything(cfg.training.seed)
    parts = build_engine(cfg, topology, len(batches))
    steps = engine_steps(parts.engine, topology)
    NonFiniteSteps(parts.engine, parts.optimizer, topology, steps.local_loss).install()
    return lambda batch: steps.train(iter(batch))  # as the training loop steps


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


def plain_loop(cfg, bf16: bool = False, compiled: bool = False):
    """A step function of a plain PyTorch loop over the HF model on one global batch (under
    bf16 autocast with `bf16`, over `torch.compile(model)` with `compiled`)."""
    model = hf_model(cfg)
    device = next(model.parameters()).device
    forward = torch.compile(model) if compiled else model
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)
    params = dict(cfg.optimizer.optimizer_params or {})
    if "betas" in params:
        params["betas"] = tuple(params["betas"])
    opt = torch.optim.AdamW(
        model.parameters(), lr=cfg.optimizer.lr, weight_decay=cfg.optimizer.weight_decay, **params
    )
    clip = cfg.optimizer.gradient_clipping

    def step(batch):
        for (tokens, positions), (labels, mask) in batch:
            with autocast:
                logits = forward(tokens.to(device), position_ids=positions.to(device)).logits
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


def loss_chunks(args) -> list[int]:
    """`--loss-chunk-tokens`'s values: "0,256,1024" (0: the full logits)."""
    return [int(chunk) for chunk in args.loss_chunk_tokens.split(",") if chunk.strip()]


def add_loss_chunks_argument(parser) -> None:
    parser.add_argument("--loss-chunk-tokens", default="", metavar="N[,N...]",
                        help="add each engine with these loss_chunk_tokens (0: full logits; "
                        "the config's own value, null: the fused head's auto size, stays on "
                        "the other contenders)")  # fmt: skip


def contenders(args, parser, precision: str, batches, notes: list) -> dict:
    """Step functions by name for one precision, built from the same config."""
    sets = dict(precision=PRECISIONS[precision])
    compiled = args.compiled
    if compiled and precision == "bf16" and not torch.cuda.is_available():
        # the trainer refuses it before launch (megatron/config/checks/torch_compile.py)
        notes.append("bf16 compiled runs skipped: inductor's CPU code for bf16 does not build")
        compiled = False
    engines = {"pipeline": 1, "plain": 0}
    steps = {}
    for engine in args.engines.split(","):
        if engine not in engines:
            parser.error(f"--engines: '{engine}' is not one of {', '.join(engines)}")
        cfg = resolve(args.configs, args.overrides, pipe_parallel_size=engines[engine], **sets)
        steps[f"ours, {engine} engine"] = ours(cfg, batches)
        for chunk in loss_chunks(args):
            cfg = resolve(args.configs, args.overrides, pipe_parallel_size=engines[engine],
                          loss_chunk_tokens=chunk, **sets)  # fmt: skip
            steps[f"ours, {engine} engine, loss_chunk_tokens {chunk}"] = ours(cfg, batches)
    if compiled:
        cfg = resolve(args.configs, args.overrides, pipe_parallel_size=0, torch_compile=True,
                      **sets)  # fmt: skip
        steps["ours, plain engine, torch_compile"] = ours(cfg, batches)
    cfg = resolve(args.configs, args.overrides, **sets)
    steps[EAGER_LOOP] = plain_loop(cfg, bf16=precision == "bf16")
    if compiled:
        steps[f"{EAGER_LOOP}, torch.compile"] = plain_loop(cfg, precision == "bf16", True)
    return steps


EAGER_LOOP = "plain PyTorch loop, HF GPTNeoXForCausalLM"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("configs", nargs="*", default=["configs/small.yml", "configs/local.yml"])
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--engines", default="pipeline,plain")
    parser.add_argument("--precisions", default="fp32,bf16", help="of: fp32, bf16")
    parser.add_argument("--compiled", action="store_true", help="add the torch.compile'd runs")
    add_loss_chunks_argument(parser)
    add_vocab_size_argument(parser)
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="path of the JSON to write")
    args = parser.parse_args(argv)
    global VOCAB_SIZE
    VOCAB_SIZE = args.vocab_size
    out = Path(args.out).expanduser().resolve()
    os.environ.setdefault("MASTER_PORT", "29517")

    cfg = resolve(args.configs, args.overrides)
    total = args.warmup + args.steps
    batches = fixed_batches(cfg, total)
    tokens = args.steps * cfg.training.train_batch_size * cfg.model.seq_length
    flops = training_flops_per_token(shape_from_config(cfg))
    rows, notes = [], []
    for precision in args.precisions.split(","):
        if precision not in PRECISIONS:
            parser.error(f"--precisions: '{precision}' is not one of {', '.join(PRECISIONS)}")
        if precision == "bf16" and not bf16_supported():
            notes.append("bf16 skipped: this device has no bf16 kernels")
            continue
        steps = contenders(args, parser, precision, batches, notes)
        per_step = interleaved_seconds(steps, batches, args.warmup)
        loop_total, loop_median = sum(per_step[EAGER_LOOP]), statistics.median(per_step[EAGER_LOOP])
        for name, times in per_step.items():
            spent = sum(times)
            rows.append(
                {
                    "precision": precision,
                    "contender": name,
                    "seconds": spent,
                    "step_seconds": times,
                    "tokens_per_sec": tokens / spent,
                    "gflops_per_sec": tokens / spent * flops / 1e9,
                    "vs_eager_loop": loop_total / spent,
                    # the median step resists the load spikes of a shared machine
                    "vs_eager_loop_median_step": loop_median / statistics.median(times),
                }
            )
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else cpu_name()
    result = {
        "command": " ".join(["python", "bench/bench_train.py", *(argv or sys.argv[1:])]),
        "config": args.configs,
        "overrides": args.overrides,
        "device": device or "cpu",
        "bf16_kernels": bf16_supported(),
        "threads": torch.get_num_threads(),
        "load_average": os.getloadavg(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "steps": args.steps,
        "tokens_per_step": cfg.training.train_batch_size * cfg.model.seq_length,
        "model_flops_per_token": flops,
        "notes": notes,
        "rows": rows,
    }
    print(
        f"{'precision':9s} {'contender':58s} {'tokens/s':>9s} {'GFLOP/s':>8s} vs loop: total median"
    )
    for r in rows:
        print(
            f"{r['precision']:9s} {r['contender']:58s} {r['tokens_per_sec']:9,.0f} "
            f"{r['gflops_per_sec']:8.2f} {r['vs_eager_loop']:14.2f} "
            f"{r['vs_eager_loop_median_step']:6.2f}"
        )
    for note in notes:
        print(note)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
