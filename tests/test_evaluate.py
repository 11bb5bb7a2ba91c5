"""evaluate.py's parts without a training run (the end-to-end run on a trained checkpoint is in test_train.py)."""
import pytest
import torch
from hydra import compose, initialize_config_dir

import evaluate as evaluate_script
from data.tokenizer import CharTokenizer
from data.verse.meter import matching_patterns, poem_lines
from data.verse.poetry import form_of
from data.verse.script import corpus_to_script
from model.inspection.evaluation import REFERENCE, evaluation_rows, reference_poems, sample_requests, sample_sets
from model.sampling.poems import SamplingOptions
from model.training.lit import LitGPT
from tests.conftest import POEMS, ROOT, write_corpus


def test_sample_requests():
    assert sample_requests(["free", "form", "rhyme", "meter"], ["wujue"]) == {
        "free": {}, "wujue": {"form": "wujue"}, "wujue+rhyme": {"form": "wujue", "rhyme": True},
        "wujue+meter": {"form": "wujue", "meter": True}}
    assert list(sample_requests(["meter"], ["qilv", "wulv"])) == ["qilv+meter", "wulv+meter"]
    assert sample_requests(["free", "meter"], ["wujue"], char_model=False) == {"free": {}}  # BPE: no controls
    with pytest.raises(ValueError, match="sonnet"):
        sample_requests(["free"], ["sonnet"])
    with pytest.raises(ValueError, match="acrostic"):
        sample_requests(["acrostic"], [])


def test_sample_sets_go_through_the_sampling_options():
    torch.manual_seed(0)
    tok = CharTokenizer.from_texts(corpus_to_script(POEMS, "simplified"))
    lit = LitGPT(dict(block_size=32, n_layer=1, n_head=2, n_embd=16), {}, tok.state_dict()).eval()
    base = SamplingOptions(num_samples=3, max_new_tokens=30, seed=5)
    sets = sample_sets(lit.engine, base, sample_requests(["free", "form", "meter"], ["wujue"]))
    assert list(sets) == ["free", "wujue", "wujue+meter"] and all(len(p) == 3 for p in sets.values())
    assert all(form_of(p) == "wujue" for p in sets["wujue"])
    assert all(matching_patterns(poem_lines(p), "wujue", "simplified") for p in sets["wujue+meter"])
    assert sample_sets(lit.engine, base, {"free": {}}) == {"free": sets["free"]}  # seeded


def test_evaluation_rows_put_the_reference_first_on_equal_distinct_counts(tmp_path):
    corpus = write_corpus(tmp_path / "tang.jsonl.xz")
    rows = evaluation_rows({"free": ["白日依山尽，黄河入海流。"] * 2}, ["床前明月光，疑是地上霜。"] * 5, corpus,
                           "simplified")
    assert list(rows) == [REFERENCE, "free"] and rows[REFERENCE]["n"] == 5
    assert rows[REFERENCE]["distinct_1"] == 10 / 20  # over the first 2 poems, as many as the sample set
    assert rows["free"]["copy"] == 1  # both lines are in the tiny corpus's training poems


def test_reference_poems_are_spread_over_the_held_out_split(tmp_path):
    corpus = write_corpus(tmp_path / "tang.jsonl.xz")  # 4 held-out copies of the 6 poems: 24 in corpus order
    jingyesi = "床前明月光，疑是地上霜。举头望明月，低头思故乡。"
    assert reference_poems(corpus, "simplified", 4) == [jingyesi] * 4  # poems 0, 6, 12, 18
    spread = reference_poems(corpus, "simplified", 3)  # 0, 8, 16: poems 0, 2, 4 of the list
    assert [p[:2] for p in spread] == ["床前", "春眠", "红豆"]
    assert len(reference_poems(corpus, "traditional", 100)) == 24 and reference_poems(corpus, "simplified", 0) == []


def evaluate_cfg(tmp_path, *overrides):
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("evaluate", overrides=[f"paths.checkpoint_dir={tmp_path / 'none'}", f"paths.log_dir={tmp_path}",
                                             f"data.corpus_path={tmp_path / 'tang.jsonl.xz'}", *overrides])
    return cfg


@pytest.mark.parametrize("override, match", [
    ("sets=[free,acrostic]", "acrostic"),
    ("forms=[sonnet]", "sonnet"),
    ("num_samples=0", "num_samples must be"),
    ("temperature=-1", "temperature"),
    ("device=cuda", "no CUDA GPU"),
])
def test_bad_options_are_refused_before_any_work(tmp_path, override, match):
    if override == "device=cuda" and torch.cuda.is_available():
        pytest.skip("checks the CPU-only machine's message")
    with pytest.raises(ValueError, match=match):
        evaluate_script.evaluate(evaluate_cfg(tmp_path, override))
    assert not (tmp_path / "evaluate").exists()


def test_a_missing_checkpoint_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint under"):
        evaluate_script.evaluate(evaluate_cfg(tmp_path))
    with pytest.raises(FileNotFoundError, match="nothing.ckpt"):
        evaluate_script.evaluate(evaluate_cfg(tmp_path, f"ckpt_path={tmp_path / 'nothing.ckpt'}"))


def test_evaluation_callback_checks_its_sets_and_needs_a_wandb_logger(tmp_path):
    import types

    from model.training.callbacks import PoemEvaluationLogger

    with pytest.raises(ValueError, match="sonnet"):
        PoemEvaluationLogger(str(tmp_path / "tang.jsonl.xz"), forms=["sonnet"])
    callback = PoemEvaluationLogger(str(tmp_path / "missing.jsonl.xz"))
    callback.on_train_end(types.SimpleNamespace(loggers=[]), None)  # no wandb: nothing sampled, nothing read
    assert callback.seconds == 0
