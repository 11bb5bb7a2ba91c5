"""Training that stops cleanly when asked to, and resumes exactly where it stopped.

`StopOnSignal`: SIGTERM (what schedulers send before they kill a job) or Ctrl-C (SIGINT)
lets the optimizer step under way finish, saves `last.ckpt` of that step and ends the run
with exit status 128 + the signal's number (143 for SIGTERM, 130 for Ctrl-C), so a
scheduler never records an interrupted run as a success. `StepSeed` makes a step's random
draws (dropout) a function of the step, so a resumed run draws what an uninterrupted one
does. With the resumable training loader (data/datamodule.py) and Lightning's saved
optimizer, scheduler and loop state, a run resumed from such a checkpoint continues as if
it had never stopped (docs/training.md, "Resume and interruption").

A run that cannot stop so (a rank blocked in a collective that another rank never joins does not
run Python, so it never sees the signal) ends anyway: `STOP_GRACE` seconds after the signal it
exits with the same status and one line, removing its half-written checkpoint file. A collective
that stalls past the process group's timeout (`collective_timeout`, model/training/runtime.py)
ends the rank with one line naming the collective and the rank (`CollectiveFailed`).
"""
from __future__ import annotations

import logging
import os
import re
import signal
import socket
import threading
import traceback
from pathlib import Path

import lightning as L
import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_only

log = logging.getLogger(__name__)
warn = rank_zero_only(log.warning)

SIGNALS = (signal.SIGTERM, signal.SIGINT)
STOP_GRACE = 20.0
"""Seconds a run has, after SIGTERM or Ctrl-C, to finish its step and save it before it exits without
(inside the 30 s that torchrun and Slurm's default KillWait leave before SIGKILL)."""


class TrainingInterrupted(SystemExit):
    """The run stopped on a signal; exit status 128 + the signal's number. `checkpoint`: the
    file saved for the step it stopped at, or None (stopped before training began)."""

    def __init__(self, signum: int, checkpoint: Path | None = None):
        super().__init__(128 + signum)
        self.signum, self.checkpoint = signum, checkpoint


class StopOnSignal(L.Callback):
    """On SIGTERM or Ctrl-C during training: finish the optimizer step under way, save
    `dirpath/last.ckpt` (atomically, through the trainer's CheckpointIO), raise
    TrainingInterrupted. A second Ctrl-C stops at once, without saving (KeyboardInterrupt).

    The handlers replace Lightning's (which stops mid-validation and exits 0) from the start of
    training to its end; Lightning restores the earlier ones if training fails. Under DDP every rank
    stops after the same step when any rank got the signal.

    A watchdog thread hears the signal at once, also while the main thread is blocked in native code
    (Python's wakeup fd): if training has not stopped `grace` seconds later (a stalled collective,
    a rank stalled elsewhere), it removes this process's half-written checkpoint file, logs one line
    and exits with 128 + the signal's number at once (`os._exit`).
    """

    def __init__(self, dirpath: str | Path, grace: float = STOP_GRACE):
        self.dirpath, self.grace = Path(dirpath), grace
        self.signum: int | None = None
        self._previous: dict[int, object] = {}
        self._stopped = threading.Event()
        self._wakeup: tuple[socket.socket, socket.socket, int] | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.signum = signal.SIGTERM if trainer.received_sigterm else None  # during the sanity check
        self._previous = {s: signal.getsignal(s) for s in SIGNALS}
        for s in SIGNALS:
            signal.signal(s, self._request)
        self._stopped.clear()
        heard, write = socket.socketpair()
        write.setblocking(False)  # what set_wakeup_fd asks: the C signal handler must never block
        self._wakeup = heard, write, signal.set_wakeup_fd(write.fileno(), warn_on_full_buffer=False)
        threading.Thread(target=self._watch, args=(heard, trainer.global_rank), daemon=True,
                         name="stop-watchdog").start()

    def _watch(self, heard: socket.socket, rank: int) -> None:
        """The watchdog: waits for a signal byte on `heard` (closed at the end of training), then
        gives the run `grace` seconds to stop."""
        while True:
            try:
                byte = heard.recv(1)
            except OSError:
                return
            if not byte:
                return
            if byte[0] in SIGNALS:
                break
        if self._stopped.wait(self.grace):
            return
        for tmp in self.dirpath.glob(f".*.{os.getpid()}.tmp"):  # AtomicCheckpointIO's file under way
            tmp.unlink(missing_ok=True)
        name = signal.Signals(byte[0]).name
        log.error(f"rank {rank}: {name} {self.grace:g} s ago and the step under way has not ended (blocked in a "
                  f"collective or a stalled data loader?): exiting without a checkpoint; those saved before stay")
        logging.shutdown()
        os._exit(128 + byte[0])

    def _request(self, signum: int, frame) -> None:
        if signum == signal.SIGINT and self.signum == signal.SIGINT:
            signal.default_int_handler(signum, frame)  # the second Ctrl-C: KeyboardInterrupt now
        self.signum = signum
        warn(f"{signal.Signals(signum).name}: stopping after this step with a checkpoint "
             "(Ctrl-C again stops at once without one)")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        if (batch_idx + 1) % trainer.accumulate_grad_batches:
            return  # between the micro-batches of one optimizer step
        stop = self.signum is not None
        if trainer.world_size > 1:
            stop = trainer.strategy.reduce_boolean_decision(stop, all=False)
        if stop:
            path = self.dirpath / "last.ckpt"
            trainer.save_checkpoint(path, weights_only=False)  # Lightning: save optimizer and loops too (not a load)
            record = pl_module.engine.meta.finetuned  # a fine-tuning run resumes with its data
            data = (f'experiment=finetune "data.poets=[{",".join(record.poets)}]" ' if record and record.poets
                    else f"experiment=finetune data.corpus_path=<{record.corpus}> " if record else "")
            warn(f"stopped at step {trainer.global_step}; saved {path}. Resume with "
                 f"`python train.py {data}ckpt_path=last` (and the same settings)")
            self._stopped.set()
            raise TrainingInterrupted(self.signum or signal.SIGTERM, path)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stopped.set()
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}
        if self._wakeup:
            heard, write, previous = self._wakeup
            signal.set_wakeup_fd(previous)
            write.close()
            heard.shutdown(socket.SHUT_RDWR)  # the watchdog's recv returns
            heard.close()
            self._wakeup = None

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self.on_train_end(trainer, pl_module)  # training has stopped: no watchdog, the earlier handlers


