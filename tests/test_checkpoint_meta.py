"""What a checkpoint records beside the weights (model/checkpoint_meta.py): one frozen record,
written by the LightningModule and read by the loader in the layout checkpoints on disk already
have, and handed to the engine when it is built: nothing is set on an engine afterwards."""
import dataclasses

import pytest
import torch

from data.tokenizer import CharTokenizer
from model import loading
from model.checkpoint_meta import CheckpointMeta, Corpora, FineTuned
from model.engine import Engine
from model.loading import load_engine, weights_sha
from model.training.lit import LitGPT
from tests.conftest import POEMS

LAYOUT = {  # the keys train.py has written beside the weights since they exist (a fine-tuned run's)
    "corpora": {"train": ["tang.jsonl.xz", "song.jsonl.xz"], "also_validate": {"song": "song.jsonl.xz"}},
    "conditions": {"shares": {"title": 0.25, "poet": 0.25, "keywords": 0.1}, "poets": {"白居易": 2739, "杜甫": 1384}},
    "finetuned": {"from": "checkpoints/base-default/last.ckpt", "from_weights_sha": "e7" * 32, "poets": ["白居易"],
                  "corpus": "tang.jsonl.xz", "train_poems": 2739, "val_poems": 144},
}
META = CheckpointMeta({"title": 0.25, "poet": 0.25, "keywords": 0.1}, {"白居易": 2739, "杜甫": 1384},
                      Corpora(("tang.jsonl.xz", "song.jsonl.xz"), {"song": "song.jsonl.xz"}),
                      FineTuned("checkpoints/base-default/last.ckpt", "e7" * 32, ("白居易",), "tang.jsonl.xz", 2739, 144))


def test_the_record_reads_and_writes_the_layout_on_disk():
    assert CheckpointMeta.from_checkpoint(LAYOUT) == META and META.to_checkpoint() == LAYOUT
    assert CheckpointMeta.from_checkpoint(LAYOUT, "ab" * 32) == dataclasses.replace(META, weights_sha="ab" * 32)
    assert CheckpointMeta().to_checkpoint() == {} and CheckpointMeta.from_checkpoint({}) == CheckpointMeta()
    with pytest.raises(dataclasses.FrozenInstanceError):
        META.conditions = {}


def lit_with(meta: CheckpointMeta | None) -> LitGPT:
    tok = CharTokenizer("".join(POEMS))
    torch.manual_seed(0)
    return LitGPT({"block_size": 24, "n_layer": 1, "n_head": 2, "n_embd": 16, "backend": "naive"}, {},
                  tok.state_dict(), "traditional", meta=meta)


def test_the_module_writes_what_the_loader_reads_and_the_engine_is_built_with_it(tmp_path, monkeypatch):
    lit = lit_with(META)
    assert lit.engine.meta is META and lit_with(None).engine.meta == CheckpointMeta()
    ckpt = {"hyper_parameters": dict(lit.hparams), "state_dict": lit.state_dict()}
    lit.on_save_checkpoint(ckpt)
    assert sorted(ckpt["hyper_parameters"]) == ["model", "optim", "script", "tokenizer"]  # LitGPT's, as before
    assert {k: ckpt[k] for k in LAYOUT} == LAYOUT
    path = tmp_path / "run" / "last.ckpt"
    path.parent.mkdir()
    torch.save(ckpt, path)

    class Watched(Engine):  # refuses any attribute set once its constructor has returned
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            object.__setattr__(self, "built", True)

        def __setattr__(self, name, value):
            assert not getattr(self, "built", False), f"engine.{name} set after construction"
            super().__setattr__(name, value)

    monkeypatch.setattr(loading, "Engine", Watched)
    engine = load_engine(path, ablate=["L0H1"])  # switching a head off sets nothing on the engine either
    assert isinstance(engine, Watched) and engine.ablated == ["L0H1"]
    assert engine.meta == dataclasses.replace(META, weights_sha=weights_sha(lit.state_dict()))


def test_a_checkpoint_written_before_the_record_loads_with_it(tmp_path):
    plain = lit_with(None)
    path = tmp_path / "old.ckpt"
    torch.save({"hyper_parameters": dict(plain.hparams), "state_dict": plain.state_dict(), **LAYOUT,
                "tokens_seen": 512}, path)
    meta = load_engine(path).meta
    assert meta.conditions == {"title": 0.25, "poet": 0.25, "keywords": 0.1} and list(meta.poets) == ["白居易", "杜甫"]
    assert meta.corpora.options("/corpus") == {"train_corpora": ["/corpus/tang.jsonl.xz", "/corpus/song.jsonl.xz"],
                                               "also_validate": {"song": "/corpus/song.jsonl.xz"}}
    assert meta.finetuned.from_path == "checkpoints/base-default/last.ckpt" and meta.finetuned.poets == ("白居易",)
    torch.save({"hyper_parameters": dict(plain.hparams), "state_dict": plain.state_dict()}, path)  # trained plain
    assert load_engine(path).meta == CheckpointMeta(weights_sha=weights_sha(plain.state_dict()))


def test_weights_sha_digests_every_tensor_by_its_bytes_a_scalar_too():
    import hashlib

    w = torch.tensor([1.0, 2.0])
    expected = hashlib.sha256(b"w torch.float32 (2,)" + w.numpy().tobytes()).hexdigest()
    assert weights_sha({"w": w}) == expected  # the digest the results record, unchanged
    assert weights_sha({"s": torch.tensor(1.0)}) != weights_sha({"s": torch.tensor(2.0)})  # a 0-dim parameter
