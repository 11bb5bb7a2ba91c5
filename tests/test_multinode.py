"""Issue 25, goal 3: 2 nodes × 2 processes by torchrun (two agents on localhost, gloo) train as one
run, and the run resumes on another number of processes."""
import csv
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from data.datamodule import PoetryDataModule
from model.loading import load_engine
from model.training.lit import lr_factor
from model.training.runtime import RUN_NAME_ENV, OneRunOnEveryRank
from model.training.validation import validation_metrics
from tests.conftest import ROOT

SMALL = ["model.n_layer=2", "model.n_head=2", "model.n_embd=32", "model.block_size=16", "data.batch_size=8",
         "model.optim.warmup_steps=2", "trainer.val_check_interval=3", "trainer.num_sanity_val_steps=0",
         "trainer.enable_progress_bar=false", "trainer.log_every_n_steps=1", "logger=csv", "~callbacks.samples",
         "~callbacks.attention_maps", "~callbacks.evaluation", "~callbacks.head_effects",
         "trainer=ddp", "trainer.accelerator=cpu", "trainer.precision=auto"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(tmp_path: Path, corpus: Path, launch: list[str], *overrides: str) -> list[subprocess.Popen]:
    """Start `torchrun <launch> train.py` with the small settings, writing under tmp_path."""
    env = {k: v for k, v in os.environ.items() if k != RUN_NAME_ENV} | {"OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", *launch, str(ROOT / "train.py"), *SMALL,
           f"data.corpus_path={corpus}", f"data.cache_dir={tmp_path / 'cache'}",
           f"paths.checkpoint_dir={tmp_path / 'checkpoints'}", f"paths.log_dir={tmp_path / 'logs'}", *overrides]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(*procs: subprocess.Popen) -> str:
    """Waits for each launch (up to 5 minutes), asserts it exited 0; returns their console output."""
    outs = []
    for proc in procs:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out[-4000:]
        outs.append(out)
    return "".join(outs)


def rows(run_log: Path) -> tuple[dict, dict, dict]:
    """From a run's CSV log: {step: muon lr}, {step: train/epochs}, {step: val/loss}."""
    (metrics,) = run_log.glob("csv/version_*/metrics.csv")
    lr, epochs, val = {}, {}, {}
    for row in csv.DictReader(metrics.open()):
        step = int(row["step"])
        for out, key in ((lr, "lr-MuonAdamW/muon"), (epochs, "train/epochs"), (val, "val/loss")):
            if row[key]:
                out[step] = float(row[key])
    return lr, epochs, val


def test_two_nodes_of_two_processes_train_as_one_run_that_resumes_on_three(tiny_corpus, tmp_path):
    rdzv = [f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--rdzv-backend=c10d", "--rdzv-id=job7"]
    nodes = [torchrun(tmp_path, tiny_corpus, ["--nnodes=2", "--nproc-per-node=2", *rdzv], "trainer.devices=2",
                      "trainer.num_nodes=2", "trainer.max_steps=6") for _ in range(2)]
    out = finish(*nodes)

    name = "tiny-sdpa-char-torchrun-job7"  # one run_name, from the rendezvous id
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == [name]
    assert [p.name for p in (tmp_path / "logs").iterdir()] == [name]
    run, logs = tmp_path / "checkpoints" / name, tmp_path / "logs" / name
    assert [p.name for p in logs.glob("*.log")] == ["train.log"]  # the run's folder is rank 0's record
    train_log = (logs / "train.log").read_text()
    assert out.count(f"run_name {name}: checkpoints in {run}") == 4  # every rank: the same name
    assert out.count("trainer.precision=auto: 32-true (the CPU") == 4  # and the same precision rule
    assert f"4 ranks agree: run_name {name}, trainer.precision 32-true" in train_log
    batch_lines = [line for line in train_log.splitlines() if "global batch" in line]
    assert out.count("global batch") == 1 and len(batch_lines) == 1
    assert "32 windows, 512 tokens per optimizer step (data.batch_size=8 × 2 devices × 2 nodes × 1 accumulated)" \
        in batch_lines[0]
    (hparams,) = logs.glob("csv/version_*/hparams.yaml")
    assert yaml.safe_load(hparams.read_text())["global_batch"] == 32
    # checkpoints: rank 0's, once each, none half-written
    (best, last) = sorted(p.name for p in run.iterdir())
    assert best.startswith("best-step000006-") and last == "last.ckpt"
    lr, epochs, val = rows(logs)
    # the schedule as configured: tiny's Muon rate 0.007, 2 warm-up steps, cosine to 5 % at step 6
    assert lr == pytest.approx({s: 0.007 * lr_factor(s, 2, 0.05, (s - 2) / 4) for s in range(6)}, rel=1e-6)
    assert epochs == pytest.approx({s: (s + 1) * epochs[0] for s in range(6)}, rel=1e-6)  # 512 tokens a step
    # validation exact: every held-out window once, as one process scores the saved weights
    engine = load_engine(run / "last.ckpt")
    dm = PoetryDataModule(str(tiny_corpus), str(tmp_path / "cache"), block_size=16, batch_size=8,
                          plan_tokens=bool(engine.tokenizer.plan),
                          conditions=engine.meta.conditions)  # framed as the run's data
    one = validation_metrics(engine, dm)
    assert val[6] == pytest.approx(one["val/loss"], abs=1e-6)

    # resume on 3 processes of one node, to 12 steps: the step count, the schedule and the epochs go on
    finish(torchrun(tmp_path, tiny_corpus, ["--standalone", "--nproc-per-node=3"], "trainer.devices=3",
                    "trainer.max_steps=12", f"ckpt_path={run}"))
    (resumed,) = [p for p in (tmp_path / "logs").iterdir() if p.name != name]
    assert resumed.name.startswith("tiny-sdpa-char-torchrun-")
    lr2, epochs2, val2 = rows(resumed)
    assert lr2 == pytest.approx({s: 0.007 * lr_factor(s, 2, 0.05, (s - 2) / 10) for s in range(6, 12)}, rel=1e-6)
    per_token = epochs[0] / 512
    assert epochs2 == pytest.approx({s: epochs[5] + (s - 5) * 384 * per_token for s in range(6, 12)}, rel=1e-6)
    assert sorted(val2) == [9, 12]
    assert torch.load(tmp_path / "checkpoints" / resumed.name / "last.ckpt", weights_only=True)["global_step"] == 12


class FakeTrainer:
    precision, world_size, is_global_zero, accumulate_grad_batches, num_devices, num_nodes = "32-true", 2, True, 1, 2, 1
    loggers = ()

    class datamodule:
        batch_size, block_size = 8, 16


def test_ranks_that_disagree_on_precision_or_run_name_stop_with_each_value(monkeypatch):
    others = {"run_name": "a", "trainer.precision": "bf16-mixed"}
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 2)
    monkeypatch.setattr(torch.distributed, "all_gather_object", lambda out, mine: out.__setitem__(
        slice(None), [mine, others]))
    with pytest.raises(ValueError, match=r"^the ranks disagree on trainer.precision: rank 0 32-true, "
                                         r"rank 1 bf16-mixed; set trainer.precision alike for every rank$"):
        OneRunOnEveryRank("a").setup(FakeTrainer, None, "fit")
    with pytest.raises(ValueError, match=r"^the ranks disagree on run_name: rank 0 b, rank 1 a;"):
        OneRunOnEveryRank("b").setup(FakeTrainer, None, "fit")
    others["trainer.precision"] = "32-true"
    OneRunOnEveryRank("a").setup(FakeTrainer, None, "fit")  # alike: no error
