"""Worker verbosity: the flag deepy.py appends sets the level; DeepSpeed's prints follow it."""

from __future__ import annotations

import logging

import pytest

from megatron.config.verbosity import (
    DEEPSPEED_LOGGER,
    VERBOSE_FLAG,
    quiet_deepspeed,
    setup_worker_logging,
    sync_deepspeed_logger,
)


@pytest.fixture(autouse=True)
def restore_levels():
    root, ds = logging.getLogger(), logging.getLogger(DEEPSPEED_LOGGER)
    saved = root.level, ds.level, list(root.handlers)
    yield
    root.setLevel(saved[0])
    ds.setLevel(saved[1])
    root.handlers[:] = saved[2]


def test_quiet_worker_hides_deepspeed_prints_and_info(capsys):
    assert setup_worker_logging(["--megatron_config", "abc"]) is False
    sync_deepspeed_logger()
    with quiet_deepspeed():
        print("stage=0 layers=6")
    assert capsys.readouterr().out == ""
    assert logging.getLogger(DEEPSPEED_LOGGER).level == logging.WARNING
    assert not logging.getLogger("megatron.x").isEnabledFor(logging.INFO)
    assert logging.getLogger("megatron.x").isEnabledFor(logging.WARNING)


def test_verbose_worker_shows_them(capsys):
    assert setup_worker_logging(["--megatron_config", "abc", VERBOSE_FLAG]) is True
    sync_deepspeed_logger()
    with quiet_deepspeed():
        print("stage=0 layers=6")
    assert capsys.readouterr().out == "stage=0 layers=6\n"
    assert logging.getLogger(DEEPSPEED_LOGGER).level == logging.INFO
