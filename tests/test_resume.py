"""Issue 12, items 1–3: a resumed run continues exactly (data, weights), SIGTERM and Ctrl-C save
the step under way and exit non-zero, `ckpt_path` accepts `last` and run folders and refuses
another shape or vocabulary before any work."""
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch

import train as train_script
from model.loading import find_checkpoint, read_checkpoint
from model.training import runtime
from model.training.checkpoints import AtomicCheckpointIO
from model.training.interruption import TrainingInterrupted
from model.training.lit import LitGPT
from tests.conftest import ROOT, make_train_cfg, tiny_overrides, write_corpus

RUN = ["trainer.max_steps=20", "trainer.val_check_interval=10", "trainer.limit_val_batches=2", "logger=none",
       "~callbacks.samples", "~callbacks.attention_maps", "model.dropout=0.1"]  # dropout: random draws per step


class Recorder:
    """Wraps LitGPT.training_step: keeps each step's batch; at global step `signal_at` sends the
    process `signum` (as a scheduler or Ctrl-C would), at `crash_at` dies without saving (SIGKILL)."""

    def __init__(self, monkeypatch):
        self.batches, self.signal_at, self.signum, self.crash_at = {}, None, signal.SIGTERM, None
        step = LitGPT.training_step

        def recorded(lit, batch, batch_idx):
            if lit.global_step == self.crash_at:
                raise RuntimeError("killed")
            self.batches[lit.global_step] = batch[0].clone()  # x: (B, T)
            if lit.global_step == self.signal_at:
                os.kill(os.getpid(), self.signum)
            return step(lit, batch, batch_idx)

        monkeypatch.setattr(LitGPT, "training_step", recorded)

    def run(self, cfg, signal_at=None, signum=signal.SIGTERM, crash_at=None) -> dict:
        self.batches, self.signal_at, self.signum, self.crash_at = {}, signal_at, signum, crash_at
        try:
            train_script.train(cfg)
        except TrainingInterrupted as stop:
            assert stop.code == 128 + signum and stop.checkpoint.is_file()
        except RuntimeError as err:
            assert str(err) == "killed"
        return self.batches


