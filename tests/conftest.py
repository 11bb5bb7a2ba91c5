"""Shared fixtures: tiny corpora made in the test, and composed Hydra configs."""
from __future__ import annotations

import json
import lzma
from pathlib import Path

import pytest
import rootutils

import model.training.runtime  # noqa: F401  (registers the run_name resolver the configs use)

ROOT = rootutils.setup_root(__file__, indicator=".project-root")  # and PROJECT_ROOT, which conf/paths reads

POEMS = [  # traditional script, as in the shipped corpus
    "床前明月光，疑是地上霜。舉頭望明月，低頭思故鄉。",
    "白日依山盡，黃河入海流。欲窮千里目，更上一層樓。",
    "春眠不覺曉，處處聞啼鳥。夜來風雨聲，花落知多少。",
    "千山鳥飛絕，萬徑人蹤滅。孤舟蓑笠翁，獨釣寒江雪。",
    "紅豆生南國，春來發幾枝。願君多采擷，此物最相思。",
    "朝辭白帝彩雲間，千里江陵一日還。兩岸猿聲啼不住，輕舟已過萬重山。",
]


def write_corpus(path: Path, texts: list[str] = POEMS, copies: int = 20) -> Path:
    """A corpus file in the shipped format: `copies` copies of `texts`, every fifth copy held out,
    each tagged with its form (`form_of`, as `data/build_corpus.py` does)."""
    from data.verse.poetry import form_of

    path.parent.mkdir(parents=True, exist_ok=True)
    with lzma.open(path, "wt", encoding="utf-8") as f:
        for c in range(copies):
            for i, text in enumerate(texts):
                split = "val" if c % 5 == 0 else "train"
                f.write(json.dumps({"id": f"{c}-{i}", "title": "", "author": "", "form": form_of(text),
                                    "split": split, "text": text}, ensure_ascii=False) + "\n")
    return path


@pytest.fixture
def tiny_corpus(tmp_path: Path) -> Path:
    return write_corpus(tmp_path / "corpus" / "tang.jsonl.xz")


def tiny_overrides(tmp_path: Path, corpus: Path) -> list[str]:
    """Overrides of the train config for a tiny model and data, writing under tmp_path
    (also the command line of tests that run train.py in a subprocess)."""
    return [
        f"data.corpus_path={corpus}", f"data.cache_dir={tmp_path / 'cache'}",
        f"paths.checkpoint_dir={tmp_path / 'checkpoints'}", f"paths.log_dir={tmp_path / 'logs'}",
        "trainer=cpu", "model.n_layer=2", "model.n_head=2", "model.n_embd=32",
        "model.block_size=16", "data.batch_size=8", "model.optim.warmup_steps=2",
        "trainer.max_steps=40", "trainer.val_check_interval=20", "trainer.num_sanity_val_steps=0",
        "trainer.enable_progress_bar=false", "trainer.log_every_n_steps=5",
        "callbacks.samples.max_new_tokens=20", "callbacks.attention_maps.n_samples=4",
        "callbacks.attention_maps.probe_lines=['床前明月光，疑是地上霜。','白日依山尽，黄河入海流。']",
        "callbacks.evaluation.num_samples=4", "callbacks.evaluation.forms=[wujue,qilv]",
        "callbacks.evaluation.sets=[free,form,meter]", "callbacks.evaluation.max_new_tokens=70",
        "callbacks.evaluation.reference=20",
    ]


def compose_sample(*overrides: str):
    """conf/sample.yaml composed (its sampling recipe from model/sampling/recipe.yaml), as `python sample.py` reads it."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return compose("sample", overrides=list(overrides))


def make_train_cfg(tmp_path: Path, corpus: Path, monkeypatch):
    """A maker of the real train config with a tiny model and data (`tiny_overrides`) and
    run_name `test`, writing under tmp_path."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)

    def make(*overrides: str):
        with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
            cfg = compose("train", return_hydra_config=True,
                          overrides=[*tiny_overrides(tmp_path, corpus), "run_name=test", *overrides])
        HydraConfig().set_config(cfg)
        with open_dict(cfg):
            cfg.paths.output_dir = str(tmp_path / "logs" / "test")
            del cfg.hydra
        return cfg

    return make


@pytest.fixture
def train_cfg(tmp_path: Path, tiny_corpus: Path, monkeypatch):
    return make_train_cfg(tmp_path, tiny_corpus, monkeypatch)


@pytest.fixture(scope="session")
def corpus_texts() -> list[str]:
    """The shipped corpus's poems (traditional script), for tests whose point is the real data."""
    from data.corpus_io import load_corpus

    return [p["text"] for p in load_corpus(ROOT / "data" / "corpus" / "tang.jsonl.xz")]


def engine_of(gpt):
    """The inference engine around a bare GPT, with a character tokenizer of its vocabulary size
    (CJK ideographs from U+4E00 after `<bos>`, `<eos>`)."""
    from data.tokenizer import CharTokenizer
    from model.engine import Engine

    return Engine(gpt, CharTokenizer(chr(0x4E00 + i) for i in range(gpt.cfg.vocab_size - 2)))


def generate(gpt, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, eos_id=None, generator=None,
             use_cache=True, processors=()):
    """Sampled continuations of idx through the engine: `Engine.generate` drawing with
    `sampler(temperature, top_k, top_p, generator)` (`model.decoding`)."""
    from model.decoding import sampler

    return engine_of(gpt).generate(idx, max_new_tokens, sampler(temperature, top_k, top_p, generator), eos_id,
                                   use_cache, processors)
