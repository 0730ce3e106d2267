#!/usr/bin/env python
"""Launch a worker script on every rank with one validated config.

    python deepy.py train.py configs/160M.yml local.yml [--set train_iters=20] [--dry-run [--json]]
        [--verbose]
    python deepy.py --describe [KEY] [--markdown]

The config files are merged, validated and resolved here, before anything starts: a bad config,
an optional package the config needs but this Python lacks (with the pip command that installs
it) or a `master_port` already in use exits with status 2, a message naming the file and key,
and launches nothing. A user error that only a worker can see (a corrupt data or checkpoint
file, a combination refused on the worker) also exits with status 2, its message printed once
with the ranks it stopped, and nothing else (its traceback with `--verbose`), while a bug keeps
its traceback on the console (megatron/launcher/failures.py). Without `master_port`, a
one-machine run takes a free port, so two runs on one machine do not collide.

Ctrl-C (or a SIGTERM to deepy.py) on a run whose ranks are on this machine stops it cleanly:
every rank finishes its step, saves a checkpoint and exits, deepy.py says which checkpoint it
saved and exits 0; a second Ctrl-C stops every process of the run at once (exit status 130).
No process of the run is left behind either way (megatron/launcher/stopping.py).

For `train.py`, `--dry-run` also prints the memory plan: what the heaviest rank of each
pipeline stage will hold against the GPU's memory, and a step-time estimate
(`megatron/planning/`); `--json` prints all of it as one JSON object. Before a launch on GPUs
(a GPU found here, or `plan_gpu`/`gpu_memory_gib` set) a plan that does not fit is a warning
with the smallest change that would.

The resolved config travels to every worker as one shell-safe bundle argument (a large one, muP's
base shapes of a deep model, in a file the launch writes in `.megatron_launch/`); the DeepSpeed
runner starts the workers (locally, or through pdsh, OpenMPI/MPICH/MVAPICH or SLURM's srun).
The console shows our own lines, warnings and errors; `--verbose` adds DeepSpeed's INFO lines.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import sys

from megatron.config import Config, ConfigError, deepspeed_config, encode_bundle
from megatron.config.bundle import BUNDLE_FILE_FLAG, BUNDLE_FLAG, INLINE_LIMIT, bundle_json
from megatron.config.resolve import (
    is_training_script,
    load_settings,
    log_warnings,
    resolve_settings,
    settings_group,
)
from megatron.launcher import LauncherError
from megatron.launcher.optional_packages import check_optional_packages
from megatron.launcher.ports import choose_master_port

log = logging.getLogger("deepy")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="deepy.py",
        description="Validate config files and launch SCRIPT on every rank via DeepSpeed.",
    )
    parser.add_argument("script", nargs="?", help="worker script: train.py, generate.py, eval.py")
    parser.add_argument("configs", nargs="*", help="config files (YAML/JSON/TOML), merged in order")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a key (typed as YAML; dotted keys reach into sections); repeatable",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="validate, print the resolved config and the runner command, launch nothing",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="with --dry-run: one JSON object (config, DeepSpeed config, runner command, "
        "pre-flight findings, memory plan)",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="also show DeepSpeed's INFO lines (runner, launcher, engine) and worker commands",
    )
    parser.add_argument(
        "--describe",
        nargs="?",
        const="",
        metavar="KEY",
        help="print every config key (or one) with type, default and documentation",
    )
    parser.add_argument(
        "--markdown", action="store_true", help="with --describe: the configs/README.md text"
    )
    args = parser.parse_intermixed_args(argv)
    if args.describe is None and (not args.script or not args.configs):
        parser.error("give a worker script and at least one config file")
    if args.json and not args.dry_run:
        parser.error("--json goes with --dry-run")
    return args


def vocab_size_of(tokenizer_cfg, dry_run: bool) -> int | None:
    """The tokenizer's vocabulary size, for the padded vocab; None if unknown in a dry run
    (whose pre-flight then reports the tokenizer as an error). The load is remembered, so the
    pre-flight checks do not load the tokenizer again."""
    from megatron.preflight.tokenizer import TokenizerLoadError, load_tokenizer

    try:
        return load_tokenizer(tokenizer_cfg).vocab_size
    except TokenizerLoadError as err:
        if dry_run:
            log.warning("tokenizer not loaded (%s); padded_vocab_size left unset", err)
            return None
        raise ConfigError(f"cannot load the tokenizer: {err}") from err


def resolve(args: argparse.Namespace) -> Config:
    """Resolve the configs for the world size the launcher settings give."""
    from megatron.launcher import planned_world_size

    settings = load_settings(args.configs, args.overrides)
    check_optional_packages(args.script, functools.partial(settings_group, settings))
    world_size = planned_world_size(settings_group(settings, "launcher"))
    vocab = vocab_size_of(settings_group(settings, "tokenizer"), args.dry_run)
    warnings: list[str] = []
    cfg = resolve_settings(
        settings,
        world_size=world_size,
        vocab_size=vocab,
        warn=warnings,
        training=is_training_script(args.script),
    )
    log_warnings(warnings)
    port_set_in = settings["master_port"].source if "master_port" in settings else None
    return cfg.replace(master_port=choose_master_port(cfg.launcher, set_in=port_set_in))


def preflight(cfg: Config, script: str) -> list:
    """Check the files the run will read and write; warn, or refuse before anything starts."""
    from megatron.kernels.deepspeed_ops import choose_accelerator
    from megatron.preflight import WARNING, raise_on_errors, run_preflight

    # Some checks import torch and DeepSpeed, whose logger writes to the stdout it finds at
    # import; stdout carries only what deepy.py prints (the --dry-run JSON), so they get stderr.
    # DeepSpeed's first import in this process is here: it is told this machine's device.
    with contextlib.redirect_stdout(sys.stderr):
        choose_accelerator()
        findings = run_preflight(cfg, script, shared_fs=cfg.launcher.preflight_shared_fs)
    for finding in findings:
        if finding.level == WARNING:
            log.warning("pre-flight %s: %s", finding.check, finding.message)
    raise_on_errors(findings)
    return findings


def memory_plan(args: argparse.Namespace, cfg: Config, *, on_gpu_only: bool):
    """`(plan, changes that would make it fit)` of a training run, or None: not a training
    script, no vocabulary (the tokenizer did not load), or `on_gpu_only` and the plan is for
    a CPU. A launch goes on whatever the plan says: a failure to plan is a warning there."""
    if not is_training_script(args.script) or cfg.model.padded_vocab_size is None:
        return None
    if on_gpu_only and not (cfg.planning.plan_gpu or cfg.planning.gpu_memory_gib):
        import torch  # (the planning imports take seconds: not for a CPU launch)

        if not torch.cuda.is_available():
            return None
    from megatron.planning.files import plan_files
    from megatron.planning.machine import machine_of

    with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed's import logs to stdout
        machine = machine_of(cfg)
        if on_gpu_only and machine.device != "cuda":
            return None
        world, vocab = cfg.parallel.world_size, cfg.model.true_vocab_size
        return plan_files(args.configs, args.overrides, world_size=world, vocab_size=vocab,
                          machine=machine)  # fmt: skip


def warn_if_it_does_not_fit(args: argparse.Namespace, cfg: Config) -> None:
    """Before a launch: the plan's warning and advice when a rank would not fit its GPU."""
    from megatron.planning.report import gib

    try:
        planned = memory_plan(args, cfg, on_gpu_only=True)
    except Exception as err:  # noqa: BLE001 - advice only: a plan that fails stops no run
        log.warning("memory plan not made (%s: %s); launching anyway", type(err).__name__, err)
        return
    if planned is None or planned[0].fits is not False:
        return
    plan, changes = planned
    log.warning(
        "memory plan: stage %d needs %s per GPU, the %s has %s; it would fit with: %s "
        "(deepy.py --dry-run shows the plan)",
        plan.heaviest.index, gib(plan.heaviest.total), plan.machine.name,
        gib(plan.machine.memory), "; or ".join(changes),
    )  # fmt: skip


