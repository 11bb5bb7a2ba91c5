"""The end-of-training table of each head switched off (`HeadEffectsLogger`): what it logs to
wandb, on which poems, and that it leaves the model as it found it."""
from types import SimpleNamespace
from unittest.mock import create_autospec

import pytest
from lightning.pytorch.loggers import WandbLogger

from data.corpus_io import heldout_poems
from model.inspection.head_effects import KINDS, HeadScorer, head_effects
from model.loading import load_engine
from model.training.callbacks import HeadEffectsLogger
from tests.conftest import write_corpus
from tests.test_attention_maps import write_checkpoint


def test_the_table_is_each_head_off_on_the_first_validation_poems(tmp_path):
    corpus = write_corpus(tmp_path / "tang.jsonl.xz")
    engine = load_engine(write_checkpoint(tmp_path / "run" / "last.ckpt"))
    engine.model.train()
    logger = create_autospec(WandbLogger, instance=True)
    trainer = SimpleNamespace(loggers=[logger], global_step=40)
    callback = HeadEffectsLogger(str(corpus), n_poems=3)
    callback.on_train_end(trainer, SimpleNamespace(engine=engine))
    assert engine.model.training and engine.ablated == []  # the mode it was in, every head on
    poems = heldout_poems(corpus, engine.script, 3, None, 10 ** 9)
    engine.model.eval()
    expected = head_effects(engine, poems)
    table = logger.log_table.call_args.kwargs
    assert table["key"] == "heads/effects" and table["columns"] == ["head", *KINDS] and table["step"] == 40
    assert [r[0] for r in table["data"]] == ["L0H0", "L0H1", "L1H0", "L1H1", "L0 mean", "L1 mean"]
    assert table["data"][2][1:] == pytest.approx([expected["heads"][2][k] for k in KINDS], abs=1e-9)
    assert table["data"][5][2] == pytest.approx(expected["layer_mean"][1]["rhyme_slot"], abs=1e-9)
    (metrics,), kw = logger.log_metrics.call_args
    assert metrics["heads/seconds"] == callback.seconds > 0 and kw == {"step": 40}


def test_without_wandb_it_logs_nothing_and_a_long_poem_is_cut_at_the_block(tmp_path):
    corpus = write_corpus(tmp_path / "tang.jsonl.xz")
    engine = load_engine(write_checkpoint(tmp_path / "run" / "last.ckpt"))
    callback = HeadEffectsLogger(str(corpus))
    callback.on_train_end(SimpleNamespace(loggers=[], global_step=0), SimpleNamespace(engine=engine))
    assert callback.seconds == 0
    long = "朝辭白帝彩雲間，千里江陵一日還。兩岸猿聲啼不住，輕舟已過萬重山。"  # 32 characters, block 32
    scorer = HeadScorer(engine, [long])
    assert scorer.counts.tolist() == [31, 1, 4, 3, 0]  # 31 targets; the 2nd line's rhyme; no 4th line's, no <eos>
