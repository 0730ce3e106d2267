"""Bytes sent per step and validation loss: Distro (DisTrO/DeMo) against AdamW's all-reduce.

    python bench/bench_distro.py [configs/small.yml configs/local.yml] [--steps 100]
                                 [--set KEY=VALUE ...] [--tiny] [--out FILE]

Trains the config's model with 2 data-parallel ranks (CPU gloo processes) twice, with the same
data, schedule and steps: once with the config's optimizer (AdamW in `configs/small.yml`; the
engine all-reduces the gradients) and once with `Distro` at Psyche's defaults (chunk 64, top-k
8, decay 0.999, 1-bit; same lr and schedule). The bytes are measured at the communication
calls: every `torch.distributed` collective (which DeepSpeed's own calls reach too) is wrapped,
and during training steps (not evaluation) the bytes of the tensors each rank passes to it
are added up, per collective. Reports bytes per step per rank, the ratio, and the validation
loss after the last step; prints a table and writes `bench/results/distro_{name}.json`.

`--tiny` shrinks the model (2 layers, 64 wide, sequence 32) so that the logic runs in CI
(tests/unit/bench/test_bench_distro.py).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import socket
import sys
import tempfile
from collections import Counter
from pathlib import Path
from queue import Empty

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DISTRO = {"compression_chunk": 64, "compression_topk": 8, "compression_decay": 0.999,
          "quantize_1bit": True}  # fmt: skip
TINY = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32,
        "max_position_embeddings": 32, "train_micro_batch_size_per_gpu": 2,
        "eval_iters": 1, "attention_config": [[["flash"], 2]]}  # fmt: skip
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor",
               "broadcast", "reduce", "all_to_all_single", "all_reduce_coalesced")  # fmt: skip


def _bytes(x) -> int:
    if torch.is_tensor(x):
        return x.numel() * x.element_size()
    if isinstance(x, list | tuple):
        return sum(_bytes(t) for t in x)
    return 0


class ByteCounter:
    """Wraps torch.distributed's collectives; counts the bytes this rank passes in while on."""

    def __init__(self):
        self.on, self.sent = False, Counter()

    def install(self) -> None:
        for name in COLLECTIVES:
            real = getattr(dist, name, None)
            if real is not None:
                setattr(dist, name, self._wrap(name, real))

    def _wrap(self, name, real):
        def counted(*args, **kwargs):
            if self.on:
                self.sent[name] += _bytes(_sent(name, args, kwargs))
            return real(*args, **kwargs)

        return counted


# The argument holding what this rank sends: (position, keyword names). DeepSpeed passes
# keywords (`torch.distributed.all_reduce(tensor=..., ...)`); our code passes positions.
_SENT = {
    "all_gather": (1, ("tensor",)),
    "all_gather_into_tensor": (1, ("input_tensor",)),
    "reduce_scatter_tensor": (1, ("input",)),
    "all_to_all_single": (1, ("input",)),
    "all_reduce_coalesced": (0, ("tensors",)),
}


def _sent(name, args, kwargs):
    position, keywords = _SENT.get(name, (0, ("tensor",)))
    if len(args) > position:
        return args[position]
    return next((kwargs[k] for k in keywords if k in kwargs), None)


def resolve(files, overrides, **changes):
    from megatron.config import load_config
    from megatron.data import build_tokenizer

    sets = overrides + [f"{k}={json.dumps(v)}" for k, v in changes.items()]
    cfg = load_config(files, sets, world_size=2, warn=[])
    vocab = build_tokenizer(cfg).vocab_size
    return load_config(files, sets, world_size=2, vocab_size=vocab, warn=[])