def weights(path) -> dict:
    return read_checkpoint(path)["state_dict"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """20 steps without a stop: each step's batch, the final weights, the corpus and run folder."""
    tmp_path = tmp_path_factory.mktemp("uninterrupted")
    corpus = write_corpus(tmp_path / "corpus" / "tang.jsonl.xz")
    with pytest.MonkeyPatch.context() as mp:
        batches = Recorder(mp).run(make_train_cfg(tmp_path, corpus, mp)(*RUN))
    run_dir = tmp_path / "checkpoints" / "test"
    return SimpleNamespace(batches=batches, weights=weights(run_dir / "last.ckpt"), corpus=corpus, run_dir=run_dir)


def assert_same_run(uninterrupted, batches: dict, last_ckpt) -> None:
    assert sorted(batches) == list(range(20))
    assert all(torch.equal(batches[step], uninterrupted.batches[step]) for step in range(20))
    got, final = weights(last_ckpt), uninterrupted.weights
    assert max((got[k].double() - final[k].double()).abs().max().item() for k in final) <= 1e-6


def test_sigterm_after_10_steps_then_resume_gives_the_uninterrupted_run(uninterrupted, tmp_path, monkeypatch):
    corpus, rec = uninterrupted.corpus, Recorder(monkeypatch)
    first = rec.run(make_train_cfg(tmp_path / "a", corpus, monkeypatch)(*RUN), signal_at=9)  # during the 10th step
    ckpt = tmp_path / "a" / "checkpoints" / "test" / "last.ckpt"
    assert sorted(first) == list(range(10))
    assert read_checkpoint(ckpt)["global_step"] == 10  # the step under way, not the last validation
    reads, load = [], torch.load
    monkeypatch.setattr(torch, "load", lambda path, *a, **k: reads.append(str(path)) or load(path, *a, **k))
    second = rec.run(make_train_cfg(tmp_path / "b", corpus, monkeypatch)(*RUN, f"ckpt_path={ckpt.parent}"))
    assert reads.count(str(ckpt)) == 1  # checked by train.py, then restored by Lightning from the same read
    assert sorted(second) == list(range(10, 20))
    assert_same_run(uninterrupted, first | second, tmp_path / "b" / "checkpoints" / "test" / "last.ckpt")


def test_a_run_stopped_in_its_annealing_phase_resumes_it_exactly(uninterrupted, tmp_path, monkeypatch):
    """data.anneal_fraction=0.5: the last 10 steps draw rhymed poems only; stopped at step 13
    and resumed, the run gets the batches and weights of one never stopped."""
    run, rec = [*RUN, "data.anneal_fraction=0.5"], Recorder(monkeypatch)
    cfg = lambda part, *extra: make_train_cfg(tmp_path / part, uninterrupted.corpus, monkeypatch)(*run, *extra)  # noqa: E731
    reference = SimpleNamespace(batches=rec.run(cfg("ref")), weights=weights(tmp_path / "ref/checkpoints/test/last.ckpt"))
    starts = {s: reference.batches[s][:, 0] for s in range(20)}  # each window's first token; <bos> is 0
    assert all((starts[s] == 0).all() for s in range(10, 20))  # the annealing windows start at a poem
    assert any((starts[s] != 0).any() for s in range(10))  # before it, mid-poem windows too (mid_poem_fraction)
    seen = rec.run(cfg("a"), signal_at=12)
    seen |= rec.run(cfg("b", f"ckpt_path={tmp_path / 'a/checkpoints/test'}"))
    assert_same_run(reference, seen, tmp_path / "b/checkpoints/test/last.ckpt")


@pytest.mark.slow
def test_several_resumes_with_loader_workers_give_the_uninterrupted_run(uninterrupted, tmp_path, monkeypatch):
    """2 loader worker processes: Ctrl-C at step 7; resumed and killed after the step-10
    validation checkpoint (steps 10–12 are lost and trained again); resumed again."""
    run, rec = [*RUN, "data.num_workers=2"], Recorder(monkeypatch)
    cfg = lambda part, *extra: make_train_cfg(tmp_path / part, uninterrupted.corpus, monkeypatch)(*run, *extra)  # noqa: E731
    reference = SimpleNamespace(batches=rec.run(cfg("ref")), weights=weights(tmp_path / "ref/checkpoints/test/last.ckpt"))
    seen = rec.run(cfg("a"), signal_at=6, signum=signal.SIGINT)
    seen |= rec.run(cfg("b", f"ckpt_path={tmp_path / 'a/checkpoints/test'}"), crash_at=13)
    assert read_checkpoint(tmp_path / "b/checkpoints/test/last.ckpt")["global_step"] == 10
    seen |= rec.run(cfg("c", f"ckpt_path={tmp_path / 'b/checkpoints/test'}"))
    assert_same_run(reference, seen, tmp_path / "c/checkpoints/test/last.ckpt")


def test_sigterm_to_a_training_process_saves_the_step_and_exits_non_zero(tiny_corpus, tmp_path, monkeypatch):
    """A real `python train.py` process: SIGTERM while it trains, long before its first validation."""
    cmd = [sys.executable, str(ROOT / "train.py"), *tiny_overrides(tmp_path, tiny_corpus), "run_name=job",
           "trainer.max_steps=100000", "trainer.val_check_interval=100000", "trainer.log_every_n_steps=1",
           "logger=csv", "+logger.csv.flush_logs_every_n_steps=1", "~callbacks.samples", "~callbacks.attention_maps"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "WANDB_MODE": "offline"})
    metrics = tmp_path / "logs" / "job" / "csv" / "version_0" / "metrics.csv"
    deadline = time.monotonic() + 120
    while not (metrics.is_file() and metrics.read_text().count("\n") > 3) and time.monotonic() < deadline:
        time.sleep(0.2)  # until a few steps are logged
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, out
    ckpt = tmp_path / "checkpoints" / "job" / "last.ckpt"
    step = read_checkpoint(ckpt)["global_step"]
    assert step >= 1 and f"stopped at step {step}; saved {ckpt}" in out
    cfg = make_train_cfg(tmp_path, tiny_corpus, monkeypatch)(*RUN, "ckpt_path=last", f"trainer.max_steps={step + 1}",
                                                            "trainer.val_check_interval=1")
    train_script.train(cfg)  # the newest run's last.ckpt: one more step
    assert read_checkpoint(tmp_path / "checkpoints" / "test" / "last.ckpt")["global_step"] == step + 1


