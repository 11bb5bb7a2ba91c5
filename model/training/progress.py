"""The training progress bar: Lightning's tqdm bar, counting what ends the run."""
from __future__ import annotations

from lightning.pytorch.callbacks import Timer, TQDMProgressBar

BUDGET_FORMAT = "{desc}{percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s of the time budget{postfix}"  # tqdm: ", k=v"


class StepProgressBar(TQDMProgressBar):
    """Lightning's TQDMProgressBar, except that one training bar spans the run and counts
    optimizer steps against `trainer.max_steps` (a resumed run starts at its restored step, and
    the time left is that of its remaining steps) instead of the batches of each epoch; in budget
    mode (`trainer.max_time`) it counts seconds spent against the budget, the step in its postfix."""

    def on_train_start(self, trainer, *_) -> None:
        super().on_train_start(trainer)
        bar, budget = self.train_progress_bar, _budget_seconds(trainer)
        if budget is not None:
            bar.total, bar.bar_format, bar.n = budget, BUDGET_FORMAT, _elapsed(trainer)
        else:
            bar.total, bar.n = (trainer.max_steps if trainer.max_steps > 0 else None), trainer.global_step
        bar.initial = bar.n  # tqdm's rate and time left count from here
        bar.set_description(f"Epoch {trainer.current_epoch}")  # a run resumed mid-epoch starts no epoch

    def on_train_epoch_start(self, trainer, *_) -> None:
        self.train_progress_bar.set_description(f"Epoch {trainer.current_epoch}")  # the bar goes on

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        bar = self.train_progress_bar
        if self._should_update(batch_idx + 1, bar.total):
            bar.n = min(_elapsed(trainer), bar.total) if _budget_seconds(trainer) is not None else trainer.global_step
            bar.set_postfix(self.get_metrics(trainer, pl_module))

    def get_metrics(self, trainer, pl_module) -> dict:
        """Lightning's postfix (the progress-bar metrics), led by the step in budget mode."""
        metrics = super().get_metrics(trainer, pl_module)
        return {"step": trainer.global_step, **metrics} if _budget_seconds(trainer) is not None else metrics


def _timer(trainer) -> Timer | None:
    return next((c for c in trainer.callbacks if isinstance(c, Timer)), None)


def _budget_seconds(trainer) -> int | None:
    """`trainer.max_time` in whole seconds, or None without one."""
    timer = _timer(trainer)
    return None if timer is None else round(timer.time_elapsed("train") + timer.time_remaining("train"))


def _elapsed(trainer) -> int:
    """Whole seconds of training spent (Lightning's Timer: a resumed run continues its count)."""
    return int(_timer(trainer).time_elapsed("train"))
