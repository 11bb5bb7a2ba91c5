"""Issue 36, goals 1 and 2: data-parallel training of the default model at any per-rank batch, and a
stalled rank that ends the run in bounded time, with one line, leaving no orphan. Two gloo processes
on the CPU, started by torchrun as a user would."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from model.training.interruption import STOP_GRACE, collective_failure
from model.training.runtime import RUN_NAME_ENV, ddp_strategy, several_processes
from tests.conftest import ROOT
from tests.test_multinode import SMALL, free_port

# the default model's adaptive head, with cutoffs inside the test corpus's vocabulary (~100 characters),
# so a window of 15 targets often has none in a tail cluster
ADAPTIVE = ["model.head=adaptive", "model.head_cutoffs=[20,40]"]
STALL = ["+callbacks.stall._target_=tests.stall_rank.StallRank", "+callbacks.stall.rank=1", "+callbacks.stall.step=2"]


def launch(tmp_path: Path, corpus: Path, *overrides: str) -> subprocess.Popen:
    """torchrun, 2 processes on this machine, train.py with the small settings (in a session of its own,
    so a test can end all of it)."""
    env = {k: v for k, v in os.environ.items() if k != RUN_NAME_ENV} | {"OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2", "--rdzv-backend=c10d",
           f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--rdzv-id=stall", str(ROOT / "train.py"), *SMALL,
           "trainer.devices=2", f"data.corpus_path={corpus}", f"data.cache_dir={tmp_path / 'cache'}",
           f"paths.checkpoint_dir={tmp_path / 'checkpoints'}", f"paths.log_dir={tmp_path / 'logs'}", *overrides]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def processes_of(tmp_path: Path) -> list[int]:
    """Pids of the live processes whose command line names tmp_path (this test's launcher and ranks)."""
    out = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def wait_for(proc: subprocess.Popen, seconds: float) -> str:
    """The launch's whole console output once every process writing to it has ended, within `seconds`;
    on time-out the whole session is killed and the test fails with the output so far."""
    try:
        out, _ = proc.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"still running after {seconds:.0f} s:\n{out[-4000:]}")
    return out


def wait_for_line(proc: subprocess.Popen, text: str, seconds: float = 120) -> str:
    """Reads the launch's output until a line holds `text`; returns what was read."""
    seen, start = [], time.monotonic()
    for line in proc.stdout:
        seen.append(line)
        if text in line:
            return "".join(seen)
        if time.monotonic() - start > seconds:
            break
    os.killpg(proc.pid, signal.SIGKILL)
    pytest.fail(f"no line with {text!r}:\n{''.join(seen)[-4000:]}")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="torchrun with gloo and pgrep: Linux")
def test_the_adaptive_head_trains_under_ddp_at_a_batch_of_one_with_accumulation(tiny_corpus, tmp_path):
    """Before: a rank whose batch had no target in a tail cluster gave those weights no gradient, the
    ranks' gradient all-reduces no longer paired up, and every rank waited for ever."""
    proc = launch(tmp_path, tiny_corpus, *ADAPTIVE, "data.batch_size=1", "+trainer.accumulate_grad_batches=2",
                  "trainer.max_steps=8", "trainer.val_check_interval=8", "collective_timeout=60")
    out = wait_for(proc, 240)
    assert proc.returncode == 0, out[-4000:]
    assert "global batch: 4 windows" in (tmp_path / "logs" / "tiny-sdpa-char-torchrun-stall" / "train.log").read_text()
    assert (tmp_path / "checkpoints" / "tiny-sdpa-char-torchrun-stall" / "last.ckpt").exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="torchrun with gloo and pgrep: Linux")
def test_a_stalled_rank_ends_the_run_within_the_collective_timeout_with_one_line(tiny_corpus, tmp_path):
    start = time.monotonic()
    proc = launch(tmp_path, tiny_corpus, *ADAPTIVE, *STALL, "trainer.max_steps=6", "collective_timeout=5")
    out = wait_for(proc, 150)
    assert proc.returncode != 0
    # rank 0 waited 5 s in DDP's broadcast before step 2's forward, said so, and ended with status 1
    lines = [line for line in out.splitlines() if line.startswith("error: rank 0 of 2:")]
    assert len(lines) == 1, out[-4000:]
    assert "(DDP) stalled for 5 s (collective_timeout): another rank stopped answering" in lines[0]
    assert "exitcode  : 1" in out
    # rank 1 (stalled in Python) got torchrun's SIGTERM and ended after the grace, before torchrun's SIGKILL
    assert f"rank 1: SIGTERM {STOP_GRACE:g} s ago and the step under way has not ended" in out
    assert "SIGKILL" not in out
    assert time.monotonic() - start < 120 and processes_of(tmp_path) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="torchrun with gloo, prctl and pgrep: Linux")