def dry_run(args, cfg: Config, plan, findings) -> None:
    """Print what `--dry-run` shows: as text, or with `--json` as one object."""
    from megatron.planning.report import render, to_json

    planned = memory_plan(args, cfg, on_gpu_only=False)
    resolved = {**cfg.to_dict(), "deepspeed_config": deepspeed_config(cfg, verbose=args.verbose)}
    if args.json:
        out = {"config": resolved, "launch": plan.display(),
               "preflight": [f.line() for f in findings],
               "memory_plan": to_json(*planned) if planned else None}  # fmt: skip
        print(json.dumps(out, indent=2, sort_keys=True))
        return
    print(json.dumps(resolved, indent=2, sort_keys=True))
    print(plan.display())
    print("pre-flight:\n" + "\n".join(f"  {f.line()}" for f in findings))
    if planned:
        print(render(*planned))
    elif is_training_script(args.script):
        print("memory plan: none (the tokenizer did not load; its vocabulary sizes the model)")


def bundle_args(cfg: Config) -> list:
    """The config bundle on the command line, or, when longer than `INLINE_LIMIT`, in a file
    the launch writes and deletes (every launcher: the workers' arguments are the same)."""
    from megatron.launcher import StagedFile

    bundle = encode_bundle(cfg)
    if len(bundle) <= INLINE_LIMIT:
        return [BUNDLE_FLAG, bundle]
    return [BUNDLE_FILE_FLAG, StagedFile("config-", bundle_json(cfg))]


def run_checkpoints(args: argparse.Namespace, cfg: Config):
    """For a training run that saves checkpoints, what a Ctrl-C's report reads of them (the
    tag `latest` names, whether the same command resumes from it); else None."""
    from megatron.launcher.stopping import RunCheckpoints

    c = cfg.checkpointing
    if not (is_training_script(args.script) and c.save):
        return None
    from megatron.checkpoint.folders import read_latest

    def latest() -> str | None:
        try:
            return read_latest(c.save)
        except OSError:  # `latest` names a folder that is gone: nothing to name
            return None

    same = c.load is not None and os.path.realpath(c.load) == os.path.realpath(c.save)
    return RunCheckpoints(latest, resumes=same)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s", stream=sys.stderr)
    args = parse_args(argv)
    if args.describe is not None:
        from megatron.config.describe import describe_all, describe_key, render_markdown

        if args.markdown:
            print(render_markdown(), end="")
        else:
            print(describe_key(args.describe) if args.describe else describe_all())
        return 0
    if not os.path.isfile(args.script):
        raise ConfigError(f"worker script '{args.script}' not found")
    cfg = resolve(args)
    findings = preflight(cfg, args.script)
    from megatron.launcher import prepare_launch, run_launch

    user_args = bundle_args(cfg)
    with prepare_launch(
        cfg.launcher, args.script, user_args, verbose=args.verbose, collect_errors=True
    ) as plan:
        if args.dry_run:
            dry_run(args, cfg, plan, findings)
            return 0
        warn_if_it_does_not_fit(args, cfg)
        log.info(
            "launching %s on %s, master port %d%s",
            os.path.basename(args.script),
            plan.describe(),
            cfg.launcher.master_port,
            "" if args.verbose else " (--verbose shows DeepSpeed's launch lines)",
        )
        return run_launch(plan, run_checkpoints(args, cfg))


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (ConfigError, LauncherError) as err:
        print(f"deepy.py: {err}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