def test_an_interrupted_save_leaves_the_previous_checkpoint_whole(tmp_path, monkeypatch):
    io, path = AtomicCheckpointIO(), tmp_path / "run" / "last.ckpt"
    io.save_checkpoint({"global_step": 1}, path)

    def interrupted(obj, f, *args, **kwargs):
        f.write(b"half a checkpoint")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint({"global_step": 2}, path)
    monkeypatch.undo()
    assert read_checkpoint(path) == {"global_step": 1}
    assert [p.name for p in path.parent.iterdir()] == ["last.ckpt"]  # no temporary file left
    io.save_checkpoint({"global_step": 3}, path)
    assert read_checkpoint(path) == {"global_step": 3}


def test_ckpt_path_last_or_a_run_folder_means_its_last_ckpt(tmp_path):
    for i, run in enumerate(["b-old", "a-new"]):  # newest by time, not by name
        (tmp_path / run).mkdir()
        (tmp_path / run / "last.ckpt").write_text("")
        os.utime(tmp_path / run / "last.ckpt", (1000 + i, 1000 + i))
    assert find_checkpoint("last", tmp_path) == tmp_path / "a-new" / "last.ckpt"
    assert find_checkpoint(tmp_path / "b-old", tmp_path) == tmp_path / "b-old" / "last.ckpt"
    assert find_checkpoint(str(tmp_path / "b-old" / "last.ckpt"), tmp_path) == tmp_path / "b-old" / "last.ckpt"
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="empty/last.ckpt not found; train one with `python train.py`, or pass"):
        find_checkpoint(tmp_path / "empty", tmp_path)
    with pytest.raises(FileNotFoundError, match="no checkpoint under"):
        find_checkpoint("last", tmp_path / "empty")


@pytest.mark.parametrize("override, message", [
    ("model.n_layer=3", "model.n_layer: checkpoint 2, asked 3 "),
    ("model.block_size=32", "model.block_size: checkpoint 16, asked 32 "),
    ("data.num_workers=2", "data.num_workers: checkpoint 0, asked 2 "),
    ("data.script=traditional", "data.script: checkpoint simplified, asked traditional "),
])
def test_resuming_with_another_shape_or_vocabulary_stops_in_one_line(uninterrupted, tmp_path, monkeypatch,
                                                                    override, message):
    monkeypatch.setattr(LitGPT, "training_step", None)  # no training may start
    cfg = make_train_cfg(tmp_path, uninterrupted.corpus, monkeypatch)(*RUN, override, f"ckpt_path={uninterrupted.run_dir}")
    with pytest.raises(ValueError) as err:
        train_script.train(cfg)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
    assert (tmp_path / "cache").exists() == ("script" in override)  # only the vocabulary needs the data


def test_a_run_that_ends_or_stops_on_a_signal_ends_its_process_group_and_a_crash_does_not(uninterrupted, tmp_path,
                                                                                         monkeypatch):
    """train.py destroys the process group after a run that ended well or stopped on a signal (every
    rank after the same step), never after a failure, where another rank may wait in a collective."""
    ended, rec = [], Recorder(monkeypatch)
    monkeypatch.setattr(runtime, "end_process_group", lambda: ended.append(True))  # process_group's
    short = [o for o in RUN if not o.startswith(("trainer.max_steps", "trainer.val_check"))] + \
        ["trainer.max_steps=4", "trainer.val_check_interval=2"]
    rec.run(make_train_cfg(tmp_path / "ended", uninterrupted.corpus, monkeypatch)(*short))
    assert ended == [True]
    rec.run(make_train_cfg(tmp_path / "stopped", uninterrupted.corpus, monkeypatch)(*short), signal_at=1)
    assert ended == [True, True]
    rec.run(make_train_cfg(tmp_path / "crashed", uninterrupted.corpus, monkeypatch)(*short), crash_at=1)
    assert ended == [True, True]