def test_ranks_whose_launcher_is_killed_during_a_stall_end_and_leave_their_checkpoint(tiny_corpus, tmp_path):
    """SIGKILL on torchrun while rank 1 stalls and rank 0 waits in a collective (native code, where Python
    never sees a signal): each rank gets SIGTERM (PR_SET_PDEATHSIG) and ends within the grace."""
    proc = launch(tmp_path, tiny_corpus, *ADAPTIVE, *STALL, "trainer.max_steps=6", "trainer.val_check_interval=1",
                  "collective_timeout=600")
    wait_for_line(proc, "rank 1 stalls at step 2")
    time.sleep(2)  # rank 0 is in DDP's broadcast of step 2
    killed = time.monotonic()
    proc.kill()  # the launcher only: its ranks are not told
    out = wait_for(proc, STOP_GRACE + 60)  # the ranks hold the output pipe until they end
    assert time.monotonic() - killed < STOP_GRACE + 30
    assert out.count(f"SIGTERM {STOP_GRACE:g} s ago and the step under way has not ended") == 2, out[-4000:]
    assert processes_of(tmp_path) == []
    run = tmp_path / "checkpoints" / "tiny-sdpa-char-torchrun-stall"
    files = sorted(p.name for p in run.iterdir())
    assert files and all(f.endswith(".ckpt") and not f.startswith(".") for f in files)  # none half-written
    steps = {f: torch.load(run / f, weights_only=True)["global_step"] for f in files}
    assert "last.ckpt" in steps and set(steps.values()) == {2}  # what the validation before the stall saved


def test_several_processes_get_a_ddp_strategy_told_of_unused_parameters_and_the_timeout():
    def trainer(**kw):
        return OmegaConf.create({"strategy": "auto", "accelerator": "cpu", "devices": 1, "num_nodes": 1, **kw})

    assert not several_processes(trainer()) and several_processes(trainer(devices=4))
    assert several_processes(trainer(num_nodes=2)) and several_processes(trainer(devices=[0, 1]))
    one = trainer()
    ddp_strategy(one, 300)
    assert one.strategy == "auto"  # one process: no DDP at all
    for cfg in (trainer(devices=4), trainer(devices=2, strategy="ddp")):
        ddp_strategy(cfg, 45)
        from hydra.utils import instantiate

        strategy = instantiate(cfg.strategy)
        assert strategy._ddp_kwargs == {"find_unused_parameters": True}
        assert strategy._timeout.total_seconds() == 45
    fsdp = trainer(devices=2, strategy="fsdp")
    ddp_strategy(fsdp, 45)
    assert fsdp.strategy == "fsdp"  # another strategy is the user's choice
    with pytest.raises(ValueError, match=r"^collective_timeout=0 must be a positive number of seconds$"):
        ddp_strategy(trainer(), 0)
    with pytest.raises(ValueError, match=r"^collective_timeout=five must be a positive number of seconds$"):
        ddp_strategy(trainer(), "five")


def test_only_a_failed_collective_of_a_process_group_becomes_the_one_line(monkeypatch):
    import torch.distributed as dist

    err = RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 5000ms for recv operation")
    assert collective_failure(err, 5) is None  # no process group here: not ours to explain
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda: 3)
    monkeypatch.setattr(dist, "get_world_size", lambda: 4)
    assert collective_failure(RuntimeError("shapes do not match"), 5) is None
    line = collective_failure(err, 5).code
    assert line == ("error: rank 3 of 4: a collective stalled for 5 s (collective_timeout): another rank stopped "
                    "answering; this rank ends (the launcher ends the others; checkpoints saved before stay)")
    lost = collective_failure(RuntimeError("Connection closed by peer [127.0.0.1]:4242"), 300).code
    assert lost.startswith("error: rank 3 of 4: a collective failed: Connection closed by peer [127.0.0.1]:4242;")
