"""Behaviour pinned across refactors: on seeded models with the default recipe's poem inputs
(phonology, phon_output, structure with struct_recover, the rhyme loss at rhyme slots), with the
tied and the adaptive head, the logits, the
loss, per-token nats, `val/bpc`, the attention maps, the attention rows of generation and
samples at a seed (with and without the KV cache, through its refills) equal the values in
tests/data/pinned.json, written by this file's `python -m tests.test_pinned --write`.

Checkpoints are not in git, so the models are built here: LitGPT's own construction (tables
filled for the tokenizer), then every parameter redrawn from a seeded normal so that no path is
at its zero initialisation.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

from data.datamodule import PoetryDataModule
from data.tokenizer import CharTokenizer
from model.sampling.poems import SamplingOptions, poem_steps, sample_poems
from model.training.lit import LitGPT
from model.training.validation import validation_metrics
from tests.conftest import write_corpus

PINNED = Path(__file__).parent / "data" / "pinned.json"
MODEL = dict(block_size=24, n_layer=2, n_head=2, n_embd=32, pos_emb="rope", mlp_act="relu2", zero_init_proj=True,
             phonology=True, phon_output=True, structure=True, struct_recover=True, rhyme_loss_weight=0.1,
             rhyme_loss_at="rhyme_slots")
PROBE = "床前明月光，疑是地上霜。举头望明月，"


def seeded(lit: LitGPT) -> LitGPT:
    """Every parameter redrawn from N(0, 0.1) at seed 7, in the order the model made them; eval mode."""
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in lit.gpt.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return lit.eval()


def models(tmp: Path) -> dict[str, tuple[LitGPT, PoetryDataModule | None]]:
    """'tied': the tiny corpus's vocabulary (the tied head), with its data module; 'adaptive':
    that vocabulary and 2,500 more characters, cutoffs [2000]."""
    dm = PoetryDataModule(str(write_corpus(tmp / "corpus.jsonl.xz")), str(tmp / "cache"), block_size=24, batch_size=4)
    dm.prepare_data()
    tok = dm.tokenizer.state_dict()
    wide = CharTokenizer([*tok["itos"][2:], *(chr(0x4E00 + i) for i in range(2500))]).state_dict()
    return {"tied": (seeded(LitGPT({**MODEL, "head": "tied"}, {}, tok)), dm),
            "adaptive": (seeded(LitGPT({**MODEL, "head": "adaptive", "head_cutoffs": [2000]}, {}, wide)), None)}


def figures(lit: LitGPT, dm: PoetryDataModule | None) -> dict:
    """What is pinned, as JSON values."""
    engine, gpt = lit.engine, lit.gpt
    idx, _ = engine.encode_line(PROBE)  # (1, T)
    x, y = idx[:, :-1], idx[:, 1:]
    with torch.no_grad():
        logits = gpt(idx)  # (1, T, V)
        nats = gpt.nats(x, y)
        loss = gpt.loss(x, y)
    maps = torch.stack(gpt.attention_maps(idx))  # (n_layer, 1, n_head, T, T)
    out = {"logits_sum": logits.double().sum().item(), "logits_head": logits[0, :, :6].tolist(),
           "logits_last": logits[0, -1].topk(5).indices.tolist(), "nats": nats[0].tolist(), "loss": loss.item(),
           "maps": maps[:, 0].sum(-2).tolist()}
    opts = dict(num_samples=3, max_new_tokens=40, seed=5, temperature=1.0, top_k=None, top_p=None)
    out["samples_cached"] = sample_poems(engine, SamplingOptions(**opts))
    out["samples_uncached"] = sample_poems(engine, SamplingOptions(**opts, use_cache=False))
    out["samples_wujue"] = sample_poems(engine, SamplingOptions(**opts, form="wujue", rhyme=True))
    few = SamplingOptions(num_samples=1, max_new_tokens=30, seed=2, temperature=0.8, top_p=None)
    _, steps, _ = poem_steps(engine, few, attention_rows=True)
    rows = [[r[0].tolist() for r in s.attention_rows] for s in steps]  # per step, per layer: (n_head, L)
    out["rows"] = [[[sum(h) for h in layer] for layer in step] for step in rows]
    out["rows_first_last"] = [rows[0], rows[-1]]
    if dm is not None:
        out["val"] = validation_metrics(engine, dm)
    return out


def close(a, b, path="") -> list[str]:
    """Paths where JSON values a and b differ (floats by more than 1e-5 relative, 1e-6 absolute)."""
    if isinstance(a, dict):
        return [d for k in sorted(set(a) | set(b)) for d in close(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (u, v) in enumerate(zip(a, b)) for d in close(u, v, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, (int, float)):
        return [] if math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6) else [f"{path}: {a} vs {b}"]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


@pytest.mark.parametrize("head", ["tied", "adaptive"])
def test_logits_samples_val_bpc_and_maps_are_pinned(tmp_path, head):
    lit, dm = models(tmp_path)[head]
    got = figures(lit, dm)
    want = json.loads(PINNED.read_text(encoding="utf-8"))[head]
    assert close(want, json.loads(json.dumps(got))) == []


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        pinned = {head: figures(*pair) for head, pair in models(Path(d)).items()}
    PINNED.parent.mkdir(exist_ok=True)
    PINNED.write_text(json.dumps(pinned, ensure_ascii=False, indent=None), encoding="utf-8")
    print(f"wrote {PINNED}")
