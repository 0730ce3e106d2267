"""The GPU acceptance run: every GPU-only part of the trainer, in one bounded run.

    python bench/gpu_check.py --out DIR [--budget-s 540] [--only NAME,...]
    python bench/gpu_check.py --out DIR --cpu     # the same steps at tiny sizes, on the CPU

Writes `DIR/gpu_check.json` (the schema: `CHECK_KEYS`, `STEP_KEYS`) and `DIR/gpu_check.log`
(every step's full output); the training runs write under `--work` (default `DIR/runs`). Each
step runs in its own process under its own time limit; a failure, a time-out or a crash is
recorded and the run goes on. Steps are taken in the order of
`plan()`, most telling first; once `--budget-s` is spent the rest are recorded as skipped.

Steps (GPU; `--cpu` runs the same ones at tiny sizes where the CPU can, and records why not):
- `environment`: device, torch, CUDA, nvcc, DeepSpeed, which fused kernels are built;
- `gpu_tests`: `pytest -m gpu tests` (the kernels against their references, fused AdamW, fp16
  loss scaling in DeepSpeed's engine, the GPU model paths, two data-parallel ranks on the one
  GPU over `cuda:gloo`); a module that fails to import is counted, not the end of the suite;
- `train_bench`: bench/bench_gpu_train.py at 160M (ours eager and compiled, fp16, against the
  plain Hugging Face loop eager and compiled): tokens/s, TFLOP/s, MFU, peak memory, host syncs
  per step counted by `torch.cuda.set_sync_debug_mode` against the CPU audit's prediction, and
  one more step each under torch.profiler (kernel time by kind, the costliest kernels;
  `train_bench_profile.txt`); `train_bench_mb16`: ours and the compiled loop at micro-batch 16;
- `deepy_*`: real `deepy.py` runs of configs/160M.yml on one GPU (NCCL): the pipeline engine
  bf16, the plain engine bf16, fp16 with forced overflow, fused kernels on and off,
  torch_compile, MoE bf16, most saving and then resuming (`resume_*`: the first resumed loss
  equal to the unbroken run's, the later ones within `RESUME_RTOL`); figures from their
  `metrics.jsonl`;
- `dpo_data`, `deepy_sft`, `deepy_dpo`, `resume_dpo`: the embedded preference set, a short SFT
  run, DPO from it, and DPO resumed (its reference model must be the SFT weights again);
- `bench_softmax`, `bench_rotary`: the fused kernels against PyTorch at two sizes each.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
CHECK_KEYS = ("mode", "started", "budget_s", "seconds", "environment", "steps", "summary")
STEP_KEYS = ("name", "status", "seconds", "returncode", "metrics", "reason", "tail")
STATUSES = ("passed", "failed", "timeout", "skipped")
# What the CPU audit (tests/unit/training/test_host_reads_matrix.py) says one optimizer step
# of these contenders reads from the device: the loss, once.
PREDICTED_SYNCS = {"ours": 1}
RESUME_RTOL = 1e-3

# The 160M model of configs/160M.yml, shortened to a few steps; `--cpu` shrinks it further.
SHORT = dict(log_interval=1, eval_interval=0, steps_per_print=10**6,
             train_micro_batch_size_per_gpu=4, checkpoint_activations=False,
             partition_activations=False, num_gpus=1, data_impl="dummy",
             keep_last_n_checkpoints=None)  # fmt: skip
TINY = dict(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=64,
            max_position_embeddings=64, train_micro_batch_size_per_gpu=2,
            distributed_backend="gloo", attention_config=[[["flash"], 2]],
            scaled_upper_triang_masked_softmax_fusion=False)  # fmt: skip
# 2**25: above what 160M's first gradients fit in fp16 (2**20 to 2**22 did, on an H200), so the
# first steps overflow, are skipped and halve the scale; the resume restores the scaler's state.
FP16 = {"enabled": True, "loss_scale": 0, "initial_scale_power": 25, "loss_scale_window": 2,
        "hysteresis": 1, "min_loss_scale": 1}  # fmt: skip
MOE = dict(moe_num_experts=8, moe_top_k=2, moe_router_type="topk", moe_expert_interval=2,
           moe_aux_loss_coeff=0.01, moe_token_dropping=False)  # fmt: skip
FUSED = dict(attention_config=[[["global"], 12]], scaled_upper_triang_masked_softmax_fusion=True,
             rope_fusion=True)  # fmt: skip
UNFUSED = dict(FUSED, scaled_upper_triang_masked_softmax_fusion=False, rope_fusion=False)


@dataclass
class Step:
    name: str
    argv: list[str] | None = None
    timeout: int = 60
    run: object = None  # a callable(step, out) -> metrics, instead of argv
    parse: object = None  # callable(step, out, output) -> metrics
    pre: object = None  # callable() run first (its failure fails the step)
    skip: str | None = None


def python() -> list[str]:
    return [sys.executable, "-u"]


def environment() -> dict:
    import torch

    env = dict(python=platform.python_version(), torch=torch.__version__,
               cuda=torch.version.cuda, machine=platform.machine())  # fmt: skip
    if torch.cuda.is_available():
        env.update(device=torch.cuda.get_device_name(),
                   capability=torch.cuda.get_device_capability(),
                   memory_gib=torch.cuda.get_device_properties(0).total_memory / 2**30,
                   bf16_matmul_tflops=matmul_tflops())  # fmt: skip
    for name in ("deepspeed", "transformers"):
        try:
            env[name] = __import__(name).__version__
        except Exception as err:  # noqa: BLE001 - recorded, the steps that need it fail
            env[name] = f"not importable: {err}"
    nvcc = shutil.which("nvcc")
    if nvcc:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
        env["nvcc"] = out.strip().splitlines()[-1] if out.strip() else "?"
    from megatron.kernels.loader import extension_status

    env["fused_kernels_built"] = extension_status()
    return env


def matmul_tflops(n: int = 8192, repeats: int = 10) -> float:
    """The bf16 rate a large matrix product reaches here (random data, mean of `repeats` after
    three warm-ups): the ceiling MFU's datasheet peak is compared with."""
    import torch

    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        a @ b
    end.record()
    end.synchronize()
    return 2 * n**3 * repeats / (start.elapsed_time(end) / 1e3) / 1e12


