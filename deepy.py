#!/usr/bin/env python
"""Launch a worker script on every rank with one validated config.

    python deepy.py train.py configs/160M.yml local.yml [--set train_iters=20] [--dry-run]
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

The resolved config travels to every worker as one shell-safe bundle argument; the DeepSpeed
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
from megatron.config.bundle import BUNDLE_FLAG
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
    from megatron.preflight import WARNING, raise_on_errors, run_preflight

    # Some checks import torch and DeepSpeed, whose logger writes to the stdout it finds at
    # import; stdout carries only what deepy.py prints (the --dry-run JSON), so they get stderr.
    with contextlib.redirect_stdout(sys.stderr):
        findings = run_preflight(cfg, script, shared_fs=cfg.launcher.preflight_shared_fs)
    for finding in findings:
        if finding.level == WARNING:
            log.warning("pre-flight %s: %s", finding.check, finding.message)
    raise_on_errors(findings)
    return findings


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

    user_args = [BUNDLE_FLAG, encode_bundle(cfg)]
    with prepare_launch(
        cfg.launcher, args.script, user_args, verbose=args.verbose, collect_errors=True
    ) as plan:
        if args.dry_run:
            resolved = {**cfg.to_dict(), "deepspeed_config": deepspeed_config(cfg)}
            print(json.dumps(resolved, indent=2, sort_keys=True))
            print(plan.display())
            print("pre-flight:\n" + "\n".join(f"  {f.line()}" for f in findings))
            return 0
        log.info(
            "launching %s on %s, master port %d%s",
            os.path.basename(args.script),
            plan.describe(),
            cfg.launcher.master_port,
            "" if args.verbose else " (--verbose shows DeepSpeed's launch lines)",
        )
        return run_launch(plan)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (ConfigError, LauncherError) as err:
        print(f"deepy.py: {err}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
