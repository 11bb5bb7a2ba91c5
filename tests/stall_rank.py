"""A callback for tests of stalled runs: one rank stops answering at one step, as a rank does whose
peer died or whose collectives no longer pair up (`+callbacks.stall._target_=tests.stall_rank.StallRank`)."""
import time

import lightning as L


class StallRank(L.Callback):
    """At the start of optimizer step `step`, rank `rank` prints `rank <r> stalls at step <s>` and
    then sleeps for ever (a signal's handler runs; the sleep goes on)."""

    def __init__(self, rank: int = 1, step: int = 2):
        self.rank, self.step = rank, step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_rank == self.rank and trainer.global_step == self.step:
            print(f"rank {self.rank} stalls at step {self.step}", flush=True)
            while True:
                time.sleep(3600)