def shipped_config(name: str, folder: Path, cpu: bool, data: Path | None = None, **keys) -> Path:
    """configs/{name} as this run's one config file: its `data/...` paths moved under `data`,
    logs in `folder`, logged every step, `keys` on top."""
    import yaml

    def moved(value):
        if isinstance(value, str) and value.startswith("data/") and data is not None:
            return str(data / value[len("data/") :])
        return [moved(v) for v in value] if isinstance(value, list) else value

    folder.mkdir(parents=True, exist_ok=True)
    settings = {
        k: moved(v) for k, v in yaml.safe_load((REPO / "configs" / name).read_text()).items()
    }
    settings.update(log_dir=str(folder / "logs"), log_interval=1, eval_interval=0,
                    precision="fp32" if cpu else "bfloat16", num_gpus=1)  # fmt: skip
    if cpu:
        settings["distributed_backend"] = "gloo"
    settings.update(keys)
    path = folder / "run.yml"
    path.write_text(json.dumps(settings, indent=1))
    return path


def run_config(folder: Path, cpu: bool, **keys) -> Path:
    """configs/160M.yml shortened (`SHORT`; tiny with --cpu), with this run's `keys`."""
    if cpu:
        sized = dict(TINY, tokenizer_type="CharLevelTokenizer")
        if "attention_config" in keys:  # the run's attention, on TINY's 2 layers
            keys = dict(keys, attention_config=[[keys["attention_config"][0][0], 2]])
    else:
        from megatron.data.embedded import gpt2_tokenizer_files

        vocab, merges = gpt2_tokenizer_files()
        sized = dict(tokenizer_type="GPT2BPETokenizer", vocab_file=str(vocab),
                     merge_file=str(merges))  # fmt: skip
    return shipped_config("160M.yml", folder, cpu, **{**SHORT, **sized, **keys})


def deepy(config: Path) -> list[str]:
    return [*python(), "deepy.py", "train.py", str(config)]


def run_and_resume(name: str, folder: Path, again: Path, config, keys: dict, at: int | None,
                   timeout: int, cpu: bool) -> list[Step]:  # fmt: skip
    """`deepy_{name}`: a run of `config(folder, **keys)` (on a GPU with its memory plan); with
    `at`, `resume_{name}`: the run again from its checkpoint of iteration `at` (saved under
    `keys["save"]`), in `again`, its losses held to the first run's (`resume_figures`)."""
    path = config(folder, **keys)
    first = Step(f"deepy_{name}", argv=deepy(path), timeout=timeout)
    planned = (lambda: {}) if cpu else (lambda: planned_figures(path))
    first.parse = lambda s, o, t: {**train_figures(folder), **planned()}
    if at is None:
        return [first]
    ckpt = Path(keys["save"])
    resumed = dict(keys, load=str(ckpt), save=None, checkpoint_factor=None, finetune=False)
    step = Step(f"resume_{name}", argv=deepy(config(again, **resumed)), timeout=timeout)
    step.pre = lambda: point_latest(ckpt, at)
    step.parse = lambda s, o, t: resume_figures(folder, again, at)
    return [first, step]


