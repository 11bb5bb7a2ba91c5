"""benchmarks/fixed_time.py: its argument checks fail before any training."""
import importlib.util
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location(
    "fixed_time", Path(__file__).resolve().parents[1] / "benchmarks" / "fixed_time.py")
fixed_time = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(fixed_time)


def test_check_reference_refuses_a_count_nanogpt_published_no_figure_for():
    with pytest.raises(ValueError, match=r"no nanoGPT figure for \[1000\].*3750, 7500"):
        fixed_time.check_reference([1000])


@pytest.mark.parametrize("kwargs", [{}, {"max_iters": 10, "seconds": 1.0}])
def test_reference_takes_exactly_one_of_iterations_and_seconds(kwargs):
    with pytest.raises(ValueError, match="max_iters or seconds"):
        fixed_time.nanogpt_reference(**kwargs)


def test_table_lists_every_run_with_both_protocols():
    scores = {"poems": {"val_loss": 5.0, "val_bpc": 7.25}, "blocks": {"val_loss": 5.1, "val_bpc": 7.5}}
    text = fixed_time.table([("default", {"steps": 2200, "wall_seconds": 600.0, "tokens_per_sec": 8448, **scores}),
                             ("reference", {"iterations": 7500, "train_seconds": 1200.0, **scores})])
    lines = text.splitlines()
    assert len(lines) == 4
    assert lines[2].startswith("| default | 2,200 | 600.0 | 8448 | 5.000 | 7.250 | 5.100 | 7.500 |")
    assert lines[3].startswith("| reference | 7,500 | 1200.0 |  | 5.000 |")


def test_bpc_interval_is_a_bootstrap_of_the_ratio_over_windows():
    import math

    import numpy as np

    chars = np.array([10.0, 20.0, 30.0, 40.0])
    assert fixed_time.bpc_interval(chars * math.log(2) * 7.0, chars) == pytest.approx((7.0, 7.0))  # every window 7 bpc
    rng = np.random.default_rng(1)
    chars = rng.integers(5, 60, 2000).astype(float)
    nats = chars * math.log(2) * rng.normal(7.0, 1.0, 2000)  # windows of 7 ± 1 bpc
    low, high = fixed_time.bpc_interval(nats, chars)
    point = nats.sum() / chars.sum() / math.log(2)
    assert low < point < high and 0.02 < high - low < 0.15  # about ±1.96 · 1 / √2000 · (spread of the sizes)
    low4, high4 = fixed_time.bpc_interval(nats[:500], chars[:500])
    assert high4 - low4 > 1.5 * (high - low)  # a quarter of the windows: about twice as wide
