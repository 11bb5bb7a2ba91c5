"""Issue 12, item 4: a non-finite loss stops the run; NaN never becomes a number or a best checkpoint."""
import csv
import logging
import math

import pytest
import torch

import train as train_script
from model.gpt import GPT
from model.training.lit import NonFiniteLossError

QUICK = ["trainer.max_steps=4", "trainer.val_check_interval=2", "trainer.limit_val_batches=1", "~callbacks.samples",
         "~callbacks.attention_maps"]


def test_half_precision_the_cpu_cannot_train_in_is_converted(train_cfg, tmp_path, caplog):
    """The issue's command: NaN from step 1 and `best-step000002-lossnan.ckpt` before."""
    with caplog.at_level(logging.WARNING):
        metrics = train_script.train(train_cfg("trainer.precision=16-true", *QUICK, "logger=csv"))
    assert "trainer.precision=16-true cannot train on the CPU" in caplog.text
    assert "using trainer.precision=bf16-mixed" in caplog.text
    assert all(math.isfinite(metrics[k]) for k in ("train/loss", "val/loss", "val/bpc")) and metrics["val/bpc"] > 1
    (best,) = (tmp_path / "checkpoints" / "test").glob("best-*.ckpt")
    assert best.name.startswith("best-step000004-loss4.")


def test_a_nan_training_loss_stops_the_run_in_one_line(train_cfg, tmp_path):
    with pytest.raises(NonFiniteLossError) as err:
        train_script.train(train_cfg("model.optim.lr=1e12", *QUICK, "logger=none"))
    message = str(err.value)
    assert message.startswith("train/loss is nan at step 2; training stopped") and "\n" not in message
    assert "model.optim.lr=1e+12" in message and "trainer.precision" not in message  # 32-true is not a cause
    assert isinstance(err.value, ValueError)  # entry points: `error: ...`, exit status 1
    assert not list((tmp_path / "checkpoints").glob("**/*.ckpt"))


def test_nan_validation_stays_nan_and_is_never_the_best_checkpoint(train_cfg, tmp_path, monkeypatch):
    nats = GPT.nats  # what validation asks for: per-position nats

    def nan_in_eval(gpt, idx, targets):
        out = nats(gpt, idx, targets)
        return out if gpt.training else out * torch.nan

    monkeypatch.setattr(GPT, "nats", nan_in_eval)
    metrics = train_script.train(train_cfg(*QUICK, "logger=csv"))
    assert math.isnan(metrics["val/loss"]) and math.isnan(metrics["val/bpc"])
    (log,) = (tmp_path / "logs" / "test" / "csv").glob("*/metrics.csv")
    rows = [r for r in csv.DictReader(log.open()) if r["val/bpc"]]
    assert [r["step"] for r in rows] == ["2", "4"] and all(r["val/bpc"] == r["val/loss"] == "nan" for r in rows)
    assert sorted(p.name for p in (tmp_path / "checkpoints" / "test").iterdir()) == ["last.ckpt"]