def dpo_steps(work: Path, cpu: bool, timeout: int) -> list[Step]:
    """The embedded preference set, 4 SFT steps, then DPO from them saving at 3 of 6 steps, and
    the DPO run resumed from step 3 (its reference model must be the SFT weights again)."""
    data, sft = work / "dpo_data", work / "sft"
    prep = Step("dpo_data", timeout=timeout)
    prep.argv = [*python(), "tools/make_preference_data.py", "--data-dir", str(data),
                 "--n-train", "256", "--n-valid", "32", "--seq-length", "64"]  # fmt: skip

    def config(name):
        return lambda folder, **keys: shipped_config(name, folder, cpu, data, **keys)

    sft_keys = dict(train_iters=4, save=str(sft / "ckpt"), load=None, checkpoint_factor=4)
    dpo_keys = dict(train_iters=6, save=str(work / "dpo" / "ckpt"), load=str(sft / "ckpt"),
                    checkpoint_factor=3)  # fmt: skip
    return [
        prep,
        *run_and_resume("sft", sft, None, config("sft-small.yml"), sft_keys, None, timeout, cpu),
        *run_and_resume(
            "dpo",
            work / "dpo",
            work / "dpo_resumed",
            config("dpo-small.yml"),
            dpo_keys,
            3,
            timeout,
            cpu,
        ),  # fmt: skip
    ]


def records(folder: Path) -> list[dict]:
    path = folder / "logs" / "metrics.jsonl"
    if not path.exists():
        return []
    return [r for r in map(json.loads, path.read_text().splitlines()) if "split" not in r]


