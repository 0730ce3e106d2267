"""Loggers: the console line, metrics.jsonl, TensorBoard events, offline wandb and Comet."""

from __future__ import annotations

import io
import json
import math
import sys
import time
import zipfile

import pytest

from megatron.training.metrics.loggers import (
    TRAIN_KEYS,
    ConsoleLogger,
    JsonlLogger,
    build_loggers,
    format_train_line,
    scalars,
)

RECORD = {
    "iteration": 20,
    "loss": 4.12345,
    "lr": 0.002,
    "grad_norm": 1.5,
    "loss_scale": None,
    "skipped": 0,
    "tokens_per_sec": 12345.6,
    "tflops_per_gpu": 0.125,
    "mfu": None,
    "elapsed_s": 83.0,
    "eta_s": 3725.0,
}
EVAL = {"iteration": 20, "split": "valid", "loss": 3.5, "perplexity": 33.115}


def test_console_line_has_every_figure():
    line = format_train_line({**RECORD, "loss_scale": 65536.0, "mfu": 0.123}, 600)
    for part in (
        "iteration 20/600",
        "loss 4.1235",
        "lr 2.000E-03",
        "grad norm 1.500",
        "loss scale 65536",
        "skipped 0",
        "12,346 tokens/s",
        "0.125 TFLOP/s/GPU",
        "MFU 12.3%",
        "elapsed 0:01:23",
        "ETA 1:02:05",
    ):
        assert part in line
    plain = format_train_line(RECORD, 600, "rank")
    assert "MFU" not in plain and "loss scale" not in plain  # CPU fp32: none to show
    assert "0.125 TFLOP/s/rank" in plain and "GPU" not in plain  # CPU ranks are no GPU


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_only_on_a_terminal():
    tty, pipe = _Tty(), io.StringIO()
    ConsoleLogger(80, tty).log_train(RECORD)
    ConsoleLogger(80, pipe).log_train(RECORD)
    assert tty.getvalue().startswith("[######..................] iteration 20/80")
    assert pipe.getvalue().startswith("iteration 20/80")


