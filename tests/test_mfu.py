"""benchmarks/mfu.py (issue 36, item 5): the trained vocabulary, the machine recorded, and no CPU timing
beside other work."""
import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from benchmarks import mfu
from benchmarks.mfu import flops_per_token
from data.verse.plan import plan_labels
from model.device import machine_load
from model.gpt import GPT, GPTConfig


def test_a_busy_machine_is_refused_and_a_quiet_one_recorded(monkeypatch, tmp_path):
    out = tmp_path / "mfu.json"
    args = ["--model", "tiny", "--device", "cpu", "--batch", "2", "--steps", "1", "--warmup", "0", "--out", str(out)]
    monkeypatch.setattr(mfu, "machine_load", lambda: 0.9)
    with pytest.raises(SystemExit, match=r"^error: other processes used 90% of this machine's CPU time just now"):
        mfu.main(args)
    assert not out.exists()
    monkeypatch.setattr(mfu, "machine_load", lambda: 0.01)
    mfu.main(args)
    result = json.loads(out.read_text())
    assert result["machine"].endswith(f"torch {mfu.torch.__version__}") and result["others_cpu_share"] == 0.01
    assert result["vocab_size"] == 8162 + 2 + len(plan_labels()) == 8200  # characters, <bos> <eos>, plan tokens
    assert result["batch"] == 2 and result["ms_per_step"] > 0


def test_machine_load_is_a_share_of_the_cpu_time():
    load = machine_load(0.2)
    assert load is None or 0.0 <= load <= 1.0


def test_counted_flops_per_token_agree_with_six_times_the_matrix_parameters():
    cfg = GPTConfig(vocab_size=500, block_size=32, n_layer=2, n_head=4, n_embd=64, dropout=0.0, backend="sdpa")
    gpt = GPT(cfg)
    x = torch.randint(0, 500, (3, 32))
    with FlopCounterMode(display=False) as counter:
        gpt.loss(x, x).backward()
    assert counter.get_total_flops() / x.numel() == pytest.approx(flops_per_token(cfg), rel=0.1)