def planned_figures(config: Path) -> dict:
    """The memory plan of the run's config (`tools/plan.py --json`, for this machine's GPU):
    its allocated peak, which the run's `max_memory_allocated_gib` is compared with."""
    run = subprocess.run([*python(), "tools/plan.py", str(config), "--json"], cwd=REPO,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    if run.returncode != 0:
        return {"planned_error": run.stderr.strip()[-2000:]}
    plan = json.loads(run.stdout)
    stage = plan["stages"][plan["heaviest_stage"]]
    return {
        "planned_allocated_gib": stage["allocated"] / 2**30,
        "planned_total_gib": stage["total"] / 2**30,
        "planned_for": plan["machine"]["name"],
    }


def train_figures(folder: Path) -> dict:
    """Losses and speed of a run from its metrics.jsonl. Speed: the median over the steps after
    the first (which compiles and warms up; a step that saved a checkpoint is an outlier too)."""
    rows = records(folder)
    if not rows:
        return {"records": 0}
    timed = rows[1:] or rows

    def median(key: str):
        values = sorted(r[key] for r in timed if r.get(key) is not None)
        return values[len(values) // 2] if values else None

    return dict(
        records=len(rows), losses=[r["loss"] for r in rows],
        skipped=sum(r["skipped"] for r in rows), loss_scales=[r["loss_scale"] for r in rows],
        tokens_per_sec=median("tokens_per_sec"), tflops_per_gpu=median("tflops_per_gpu"),
        mfu=median("mfu"), max_memory_allocated_gib=rows[-1].get("max_memory_allocated_gib"),
    )  # fmt: skip


def deepy_steps(work: Path, cpu: bool, name: str, keys: dict, resume: bool, timeout: int) -> list:
    """A deepy.py run of 160M.yml + `keys`, and (resume) its exact resume from the middle."""
    iters = 6 if resume else 4
    base = dict(keys, train_iters=iters, save=str(work / name / "ckpt") if resume else None,
                checkpoint_factor=iters // 2 if resume else None)  # fmt: skip
    config = lambda folder, **k: run_config(folder, cpu, **k)  # noqa: E731
    return run_and_resume(name, work / name, work / f"{name}_resumed", config, base,
                          iters // 2 if resume else None, timeout, cpu)  # fmt: skip


def point_latest(ckpt: Path, iteration: int) -> None:
    """Make the checkpoint of `iteration` the one a run loads (DeepSpeed's `latest` file)."""
    tag = f"global_step{iteration}"
    if not (ckpt / tag).is_dir():
        raise FileNotFoundError(f"{ckpt / tag}: the first run saved no checkpoint there")
    (ckpt / "latest").write_text(tag)


def resume_figures(first: Path, resumed: Path, at: int) -> dict:
    """The resumed run's losses against the unbroken run's for the same iterations: the first
    resumed step (the restored weights on the same batch) exactly, the later ones within
    `RESUME_RTOL` (a GPU's backward may add in another order: atomics, split-K)."""
    whole = {r["iteration"]: r["loss"] for r in records(first)}
    again = {r["iteration"]: r["loss"] for r in records(resumed)}
    pairs = [(whole[i], again[i]) for i in sorted(again) if i in whole]
    if not pairs or min(again) != at + 1:
        raise AssertionError(f"resumed iterations {sorted(again)}; expected from {at + 1}")
    diff = max(abs(a - b) for a, b in pairs)
    if pairs[0][0] != pairs[0][1] or diff > RESUME_RTOL * max(abs(a) for a, _ in pairs):
        raise AssertionError(f"resumed losses (unbroken, resumed) differ: {pairs}")
    return dict(iterations=sorted(again), max_abs_loss_difference=diff)


def plan(out: Path, cpu: bool, work: Path | None = None) -> list[Step]:
    work = work or out / "runs"
    t = (lambda gpu, tiny: tiny) if cpu else (lambda gpu, tiny: gpu)  # noqa: E731
    steps = [Step("environment", run=lambda s, o: environment(), timeout=60)]
    sized = ["--tiny", "--steps", "3", "--warmup", "1"] if cpu else ["--sizes", "160M"]
    for name, extra in (("train_bench", ["--profile"]),
                        ("train_bench_mb16", ["--micro-batch", str(t(16, 4)), "--contenders",
                                              "ours-eager,ours-compile,hf-compile"])):  # fmt: skip
        bench, path = Step(name, timeout=t(240, 200)), out / f"{name}.json"
        bench.argv = [*python(), "bench/bench_gpu_train.py", "--out", str(path), *sized,
                      *([] if cpu else ["--steps", "8", "--warmup", "3"]), *extra]  # fmt: skip
        bench.parse = lambda s, o, text, path=path: bench_figures(path)
        steps.append(bench)
    steps_after_runs = dpo_steps(work, cpu, t(120, 150))
    for bench_name, sizes in (("softmax", ["--seqs", "2048", "8192"]),
                              ("rotary", ["--rotary-pct", "1.0", "0.25"])):  # fmt: skip
        step = Step(f"bench_{bench_name}", timeout=90, skip="needs a CUDA GPU" if cpu else None)
        step.argv = [*python(), f"bench/bench_{bench_name}.py", *sizes, "--out",
                     str(out / f"bench_{bench_name}.json")]  # fmt: skip
        path = out / f"bench_{bench_name}.json"
        step.parse = lambda s, o, text, path=path: json.loads(path.read_text())
        steps.append(step)
    gpu_only = "the CPU has no fp16 training, fused CUDA kernels or bf16 torch.compile"
    runs = [
        ("pipeline_bf16", dict(precision="bfloat16"), True, None),
        ("plain_bf16", dict(precision="bfloat16", pipe_parallel_size=0), True, None),
        ("fp16_overflow", dict(precision="fp16", fp16=FP16, pipe_parallel_size=0), True, gpu_only),
        ("fused_on", dict(FUSED, precision="bfloat16", pipe_parallel_size=0), False, gpu_only),
        ("fused_off", dict(UNFUSED, precision="bfloat16", pipe_parallel_size=0), False, None),
        ("torch_compile", dict(precision="bfloat16", pipe_parallel_size=0, torch_compile=True),
         False, gpu_only),
        ("moe_bf16", dict(MOE, precision="bfloat16", pipe_parallel_size=0), True, None),
    ]  # fmt: skip
    for i, (name, keys, resume, cpu_skip) in enumerate(runs):
        for step in deepy_steps(work, cpu, name, keys, resume, t(120, 150)):
            step.skip = cpu_skip if cpu else None
            steps.append(step)
        if i == 0:  # the pytest GPU suite after the first real run and its resume
            pytest = ["-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
                      "--continue-on-collection-errors", "tests"]  # fmt: skip
            tests = Step("gpu_tests", argv=[*python(), *pytest], timeout=t(180, 120))
            tests.parse = lambda s, o, text: pytest_counts(text)
            steps.append(tests)

    return steps + steps_after_runs


def pytest_counts(text: str) -> dict:
    import re

    last = [ln for ln in text.splitlines() if re.search(r"\d+ (passed|failed|skipped|error)", ln)]
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)", last[-1])}
    if counts.get("failed") or counts.get("error") or counts.get("errors"):
        raise AssertionError(f"pytest: {last[-1].strip()}")
    return counts


def bench_figures(path: Path) -> dict:
    """bench_gpu_train.py's rows per shape, ours with the audit's predicted host syncs."""
    result = json.loads(path.read_text())
    for section in result["shapes"]:
        for row in section["rows"]:
            kind = row["contender"].split()[0]
            row["predicted_host_syncs_per_step"] = PREDICTED_SYNCS.get(kind)
    return {s["shape"]: s["rows"] for s in result["shapes"]}


def run_step(step: Step, out: Path, log, left: float) -> dict:
    started = time.monotonic()
    rec = dict(name=step.name, status="passed", seconds=0.0, returncode=None, metrics=None,
               reason=None, tail=None)  # fmt: skip
    log.write(f"\n===== {step.name} =====\n")
    log.flush()
    if step.skip:
        rec.update(status="skipped", reason=step.skip)
        return rec
    timeout = min(step.timeout, max(left, 1))
    text = ""
    try:
        if step.pre:
            step.pre()
        if step.run:
            rec["metrics"] = step.run(step, out)
        else:
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            done = subprocess.run(step.argv, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, timeout=timeout,
                                  start_new_session=True)  # fmt: skip
            text = done.stdout
            rec["returncode"] = done.returncode
            if done.returncode != 0:
                rec.update(status="failed", reason=f"exit status {done.returncode}")
            elif step.parse:
                rec["metrics"] = step.parse(step, out, text)
    except subprocess.TimeoutExpired as err:
        text = err.stdout or ""
        text = text.decode(errors="replace") if isinstance(text, bytes) else text
        rec.update(status="timeout", reason=f"still running after {timeout:.0f} s")
    except Exception as err:  # noqa: BLE001 - a failed check is a result, not the end of the run
        rec.update(status="failed", reason=f"{type(err).__name__}: {err}")
    log.write(text)
    log.flush()
    if rec["status"] != "passed":
        rec["tail"] = text[-2500:]
    rec["seconds"] = round(time.monotonic() - started, 1)
    return rec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the JSON and log")
    parser.add_argument("--cpu", action="store_true", help="tiny sizes on the CPU (CI)")
    parser.add_argument("--budget-s", type=float, default=540.0, help="wall-clock budget")
    parser.add_argument(
        "--work",
        type=Path,
        default=None,
        help="folder for the training runs' checkpoints (default: OUT/runs)",
    )
    parser.add_argument("--only", default="", help="comma-separated step names (prefixes)")
    args = parser.parse_args(argv)
    if not args.cpu:
        import torch

        if not torch.cuda.is_available():
            parser.error("no CUDA GPU here (torch.cuda.is_available() is False); use --cpu")
    else:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    args.out.mkdir(parents=True, exist_ok=True)
    steps = plan(args.out, args.cpu, args.work)
    if args.only:
        wanted = tuple(args.only.split(","))
        steps = [s for s in steps if s.name == "environment" or s.name.startswith(wanted)]
    start = time.monotonic()
    check = dict(mode="cpu" if args.cpu else "gpu", started=time.strftime("%Y-%m-%dT%H:%M:%S"),
                 budget_s=args.budget_s, seconds=0.0, environment=None, steps=[],
                 summary={})  # fmt: skip
    with open(args.out / "gpu_check.log", "w") as log:
        for step in steps:
            left = args.budget_s - (time.monotonic() - start)
            if left <= 5:
                rec = dict(name=step.name, status="skipped", seconds=0.0, returncode=None,
                           metrics=None, reason="the run's budget was spent",
                           tail=None)  # fmt: skip
            else:
                rec = run_step(step, args.out, log, left)
            if step.name == "environment" and rec["metrics"]:
                check["environment"] = rec["metrics"]
            check["steps"].append(rec)
            print(f"{rec['status']:8s} {rec['seconds']:6.1f}s  {step.name}"
                  + (f"  ({rec['reason']})" if rec["reason"] else ""), flush=True)  # fmt: skip
            check["seconds"] = round(time.monotonic() - start, 1)
            check["summary"] = {s: sum(r["status"] == s for r in check["steps"]) for s in STATUSES}
            (args.out / "gpu_check.json").write_text(json.dumps(check, indent=1) + "\n")
    print(f"{check['summary']} in {check['seconds']} s; wrote {args.out / 'gpu_check.json'}")
    return 0 if not check["summary"]["failed"] and not check["summary"]["timeout"] else 1


if __name__ == "__main__":
    sys.exit(main())
