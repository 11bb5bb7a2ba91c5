"""The weights a run keeps: an exponential moving average (EMA) of the trained ones, through
Lightning's `WeightAveraging` callback (`conf/callbacks/default.yaml`, `ema`).

Lightning keeps the average beside the model, updates it after every optimizer step, swaps it in
for each validation, and writes it as a checkpoint's `state_dict` (the trained weights go to
`current_model_state`, from which a resumed run continues, with the average restored); at the end
of training it copies the average into the model, so the callbacks that run then, `sample.py`,
`evaluate.py` and a fine-tune's `init_from` all read the average. The samples and attention maps
logged at each validation's end read the trained weights (the average is swapped out by then).
What the EMA gained, at two seeds: docs/experiments.md, "2026-12-06: The speedrun's levers, continued".
"""
from __future__ import annotations

from functools import partial

import torch
from lightning.pytorch.callbacks import WeightAveraging


@torch.no_grad()
def ema_update(decay: float, averaged: list[torch.Tensor], current: list[torch.Tensor],
               n_averaged: torch.Tensor) -> None:
    """One EMA step in place: averaged ← d · averaged + (1 − d) · current, with the decay warmed up as
    TensorFlow's `ExponentialMovingAverage(num_updates=n)` does, d = min(decay, (1 + n) / (10 + n))
    after n updates, so that a short run's average is not its first steps'. Tensors that are not
    floating point (a mask buffer) take the model's own. `torch.optim.swa_utils.AveragedModel`'s
    `multi_avg_fn` (one device and dtype per call)."""
    n = float(n_averaged)
    d = min(decay, (1 + n) / (10 + n))
    if averaged[0].is_floating_point():
        torch._foreach_lerp_(averaged, current, 1 - d)
    else:
        for a, c in zip(averaged, current):
            a.copy_(c)


class EMA(WeightAveraging):
    """`WeightAveraging` with `ema_update` at `decay` per optimizer step (0.995: the last few hundred
    steps count). raises ValueError for a decay outside (0, 1)."""

    def __init__(self, decay: float = 0.995):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"callbacks.ema.decay must be in (0, 1), got {decay}")
        super().__init__(multi_avg_fn=partial(ema_update, decay))