def test_jsonl_one_object_per_record(tmp_path):
    logger = JsonlLogger(tmp_path / "logs")
    logger.log_train({**RECORD, "grad_norm": float("nan"), "loss": float("inf")})
    logger.log_eval(EVAL)
    logger.close()
    lines = (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()
    train, valid = (json.loads(line) for line in lines)
    assert set(TRAIN_KEYS) <= set(train)
    # a diverged figure is written as it is, never as null
    assert '"loss": Infinity' in lines[0] and '"grad_norm": NaN' in lines[0]
    assert math.isnan(train["grad_norm"]) and train["loss"] == math.inf
    assert valid == EVAL


def test_console_shows_non_finite_figures():
    line = format_train_line({**RECORD, "loss": float("nan"), "grad_norm": float("inf")}, 600)
    assert "loss nan" in line and "grad norm inf" in line


def _cfg(make_config, tmp_path, **changes):
    return make_config(log_dir=str(tmp_path / "logs"), **changes)


def test_build_loggers_rank0_only(make_config, tmp_path):
    cfg = _cfg(make_config, tmp_path)
    assert build_loggers(cfg, rank=1).loggers == []
    kinds = [type(x).__name__ for x in build_loggers(cfg, rank=0).loggers]
    assert kinds == ["ConsoleLogger", "JsonlLogger"]


def test_tensorboard_scalars(make_config, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = _cfg(make_config, tmp_path, tensorboard_dir=str(tmp_path / "tb"))
    loggers = build_loggers(cfg, rank=0, train_iters=80)
    loggers.log_train(RECORD)
    loggers.log_eval(EVAL)
    loggers.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "train/lr", "train/tokens_per_sec", "valid/perplexity"} <= tags
    assert "train/mfu" not in tags  # None is not a scalar
    (loss,) = events.Scalars("train/loss")
    assert (loss.step, loss.value) == (20, pytest.approx(4.12345))


def test_tensorboard_and_wandb_scalars_keep_non_finite_values(make_config, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    diverged = {**RECORD, "loss": float("nan"), "grad_norm": float("inf")}
    assert math.isnan(scalars(diverged, "train")["train/loss"])  # what wandb receives too
    cfg = _cfg(make_config, tmp_path, tensorboard_dir=str(tmp_path / "tb"))
    loggers = build_loggers(cfg, rank=0, train_iters=80)
    loggers.log_train(diverged)
    loggers.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    (loss,) = events.Scalars("train/loss")
    (norm,) = events.Scalars("train/grad_norm")
    assert math.isnan(loss.value) and norm.value == math.inf


def test_wandb_offline(make_config, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = _cfg(make_config, tmp_path, use_wandb=True, wandb_project="test")
    loggers = build_loggers(cfg, rank=0, train_iters=80)
    assert type(loggers.loggers[-1]).__name__ == "WandbLogger"
    loggers.log_train(RECORD)
    loggers.log_eval(EVAL)
    loggers.close()
    (run_file,) = (tmp_path / "logs" / "wandb").glob("offline-run-*/run-*.wandb")
    names = (b"train/loss", b"train/tokens_per_sec", b"valid/perplexity")
    for _ in range(100):  # wandb's service may still be writing the record after finish()
        data = run_file.read_bytes()  # the offline record `wandb sync` uploads (protobuf)
        if all(name in data for name in names):
            break
        time.sleep(0.2)
    for name in names:
        assert name in data


def test_comet_offline(make_config, tmp_path, monkeypatch):
    """Comet's own offline archive (what `comet upload` sends) holds the figures, the name,
    tags, others and the config, as Comet wrote them."""
    monkeypatch.setenv("COMET_START_ONLINE", "false")
    monkeypatch.setenv("COMET_OFFLINE_DIRECTORY", str(tmp_path / "comet"))
    monkeypatch.setenv("COMET_ERROR_TRACKING_ENABLE", "false")  # no crash reports: no network
    cfg = _cfg(
        make_config,
        tmp_path,
        use_comet=True,
        comet_project="proj",
        comet_experiment_name="tiny-run",
        comet_tags=["a", "b"],
        comet_others={"note": "hello"},
    )
    loggers = build_loggers(cfg, rank=0, train_iters=80)
    assert type(loggers.loggers[-1]).__name__ == "CometLogger"
    loggers.log_train({**RECORD, "loss": float("nan")})
    loggers.log_eval(EVAL)
    loggers.close()
    (archive,) = (tmp_path / "comet").glob("*.zip")
    with zipfile.ZipFile(archive) as z:
        messages = [json.loads(line) for line in z.read("messages.json").splitlines()]
        experiment = json.loads(z.read("experiment.json"))
    metrics = {
        (m["payload"]["metric"]["metricName"], m["payload"]["metric"]["step"]): m["payload"][
            "metric"
        ]["metricValue"]
        for m in messages
        if m["type"] == "metric_msg"
    }
    assert metrics[("train/lr", 20)] == pytest.approx(0.002)
    assert metrics[("train/tokens_per_sec", 20)] == pytest.approx(12345.6)
    assert math.isnan(float(metrics[("train/loss", 20)]))  # a diverged loss is not dropped
    assert metrics[("valid/perplexity", 20)] == pytest.approx(33.115)
    assert ("train/mfu", 20) not in metrics  # None is not a figure, as in TensorBoard
    others = {
        m["payload"]["key"]: m["payload"]["value"] for m in messages if m["type"] == "log_other"
    }
    assert others["Name"] == "tiny-run" and others["note"] == "hello"
    params = [m["payload"] for m in messages if m["type"] == "parameter_msg"]
    params = {p.get("param", p.get("params"))["paramName"] for p in params}  # scalar, list
    assert {"seq_length", "comet_tags"} <= params  # the resolved config
    assert experiment["project_name"] == "proj" and set(experiment["tags"]) == {"a", "b"}


def test_console_eval_line_shows_the_objectives_metrics():
    out = io.StringIO()
    record = {"iteration": 25, "split": "valid", "loss": 0.61, "perplexity": 1.84}
    ConsoleLogger(100, out).log_eval({**record, "reward_acc": 0.75, "margins": 0.125})
    assert out.getvalue().strip() == (
        "valid at iteration 25 | loss 0.6100 | perplexity 1.840 | reward_acc 0.7500 | "
        "margins 0.1250"
    )


def test_a_missing_logger_package_is_a_user_error(tmp_path, monkeypatch):
    from megatron.errors import is_user_error
    from megatron.training.metrics.loggers.comet_logger import CometLogger
    from megatron.training.metrics.loggers.tensorboard import TensorBoardLogger
    from megatron.training.metrics.loggers.wandb_logger import WandbLogger

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails
    monkeypatch.setitem(sys.modules, "wandb", None)
    monkeypatch.setitem(sys.modules, "comet_ml", None)
    builds = (lambda: TensorBoardLogger(str(tmp_path)), lambda: WandbLogger("p"), CometLogger)
    for build in builds:
        with pytest.raises(Exception, match="pip install") as refused:
            build()
        assert is_user_error(refused.value)  # the message alone on the console