def train_one(cfg, counter: ByteCounter) -> dict:
    """Train `cfg`, counting collective bytes during training steps only."""
    # the module (the package exports a function of the same name)
    pretrain_module = importlib.import_module("megatron.training.pretrain")

    real_steps = pretrain_module.engine_steps

    def counted_steps(*args, **kwargs):
        steps = real_steps(*args, **kwargs)
        train = steps.train  # the loop's train step (train_step reads its loss on the host)

        def counted_train(batches):
            counter.on = True
            try:
                return train(batches)
            finally:
                counter.on = False

        steps.train = counted_train
        return steps

    pretrain_module.engine_steps = counted_steps
    counter.sent.clear()
    try:
        result = pretrain_module.pretrain(cfg)
    finally:
        pretrain_module.engine_steps = real_steps
    steps = len(result.losses)
    from megatron.model import count_parameters

    return {
        "parameters": count_parameters(cfg),
        "steps": steps,
        "bytes_per_step": sum(counter.sent.values()) / steps,
        "bytes_per_step_by_collective": {k: v / steps for k, v in sorted(counter.sent.items())},
        "valid_loss": result.valid.loss if result.valid else None,
        "first_loss": result.losses[0],
        "last_loss": result.losses[-1],
    }


def _worker(rank, port, args, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                      DS_ACCELERATOR="cpu")  # fmt: skip
    dist.init_process_group("gloo", rank=rank, world_size=2)
    counter = ByteCounter()
    counter.install()
    changes = dict(TINY if args.tiny else {}, train_iters=args.steps, eval_interval=args.steps,
                   save=None, load=None, checkpoint_factor=None, distributed_backend="gloo",
                   log_dir=str(Path(args.work) / "logs"))  # fmt: skip
    base = resolve(args.files, args.set, **changes)
    lr = base.optimizer.lr
    rows = {}
    for name, optimizer in (
        (base.optimizer.optimizer_type, None),
        ("Distro", {"type": "Distro", "params": {"lr": lr, **DISTRO}}),
    ):
        if optimizer is None:
            cfg = base
        else:
            cfg = resolve(args.files, args.set, **changes, optimizer=optimizer)
        rows[name] = train_one(cfg, counter)
    queue.put((rank, rows))
    dist.destroy_process_group()


def run(args) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(os.environ.get("MASTER_PORT", s.getsockname()[1]))
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, port, args, queue)) for r in range(2)]
    for p in procs:
        p.start()
    results = {}
    while len(results) < len(procs):  # a rank that dies reports nothing: do not wait forever
        try:
            rank, rows = queue.get(timeout=5)
        except Empty:
            if any(p.exitcode not in (None, 0) for p in procs):
                codes = [p.exitcode for p in procs]
                raise SystemExit(f"a rank failed (exit codes {codes}); see its traceback") from None
            continue
        results[rank] = rows
    for p in procs:
        p.join()
        if p.exitcode:
            raise SystemExit(f"a rank failed (exit code {p.exitcode})")
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="*", default=["configs/small.yml", "configs/local.yml"])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--set", action="append", default=[], help="KEY=VALUE override")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer toy (CI)")
    parser.add_argument("--work", default=None, help="log folder (default: a temporary one)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    args.work = args.work or tempfile.mkdtemp(prefix="bench_distro_")
    per_rank = run(args)
    rows = per_rank[0]
    adamw, distro = list(rows.values())
    result = {
        "config": args.files,
        "overrides": args.set + (["--tiny"] if args.tiny else []),
        "data_parallel_ranks": 2,
        "cpu": platform.processor() or platform.machine(),
        "distro_params": DISTRO,
        "rows": {
            name: {**row, "bytes_per_step_rank1": per_rank[1][name]["bytes_per_step"]}
            for name, row in rows.items()
        },  # fmt: skip
        "bytes_ratio": adamw["bytes_per_step"] / distro["bytes_per_step"],
    }
    header = f"{'optimizer':<10} {'bytes/step/rank':>16} {'valid loss':>11}"
    print(f"{header} {'first→last train loss':>22}")
    for name, row in rows.items():
        print(f"{name:<10} {row['bytes_per_step']:>16,.0f} {row['valid_loss']:>11.4f} "
              f"{row['first_loss']:>10.4f} → {row['last_loss']:.4f}")  # fmt: skip
    print(f"AdamW sends {result['bytes_ratio']:.1f}× the bytes of Distro per step")
    name = "tiny" if args.tiny else "small_cpu"
    out = Path(args.out) if args.out else REPO / "bench" / "results" / f"distro_{name}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
