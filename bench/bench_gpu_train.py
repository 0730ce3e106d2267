"""Training speed on one GPU: tokens/s, TFLOP/s, MFU and peak memory at Pythia shapes, ours
against a plain PyTorch loop over `transformers.GPTNeoXForCausalLM`.

    python bench/bench_gpu_train.py [--sizes 160M,410M,1.4B] [--steps 10] [--warmup 3]
        [--micro-batch N] [--set KEY=VALUE ...] [--peak-tflops T] [--out FILE]
        [--contenders ours-eager,ours-compile,ours-fp16,hf-eager,hf-compile] [--profile]
    python bench/bench_gpu_train.py --tiny        # a 2-layer toy on the CPU: the logic only

Shapes (seq 2048, GPT-2 vocabulary padded to 50304, parallel residual, rotary 25%, untied):
160M (12 × 768), 410M (24 × 1024), 1.4B (24 × 2048). Contenders, per shape:

- ours bf16, eager and `torch_compile: true`: DeepSpeed's plain engine (ZeRO 0), flash
  attention (`scaled_dot_product_attention`), AdamW (fused on a GPU); the better is "ours bf16";
- ours fp16 with dynamic loss scaling (eager), where the accelerator has fp16;
- the plain loop: the same-shape `GPTNeoXForCausalLM` (SDPA), bf16 autocast, fused AdamW,
  gradient clipping, eager and `torch.compile`d.

All train on the same synthetic batches (random tokens: speed does not depend on the data),
taking turns one global batch each after `--warmup` untimed ones, so a drifting machine slows
them alike (bench_train.py's rule). When the states of every contender would not fit in the
GPU's memory together (1.4B), each runs alone on the batches in turn (`"schedule"` in the
JSON). FLOPs are the honest count of `megatron/training/metrics/flops.py` (the model really built,
attention in full, no recomputation); MFU is against the device's dense peak for the
contender's precision (`--peak-tflops` overrides; none on a CPU). Peak memory is the
contender's resident state (weights, gradients, optimizer, compiled graphs) plus the largest
transient of its steps. Host syncs per step (CUDA only) are what `torch.cuda.set_sync_debug_mode`
flags in the timed steps (`host_sync_places`: by the Python line that caused each).
`--contenders` runs a subset; `--profile` adds one more step each under `torch.profiler`
(bench/gpu_profile.py: wall against device-busy time, kernel time by kind, the costliest
kernels). Prints a table and writes `bench/results/gpu_train_{device}.json`.

`--tiny` builds a 2-layer, 64-wide model with sequence 64 on whatever device is there (the
CPU in CI). On a CPU the bf16 contenders run in fp32 (torch.compile cannot compile our bf16
layers there, and no one trains bf16 on a CPU for speed) and the fp16 one is skipped; the
table and the JSON say which precision ran and what was skipped and why.
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import re
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_train import REPO, cpu_name, hf_model, ours  # noqa: E402  (puts the repo on sys.path)

from megatron.config import config_from_dict  # noqa: E402
from megatron.training.metrics.flops import (  # noqa: E402
    peak_tflops,
    shape_from_config,
    throughput,
    training_flops_per_token,
)

PYTHIA = dict(
    seq_length=2048,
    max_position_embeddings=2048,
    pos_emb="rotary",
    rotary_pct=0.25,
    gpt_j_residual=True,
    no_weight_tying=True,
    norm="layernorm",
    activation="gelu",
    init_method="small_init",
    output_layer_init_method="wang_init",
)
SHAPES = {
    "160M": dict(num_layers=12, hidden_size=768, num_attention_heads=12),
    "410M": dict(num_layers=24, hidden_size=1024, num_attention_heads=16),
    "1.4B": dict(num_layers=24, hidden_size=2048, num_attention_heads=16),
}
CONTENDER_IDS = ("ours-eager", "ours-compile", "ours-fp16", "hf-eager", "hf-compile")
MICRO_BATCH = {"160M": 8, "410M": 8, "1.4B": 4}
TINY = dict(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=64)
TINY.update(max_position_embeddings=64)
VOCAB = {"pythia": 50304, "tiny": 512}
FP16 = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000}
BYTES_PER_PARAM = 18  # bf16 weights and grads, fp32 master weights and two Adam moments


def settings(shape: dict, micro_batch: int, precision: str, compiled: bool, iters: int) -> dict:
    """Flat config keys of our run of `shape` (a single device, the plain engine)."""
    layers = shape["num_layers"]
    keys = {**PYTHIA, **shape}
    keys.update(
        attention_config=[[["flash"], layers]],
        pipe_parallel_size=0,
        model_parallel_size=1,
        precision={"bf16": "bfloat16", "fp16": "fp16", "fp32": "fp32"}[precision],
        optimizer={"type": "AdamW", "params": {"lr": 6.0e-4, "betas": [0.9, 0.95]}},
        weight_decay=0.01,
        gradient_clipping=1.0,
        train_iters=iters,
        train_micro_batch_size_per_gpu=micro_batch,
        gradient_accumulation_steps=1,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        torch_compile=compiled,
        distributed_backend="nccl" if torch.cuda.is_available() else "gloo",
        log_interval=10**6,
        steps_per_print=10**9,
    )
    if precision == "fp16":
        keys["fp16"] = FP16
    return keys


def synthetic_batches(cfg, count: int, vocab: int, device) -> list:
    """`count` global batches `[((tokens, positions), (labels, loss_mask))]` of random tokens
    below `vocab` (the tokenizer's, not the padded table's)."""
    gen = torch.Generator().manual_seed(cfg.training.seed)
    b, s = cfg.training.train_micro_batch_size_per_gpu, cfg.model.seq_length
    out = []
    for _ in range(count):
        text = torch.randint(0, vocab, (b, s + 1), generator=gen).to(device)
        positions = torch.arange(s, device=device).expand(b, s).contiguous()
        mask = torch.ones(b, s, device=device)
        out.append([((text[:, :-1].contiguous(), positions), (text[:, 1:].contiguous(), mask))])
    return out


def hf_loop(cfg, precision: str, compiled: bool):
    """A step of the plain loop: HF model (SDPA), bf16 autocast (none in fp32), fused AdamW,
    clipping."""
    model = hf_model(cfg)
    model.set_attn_implementation("sdpa")
    device = next(model.parameters()).device
    opt = torch.optim.AdamW(
        model.parameters(), lr=6.0e-4, betas=(0.9, 0.95), weight_decay=0.01, fused=True
    )
    forward = torch.compile(model) if compiled else model

    def step(batch):
        for (tokens, positions), (labels, mask) in batch:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                logits = forward(tokens, position_ids=positions).logits
            losses = torch.nn.functional.cross_entropy(
                logits.float().flatten(0, 1), labels.flatten(), reduction="none"
            )
            loss = (losses * mask.flatten()).sum() / mask.sum() / len(batch)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _allocated() -> int:
    return torch.cuda.memory_allocated() if torch.cuda.is_available() else 0


class Contender:
    """One contender: built with its first (untimed) step, then timed step by step. Memory
    (CUDA only): `resident` is what building and the first step left allocated (weights,
    gradients, optimizer states), `transient` the largest extra peak of a step."""

    def __init__(self, name: str, precision: str, make, first_batch):
        self.name, self.precision = name, precision
        before = _allocated()
        self.step = make()
        self.seconds, self.transient, self.syncs, self.timed = 0.0, 0, 0, 0
        self.sync_places = collections.Counter()  # file:line -> host syncs caused there
        self.profile, self.profile_table = None, ""
        self.run(first_batch, timed=False)
        self.resident = _allocated() - before

    def run(self, batch, timed: bool) -> None:
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        start = time.perf_counter()
        if cuda and timed:
            self.syncs += host_syncs(lambda: self.step(batch), self.sync_places)
            self.timed += 1
        else:
            self.step(batch)
        if cuda:
            torch.cuda.synchronize()
            self.transient = max(self.transient, torch.cuda.max_memory_allocated() - before)
        if timed:
            self.seconds += time.perf_counter() - start

    def run_profiled(self, batch) -> None:
        """`profile` (figures) and `profile_table` of one more step under torch.profiler
        (CUDA only; a profiler failure is recorded, not fatal)."""
        from gpu_profile import profile_step

        try:
            self.profile, self.profile_table = profile_step(self.step, batch)
        except Exception as err:  # noqa: BLE001 - the figures without it still stand
            self.profile, self.profile_table = {"error": f"{type(err).__name__}: {err}"}, ""

    def release(self) -> None:
        self.step = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def host_syncs(fn, where: collections.Counter | None = None) -> int:
    """How many times `fn()` made the host wait for the GPU, as torch's sync debug mode sees it
    (`.item()`, copies to the host, `nonzero` and the like; one warning each). `where` counts
    them by the Python line that caused each (the warning's origin)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    if where is not None:
        where.update(f"{Path(w.filename).name}:{w.lineno}" for w in syncs)
    return len(syncs)


def fp16_skip_reason() -> str | None:
    """Why fp16 cannot train here (DeepSpeed's accelerator decides), or None."""
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    if accelerator.is_fp16_supported():
        return None
    return (
        f"DeepSpeed's {accelerator.device_name()} accelerator has no fp16 support "
        "(fp16 with loss scaling needs a GPU)"
    )


def contenders(make_cfg, batches, mixed: str) -> list[tuple]:
    """`(name, precision, make, why skipped)` for one shape, in `CONTENDER_IDS`' order; `make`
    builds a step function. `mixed` is the precision of the bf16 contenders (fp32 on a CPU, see
    `main`)."""
    base = make_cfg(mixed, False)
    fp16_reason = fp16_skip_reason()
    return [
        (f"ours {mixed}, eager", mixed, lambda: ours(base, batches), None),
        (f"ours {mixed}, torch_compile", mixed, lambda: ours(make_cfg(mixed, True), batches), None),
        ("ours fp16, loss scaling", "fp16", lambda: ours(make_cfg("fp16", False), batches),
         fp16_reason),
        (f"plain loop, HF GPTNeoX {mixed}, eager", mixed, lambda: hf_loop(base, mixed, False),
         None),
        (f"plain loop, HF GPTNeoX {mixed}, torch.compile", mixed,
         lambda: hf_loop(base, mixed, True), None),
    ]  # fmt: skip


def fits_together(cfg, count: int) -> bool:
    """Whether `count` contenders' states fit on the GPU at once (always on a CPU)."""
    if not torch.cuda.is_available():
        return True
    from megatron.model import count_parameters

    states = count_parameters(cfg) * BYTES_PER_PARAM * count
    return states < 0.6 * torch.cuda.get_device_properties(0).total_memory


def measure(rows, batches, warmup: int, together: bool, profile: bool) -> list:
    """Built contenders with their timed seconds. Together: built in turn, then one global
    batch each in turn; else each alone over all the batches, released before the next.
    `profile`: then one more step each under the profiler (`Contender.run_profiled`)."""
    built = []
    if together:
        built = [Contender(n, p, make, batches[0]) for n, p, make, _ in rows]
        for i, batch in enumerate(batches[1:], start=1):
            for c in built:
                c.run(batch, timed=i >= warmup)
        for c in built if profile else ():
            c.run_profiled(batches[-1])
        return built
    for name, precision, make, _ in rows:
        c = Contender(name, precision, make, batches[0])
        for i, batch in enumerate(batches[1:], start=1):
            c.run(batch, timed=i >= warmup)
        if profile:
            c.run_profiled(batches[-1])
        c.release()
        built.append(c)
    return built


def figures(c: Contender, tokens: int, flops: float, peak_override) -> dict:
    """The JSON row of a measured contender."""
    speed = throughput(tokens, c.seconds, flops, 1, peak_tflops(c.precision, peak_override))
    memory = c.resident + c.transient if torch.cuda.is_available() else None
    return dict(
        contender=c.name,
        precision=c.precision,
        seconds=c.seconds,
        tokens_per_sec=speed.tokens_per_sec,
        tflops=speed.tflops_per_gpu,
        mfu=speed.mfu,
        peak_memory_gib=None if memory is None else memory / 2**30,
        host_syncs_per_step=c.syncs / c.timed if c.timed else None,
        host_sync_places=dict(c.sync_places.most_common()),
        **({"profile": c.profile} if c.profile is not None else {}),
    )


def bench_shape(name: str, shape: dict, vocab: int, args) -> dict:
    """Every contender on one shape: the JSON section of that shape."""
    micro = args.micro_batch or (2 if args.tiny else MICRO_BATCH[name])
    iters = args.warmup + args.steps

    def make_cfg(precision: str, compiled: bool):
        keys = settings(shape, micro, precision, compiled, iters)
        for item in args.overrides:
            key, _, value = item.partition("=")
            try:
                keys[key] = json.loads(value)
            except json.JSONDecodeError:
                keys[key] = value
        return config_from_dict(keys, vocab_size=vocab, world_size=1)

    cfg = make_cfg("bf16", False)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    batches = synthetic_batches(cfg, iters, vocab, device)
    tokens = args.steps * micro * cfg.model.seq_length
    flops = training_flops_per_token(shape_from_config(cfg))
    rows = [r for i, r in zip(CONTENDER_IDS, contenders(make_cfg, batches, args.mixed))
            if i in args.contenders]  # fmt: skip
    runnable = [r for r in rows if r[3] is None]
    together = fits_together(cfg, len(runnable))
    measured = measure(runnable, batches, args.warmup, together, args.profile)
    args.profile_tables += [(name, c.name, c.profile_table) for c in measured if c.profile_table]
    results = [figures(c, tokens, flops, args.peak_tflops) for c in measured]
    ours_mixed = [r for r in results if r["contender"].startswith(f"ours {args.mixed}")]
    return dict(
        shape=name,
        model={k: getattr(cfg.model, k) for k in ("num_layers", "hidden_size", "seq_length")},
        padded_vocab_size=cfg.model.padded_vocab_size,
        micro_batch=micro,
        tokens_per_step=micro * cfg.model.seq_length,
        model_flops_per_token=flops,
        schedule="alternating" if together else "one at a time (states do not fit together)",
        rows=results,
        ours_best=max(ours_mixed, key=lambda r: r["tokens_per_sec"])["contender"]
        if ours_mixed
        else None,
        skipped=[{"contender": n, "reason": why} for n, _, _, why in rows if why is not None],
    )


def print_table(section: dict) -> None:
    print(f"\n{section['shape']}: {section['schedule']}, {section['tokens_per_step']} tokens/step")
    print(f"{'contender':44s} {'tokens/s':>11s} {'TFLOP/s':>9s} {'MFU':>7s} {'peak GiB':>9s} "
          f"{'syncs':>6s}")  # fmt: skip
    for r in section["rows"]:
        mfu = "-" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
        mem = "-" if r["peak_memory_gib"] is None else f"{r['peak_memory_gib']:.2f}"
        syncs = "-" if r["host_syncs_per_step"] is None else f"{r['host_syncs_per_step']:g}"
        print(
            f"{r['contender']:44s} {r['tokens_per_sec']:11,.0f} {r['tflops']:9.3f} {mfu:>7s} "
            f"{mem:>9s} {syncs:>6s}"
        )
    for s in section["skipped"]:
        print(f"skipped {s['contender']}: {s['reason']}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default=",".join(SHAPES))
    parser.add_argument("--tiny", action="store_true", help="a 2-layer toy (CPU, CI)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3, help="untimed batches (at least 1)")
    parser.add_argument("--micro-batch", type=int, default=None)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--peak-tflops", type=float, default=None)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--contenders",
        default=",".join(CONTENDER_IDS),
        help=f"comma-separated, of {', '.join(CONTENDER_IDS)}",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="one more step each under torch.profiler (kernels on CUDA): figures in "
        "the JSON, the profiler's tables beside it (*_profile.txt)",
    )
    args = parser.parse_args(argv)
    args.contenders = args.contenders.split(",")
    unknown = [c for c in args.contenders if c not in CONTENDER_IDS]
    if unknown:
        parser.error(f"--contenders: {unknown} not among {', '.join(CONTENDER_IDS)}")
    args.profile_tables = []
    if args.warmup < 1 or args.steps < 1:
        parser.error("--warmup and --steps must be at least 1")
    import os

    os.environ.setdefault("MASTER_PORT", "29519")
    if args.tiny:
        shapes = {"tiny": TINY}
    else:
        unknown = [s for s in args.sizes.split(",") if s not in SHAPES]
        if unknown:
            parser.error(f"--sizes: {unknown} not among {', '.join(SHAPES)}")
        shapes = {s: SHAPES[s] for s in args.sizes.split(",")}
    vocab = 512 if args.tiny else 50257
    # bf16 needs a GPU here: torch.compile's C++ (CPU) backend cannot compile our bf16 layers
    # (megatron/config/checks/torch_compile.py), and CPU bf16 measures nothing a GPU user wants.
    args.mixed = "bf16" if torch.cuda.is_available() else "fp32"
    sections = [bench_shape(name, shape, vocab, args) for name, shape in shapes.items()]
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else cpu_name()
    result = dict(device=device, torch=torch.__version__, steps=args.steps, warmup=args.warmup,
                  mixed_precision=args.mixed, overrides=args.overrides,
                  shapes=sections)  # fmt: skip
    for section in sections:
        print_table(section)
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")
    out = args.out or REPO / "bench" / "results" / f"gpu_train_{'tiny_' * args.tiny}{slug}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    if args.profile_tables:
        tables = out.with_name(out.stem + "_profile.txt")
        tables.write_text("".join(f"== {shape}: {name}\n{table}\n"
                                  for shape, name, table in args.profile_tables))  # fmt: skip
        print(f"wrote {tables}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
