"""Training that stops cleanly when asked to, and resumes exactly where it stopped.

`StopOnSignal`: SIGTERM (what schedulers send before they kill a job) or Ctrl-C (SIGINT)
lets the optimizer step under way finish, saves `last.ckpt` of that step and ends the run
with exit status 128 + the signal's number (143 for SIGTERM, 130 for Ctrl-C), so a
scheduler never records an interrupted run as a success. `StepSeed` makes a step's random
draws (dropout) a function of the step, so a resumed run draws what an uninterrupted one
does. With the resumable training loader (data/datamodule.py) and Lightning's saved
optimizer, scheduler and loop state, a run resumed from such a checkpoint continues as if
it had never stopped (docs/training.md, "Resume and interruption").
"""
from __future__ import annotations

import logging
import signal
from pathlib import Path

import lightning as L
import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_only

log = logging.getLogger(__name__)
warn = rank_zero_only(log.warning)

SIGNALS = (signal.SIGTERM, signal.SIGINT)


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
    """

    def __init__(self, dirpath: str | Path):
        self.dirpath = Path(dirpath)
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.signum = signal.SIGTERM if trainer.received_sigterm else None  # during the sanity check
        self._previous = {s: signal.getsignal(s) for s in SIGNALS}
        for s in SIGNALS:
            signal.signal(s, self._request)

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
            warn(f"stopped at step {trainer.global_step}; saved {path}. Resume with "
                 "`python train.py ckpt_path=last` (and the same settings)")
            raise TrainingInterrupted(self.signum or signal.SIGTERM, path)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}


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