class CollectiveFailed(SystemExit):
    """A collective (a DDP all-reduce or broadcast, a barrier) timed out or lost its peer on this
    rank: exit status 1 with one line that names the collective, the rank and the time waited."""

    def __init__(self, what: str, rank: int, world: int, reason: str):
        super().__init__(f"error: rank {rank} of {world}: {what} {reason}; this rank ends (the launcher ends the "
                         "others; checkpoints saved before stay)")


def collective_failure(err: BaseException, timeout: float) -> CollectiveFailed | None:
    """The one-line error for `err` if it is a failed collective of an initialised process group
    (gloo's 'Timed out waiting …' or 'Application timeout caused pair closure', a lost connection,
    torch's DistError), else None. The collective is named from the traceback: the outermost and
    innermost torch.distributed / DDP functions it passed through, or DDP's gradient all-reduce when
    it failed in backward. timeout: `collective_timeout`, the seconds it waited."""
    import torch.distributed as dist

    message = str(err)
    ours = isinstance(err, dist.DistError) or re.search(r"gloo|nccl|timed out|timeout|closed by peer|pair closure",
                                                         message, re.IGNORECASE)
    if not (ours and dist.is_available() and dist.is_initialized()):
        return None
    stack = traceback.extract_tb(err.__traceback__)
    frames, names = [f.filename.replace(os.sep, "/") for f in stack], [f.name for f in stack]
    inside = [i for i, f in enumerate(frames) if re.search(r"torch/(distributed|nn/parallel)/", f)]
    if inside:
        what = "the collective " + " → ".join(dict.fromkeys(names[i] for i in (inside[0], inside[-1])))
        what += " (DDP)" if "nn/parallel" in frames[inside[0]] else ""
    elif any("torch/autograd/" in f for f in frames):
        what = "DDP's gradient all-reduce (in backward)"
    else:
        what = "a collective"
    stalled = re.search(r"timed out|timeout", message, re.IGNORECASE)
    reason = (f"stalled for {timeout:g} s (collective_timeout): another rank stopped answering" if stalled
              else f"failed: {message.strip().splitlines()[0][:200]}")
    return CollectiveFailed(what, dist.get_rank(), dist.get_world_size(), reason)


class StepSeed(L.Callback):
    """Seeds torch's generators before every training batch from (seed, optimizer step,
    micro-batch), so the random draws of a step (dropout) do not depend on what ran before it
    in this process: a resumed run draws exactly what an uninterrupted one does. The step is
    folded into the seed with numpy's SeedSequence (as `jax.random.fold_in` folds data into a key)."""

    def __init__(self, seed: int):
        self.seed = seed

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        micro = batch_idx % trainer.accumulate_grad_batches
        seq = np.random.SeedSequence([self.seed, trainer.global_step, micro])
        torch.manual_seed(int(seq.generate_state(1, np.uint64)[0]))
