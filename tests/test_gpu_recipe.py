"""Issue 25, goal 2: the GPU recipe on paper (benchmarks/gpu_recipe.py) describes today's
`experiment=small_gpu`, stays within the epochs the data-constrained study supports, and its
arithmetic is what the results page says."""
import json

import pytest
import torch
from hydra import compose, initialize_config_dir
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.gpu_recipe import OUT, STUDY, expected_seconds, study_limit
from benchmarks.mfu import flops_per_token
from model.gpt import GPT, GPTConfig
from tests.conftest import ROOT


def test_expected_seconds_are_training_and_validation_flops_over_the_peak():
    r = {"steps": 1000, "batch": 10, "block_size": 100, "flops_per_token": 3e6, "val_check_interval": 500,
         "val_tokens": 30_000}
    # 1e6 tokens × 3e6 = 3e12 training FLOPs; 2 validations × 3e4 tokens × 1e6 = 6e10 forward FLOPs
    assert expected_seconds(r, 0.5, peak_tflops=1.0) == pytest.approx((3e12 + 6e10) / 0.5e12)


def test_the_committed_recipe_is_todays_small_gpu_within_what_the_study_supports(monkeypatch):
    monkeypatch.setenv("PROJECT_ROOT", str(ROOT))
    r = json.loads(OUT.read_text())
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=r["overrides"])
    assert (r["n_layer"], r["n_head"], r["n_embd"], r["block_size"], r["dropout"]) == (
        cfg.model.n_layer, cfg.model.n_head, cfg.model.n_embd, cfg.model.block_size, cfg.model.dropout)
    assert (r["batch"], r["steps"], r["val_check_interval"]) == (
        cfg.data.batch_size, cfg.trainer.max_steps, cfg.trainer.val_check_interval)
    assert cfg.data.get("train_corpora") and cfg.attention.backend == "flash"  # Tang + Song, on a GPU
    assert r["epochs"] == pytest.approx(r["steps"] * r["batch"] * r["block_size"] / r["unique_tokens"], abs=0.01)
    limit = study_limit(r["dropout"])
    assert limit == r["study"] and {"tang-dropout", "tang+song-dropout"} <= set(limit["runs"])
    assert r["epochs"] <= limit["best_epochs"]  # no more repeats than any run with dropout supported
    runs = json.loads(STUDY.read_text())["runs"]
    assert limit["best_epochs"] == min(runs[name]["best"]["epochs"] for name in limit["runs"])
    assert "tang-attn-dropout" not in limit["runs"] and "tang" not in limit["runs"]


def test_counted_flops_per_token_agree_with_six_times_the_matrix_parameters():
    cfg = GPTConfig(vocab_size=500, block_size=32, n_layer=2, n_head=4, n_embd=64, head="tied", dropout=0.0,
                    backend="sdpa")
    gpt = GPT(cfg)
    x = torch.randint(0, 500, (3, 32))
    with FlopCounterMode(display=False) as counter:
        gpt.loss(x, x).backward()
    assert counter.get_total_flops() / x.numel() == pytest.approx(flops_per_token(cfg), rel=0.1)
