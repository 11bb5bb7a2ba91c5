"""Issue 17, item 3: under DDP every held-out window is scored exactly once, as in one process."""
import json
import subprocess
import sys

import pytest

from tests.conftest import POEMS, ROOT, write_corpus

SCRIPT = """
import json, sys, warnings
sys.path.insert(0, {root!r})
import lightning as L, torch
from data.datamodule import PoetryDataModule
from model.training.lit import LitGPT
from model.training.runtime import end_process_group

devices, corpus, cache, out = int(sys.argv[1]), *sys.argv[2:]
dm = PoetryDataModule(corpus, cache, block_size=16, batch_size=2)  # 8 windows a batch: several batches a rank
dm.prepare_data()
torch.manual_seed(0)  # the same weights on every rank
lit = LitGPT(model=dict(block_size=16, n_layer=1, n_head=2, n_embd=16, dropout=0.0, backend="naive"),
             optim={{}}, tokenizer=dm.tokenizer.state_dict())
trainer = L.Trainer(accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto", logger=False,
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    (metrics,) = trainer.validate(lit, datamodule=dm, verbose=False)
if trainer.global_rank == 0:
    json.dump({{**{{k: float(v) for k, v in metrics.items()}}, "windows": len(dm.val_set),
               "warnings": [str(w.message) for w in seen]}}, open(out, "w"))
end_process_group()  # as train.py ends: without it, a rank may abort at exit (SIGABRT) in gloo's teardown
"""


def validate(tmp_path, devices: int) -> dict:
    """val metrics of one seeded tiny model on 15 held-out poems, by Lightning on `devices` CPU processes."""
    corpus = write_corpus(tmp_path / "corpus" / "tang.jsonl.xz", POEMS[:5], copies=15)  # 3 × 5 = 15 poems: odd
    script, out = tmp_path / "validate.py", tmp_path / f"metrics{devices}.json"
    script.write_text(SCRIPT.format(root=str(ROOT)))
    proc = subprocess.run([sys.executable, str(script), str(devices), str(corpus), str(tmp_path / "cache"), str(out)],
                          capture_output=True, text=True, timeout=300)  # Lightning's DDP launcher re-runs this argv
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_two_gloo_processes_score_every_window_once_as_one_process_does(tmp_path):
    one, two = validate(tmp_path, 1), validate(tmp_path, 2)
    assert one["windows"] % 2 == 1  # an odd number: a padding sampler would score one window twice
    for key in ("val/loss", "val/bpc"):
        assert two[key] == pytest.approx(one[key], abs=1e-6)
    assert not any("duplicate" in w for w in two["warnings"])
