"""`synchronize_each_layer` cannot change a result but makes the device wait: warned about.

GPT-NeoX's files set it (most of its shipped configs do); loading one keeps honouring the key
and warns once before launch with what it costs. Our own configs do not set it. A step with
it off pays no device synchronisation for activation checkpointing; with it on, DeepSpeed's
checkpointing pays 4 per checkpointed layer per micro-batch (counted with `HostReads`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from megatron.config import load_config
from tests.device_costs import HostReads
from tests.distributed import run_distributed
from tests.tiny import resolve, tiny_settings, write_config

ROOT = Path(__file__).resolve().parents[3]
GUIDE = ROOT / "tests" / "data" / "configs" / "neox_guide_example.yml"
SYNC_WARNING = "config key 'synchronize_each_layer'"


def _sync_warnings(warn: list[str]) -> list[str]:
    return [line for line in warn if line.startswith(SYNC_WARNING)]


def test_a_neox_file_that_sets_it_is_honoured_with_one_warning():
    warn: list[str] = []
    cfg = load_config([GUIDE], warn=warn)
    assert cfg.model.synchronize_each_layer  # honoured: the run does what the file says
    (line,) = _sync_warnings(warn)
    assert str(GUIDE) in line
    assert "4 times per checkpointed chunk of 1 layer(s)" in line
    assert "(48 per micro-batch here)" in line  # 12 layers, one per checkpoint: 4 x 12
    assert "cannot change any result" in line
    assert "synchronize_each_layer: false" in line


def test_without_checkpointing_it_is_warned_as_having_no_effect(tmp_path):
    settings = dict(tiny_settings(tmp_path), synchronize_each_layer=True)
    warn: list[str] = []
    load_config([write_config(tmp_path, settings)], warn=warn)
    (line,) = _sync_warnings(warn)
    assert "has no effect without checkpoint_activations: true" in line


def test_off_is_not_warned_about(tmp_path):
    settings = dict(tiny_settings(tmp_path), checkpoint_activations=True)
    warn: list[str] = []
    load_config([write_config(tmp_path, settings)], warn=warn)
    assert _sync_warnings(warn) == []


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yml")), ids=lambda p: p.name)
def test_our_configs_do_not_set_it(path):
    assert not yaml.safe_load(path.read_text()).get("synchronize_each_layer", False)


def _synchronisations_per_micro_batch(rank, world_size, folder):
    from megatron.data import build_tokenizer
    from megatron.launcher.worker import initialize_distributed
    from megatron.parallel.random import seed_everything
    from megatron.training.setup.batches import BatchSettings
    from megatron.training.setup.data import BatchFactory, build_datasets
    from megatron.training.setup.engine import build_engine
    from megatron.training.step.steps import engine_steps

    out = {}
    for sync in (False, True):
        settings = tiny_settings(
            f"{folder}/{sync}",
            save=None,
            load=None,
            train_iters=3,
            checkpoint_activations=True,
            synchronize_each_layer=sync,
        )
        cfg = resolve(settings, world_size)
        topology = initialize_distributed(cfg)
        seed_everything(cfg.training.seed)
        parts = build_engine(cfg, topology, 3)
        steps = engine_steps(parts.engine, topology)
        batch = BatchSettings.from_config(cfg, build_tokenizer(cfg).eod)
        batches = BatchFactory(cfg, topology, batch, parts.engine.device)(
            build_datasets(cfg, 3)[0], 0
        )
        steps.train(batches)
        with HostReads() as reads:
            steps.train(batches)
        micro_batches = cfg.training.gradient_accumulation_steps
        out[sync] = (reads.kinds["synchronize"] / micro_batches, reads.report())
    return out


def test_a_step_with_it_off_pays_no_synchronisation(tmp_path):
    counted = run_distributed(_synchronisations_per_micro_batch, 1, str(tmp_path))[0]
    off, report = counted[False]
    assert off == 0, report
    on, report = counted[True]
    assert on == 4 * 2, report  # the tiny model's 2 layers, one per checkpoint
