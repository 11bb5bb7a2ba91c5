"""Titles, poets and keyword hints (data/conditions.py, data/verse/plan.py's segment,
model/sampling/conditions.py): how a poem is framed with them, that their targets are never
scored, how a sampler gives them, and every refusal."""
import json
import lzma

import numpy as np
import pytest
import torch

from data.conditions import check_shares, draw_conditions, poets, segment_positions
from data.datamodule import PoetryDataModule
from data.tokenizer import CharTokenizer
from data.verse.plan import MAX_TITLE, clean_title, plan_ids, plan_labels, poem_ids, segment_ids
from data.verse.poetry import form_of
from data.windows import IGNORE, PoemWindows, Windows
from model.checkpoint_meta import CheckpointMeta
from model.sampling.poems import SamplingOptions, poem_steps, read_plans, sample_ids, sample_poems
from model.training.lit import LitGPT
from tests.conftest import POEMS

OPTIM = {"lr": 1e-3, "weight_decay": 0.1, "betas": [0.9, 0.95], "warmup_steps": 1, "min_lr_ratio": 0.1}
TITLES = ["靜夜思", "登鸛雀樓", "春曉", "江雪", "相思", "早發白帝城"]
AUTHORS = ["李白", "王之渙", "孟浩然", "柳宗元", "王維", "李白"]


def conditioned(segments=True):
    torch.manual_seed(0)
    tok = CharTokenizer.from_texts(POEMS + TITLES + AUTHORS + ["杜甫"], plan_labels(segments=segments))
    model = {"block_size": 96, "n_layer": 1, "n_head": 2, "n_embd": 16}
    meta = CheckpointMeta({"title": 0.5, "poet": 0.5, "keywords": 0.5}, {"李白": 120, "杜甫": 110}) if segments else None
    return LitGPT(model, OPTIM, tok.state_dict(), script="traditional", meta=meta).eval().engine


@pytest.fixture(scope="module")
def engine():
    return conditioned()


def test_titles_are_cleaned():
    assert clean_title("帝京篇十首 一") == "帝京篇十首"
    assert clean_title("《静夜思》") == "静夜思"
    assert clean_title("春" * (MAX_TITLE + 1)) == ""
    assert clean_title("") == ""


def test_a_poem_is_framed_with_its_segment_and_the_segment_is_never_scored(engine):
    tok, ids = engine.tokenizer, plan_ids(engine.tokenizer)
    seg = segment_ids(tok, "靜夜思", "李白", ["明月"])
    framed = poem_ids(tok, POEMS[0], "traditional", segment=seg)
    plain = poem_ids(tok, POEMS[0], "traditional")
    assert framed[0] == tok.bos_id and framed[1] == ids.segments["title"] and len(seg) == 1 + 3 + 1 + 2 + 1 + 2
    assert framed[len(seg) + 1:] == plain[1:]
    mask = ids.segment_mask(framed + plain)
    assert mask == [False] + [True] * len(seg) + [False] * (len(plain) - 1) + [False] * len(plain)
    assert segment_positions(np.array(framed + plain), ids).tolist() == mask
    assert ids.body(framed) == plain
    assert ids.read_segment(tok, framed) == {"title": "靜夜思", "poet": "李白", "keywords": ["明月"]}
    assert tok.decode(ids.body(framed)) == POEMS[0]
    # the windows score the same characters with and without a segment: its targets are IGNORE
    arr = np.array(framed + framed, dtype=np.uint16)
    x, y = Windows(arr, len(framed) - 1, np.array([0]), segment_positions(arr, ids))[0]
    assert (y[: len(seg)] == IGNORE).all() and y[len(seg)] == plain[1] and (y[len(seg):] != IGNORE).all()
    px, py = PoemWindows(arr, 96, 0, segment_positions(arr, ids))[0]
    assert int((py != IGNORE).sum()) == len(plain) - 1


def test_a_model_without_markers_has_no_segment():
    tok = CharTokenizer.from_texts(POEMS, plan_labels())
    assert segment_ids(tok) == [] and plan_ids(tok).segments == {}
    with pytest.raises(ValueError, match="trained without titles"):
        segment_ids(tok, title="春曉")


def test_shares_and_poets_are_checked():
    assert check_shares({"title": 0.5}) == {"title": 0.5, "poet": 0.0, "keywords": 0.0}
    with pytest.raises(ValueError, match="unknown"):
        check_shares({"author": 0.5})
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        check_shares({"title": 1.5})
    assert poets(["甲"] * 100 + ["乙"] * 99 + [""] * 200) == {"甲": 100}


def test_each_condition_is_given_to_its_share_of_the_poems():
    n = 600
    texts, titles, authors = [POEMS[i % 6] for i in range(n)], [TITLES[i % 6] + " 二" for i in range(n)], \
        [AUTHORS[i % 6] for i in range(n)]
    drawn = draw_conditions(texts, titles, authors, {"title": 0.5, "poet": 1.0, "keywords": 0.25}, {"李白": 200})
    assert abs(np.mean([bool(d["title"]) for d in drawn]) - 0.5) < 0.07
    assert all(d["title"] in TITLES for d in drawn if d["title"])  # the series number cut
    assert all(d["poet"] == ("李白" if a == "李白" else "") for d, a in zip(drawn, authors))
    with_kw = [d for d in drawn if d["keywords"]]
    assert abs(len(with_kw) / n - 0.25) < 0.07
    assert all(1 <= len(d["keywords"]) <= 3 and all(w in t for w in d["keywords"]) for d, t in zip(drawn, texts)
               if d["keywords"])
    assert draw_conditions(texts, titles, authors, {"title": 0, "poet": 0, "keywords": 0}, {}) == \
        [{"title": "", "poet": "", "keywords": []}] * n


def test_conditions_need_plan_tokens(tmp_path):
    with pytest.raises(ValueError, match="plan_tokens"):
        PoetryDataModule("x", str(tmp_path), conditions={"title": 0.5})


def test_prepared_arrays_hold_segments_in_training_only(tmp_path):
    path = tmp_path / "tang.jsonl.xz"
    with lzma.open(path, "wt", encoding="utf-8") as f:
        for c in range(20):
            for i, text in enumerate(POEMS):
                f.write(json.dumps({"id": f"{c}-{i}", "title": TITLES[i], "author": AUTHORS[i], "form": form_of(text),
                                    "split": "val" if c % 5 == 0 else "train", "text": text}, ensure_ascii=False) + "\n")
    dm = PoetryDataModule(str(path), str(tmp_path / "cache"), "traditional", block_size=32, plan_tokens=True,
                          conditions={"title": 1.0, "poet": 1.0, "keywords": 0.0})
    dm.prepare_data()
    dm.setup()
    ids = plan_ids(dm.tokenizer)
    markers = list(ids.segments.values())
    assert np.isin(dm.tokens("train"), markers).any() and not np.isin(dm.tokens("val"), markers).any()
    assert dm.meta["val_titled"]["characters"] == dm.meta["val"]["characters"]
    assert dm.meta["poets"] == {} and dm.conditions["title"] == 1.0  # 李白: 32 poems, < 100
    assert (dm.tokens("train") == ids.segments["poet"]).sum() == 0
    titled = dm.tokens("val_titled")  # a title only where the poem fits 33 tokens with it, as in training:
    # each 五绝 (28 tokens, a title of at most 5) and no 七绝 (36 tokens: longer than a window already)
    assert (titled == ids.segments["title"]).sum() == dm.meta["val"]["poems"] * 5 // 6 == 20
    qijue = poem_ids(dm.tokenizer, POEMS[5], "traditional", "qijue")
    assert np.array_equal(np.split(titled, np.flatnonzero(titled == 0)[1:])[5], qijue)


def test_a_title_and_a_poet_go_before_the_plan_and_never_into_the_poem(engine):
    opts = SamplingOptions(num_samples=6, title="静夜思", poet="李白", form="wujue", rhyme=True, max_new_tokens=60,
                           title_plan=False)
    rows = sample_ids(engine, opts)
    ids = plan_ids(engine.tokenizer)
    assert all(ids.read_segment(engine.tokenizer, r.tolist()) == {"title": "靜夜思", "poet": "李白"} for r in rows)
    assert all(p["form"] == "wujue" for p in read_plans(engine.tokenizer, rows))
    poems = sample_poems(engine, opts)
    assert all(form_of(p) == "wujue" for p in poems)
    assert not any(p.startswith("靜夜思") for p in poems)


def test_forced_keywords_are_written_and_hints_go_into_the_segment(engine):
    rows = [["明月"], ["故鄉", "黃河"], ["白日"]]
    opts = SamplingOptions(num_samples=3, keywords=rows, form="wujue", title="相思", max_new_tokens=60)
    start, _, _ = poem_steps(engine, opts)
    seg = segment_ids(engine.tokenizer, "相思")
    assert (start == start[0]).all() and start[0, :len(seg) + 1].tolist() == [0, *seg]  # the title, no hints
    assert int(start[0, len(seg) + 1]) == plan_ids(engine.tokenizer).forms["wujue"]  # then the form
    hinted, _, _ = poem_steps(engine, SamplingOptions(**{**opts.__dict__, "keywords_forced": False}))
    assert hinted[0, 0] == engine.tokenizer.eos_id and hinted[1, 0] == engine.tokenizer.bos_id  # shorter: <eos> in front
    for use_cache in (True, False):
        poems = sample_poems(engine, SamplingOptions(**{**opts.__dict__, "use_cache": use_cache}))
        assert all(all(w in p for w in k) for p, k in zip(poems, rows))
    hints = sample_ids(engine, SamplingOptions(num_samples=3, keywords=rows, keywords_forced=False, max_new_tokens=40))
    read = [plan_ids(engine.tokenizer).read_segment(engine.tokenizer, r.tolist()) for r in hints]
    assert [r["keywords"] for r in read] == [["明月"], ["故鄉", "黃河"], ["白日"]]


def test_after_the_segment_the_plan_comes_first(engine):
    ids = plan_ids(engine.tokenizer)
    opts = SamplingOptions(num_samples=4, title="春曉", max_new_tokens=5, temperature=2.0, title_plan=False)
    rows = sample_ids(engine, opts)
    n = len(segment_ids(engine.tokenizer, "春曉")) + 1
    assert all(int(r[n]) in ids.forms.values() and int(r[n + 1]) in [*ids.rhymes.values(), ids.none] for r in rows)


@pytest.mark.parametrize("opts, match", [
    ({"poet": "李百"}, "nearest: 李白"),
    ({"poet": "蘇軾"}, "not one of the 2 poets"),
    ({"title": "春" * (MAX_TITLE + 1)}, "at most 12"),
    ({"title": "Spring"}, "CJK characters only"),
])
def test_conditions_that_cannot_be_given_are_refused(engine, opts, match):
    with pytest.raises(ValueError, match=match):
        sample_poems(engine, SamplingOptions(**opts))


@pytest.mark.parametrize("opts, match", [
    ({"title": "春曉"}, "title= needs a model trained with titles"),
    ({"poet": "李白"}, "poet= needs a model trained with poets"),
    ({"keywords": ["明月"], "keywords_forced": False}, "keywords_forced=false"),
])
def test_a_model_without_conditions_refuses_them(opts, match):
    with pytest.raises(ValueError, match=match):
        sample_poems(conditioned(segments=False), SamplingOptions(**opts))


def test_sample_py_lists_the_poets_and_refuses_a_model_without(engine, capsys):
    from sample import list_poets

    assert list_poets(engine, None) == ["李白", "杜甫"]
    assert capsys.readouterr().out == "poet\ttraining poems\n李白\t120\n杜甫\t110\n"
    with pytest.raises(ValueError, match="none to list"):
        list_poets(conditioned(segments=False), None)


def test_a_segment_never_pushes_a_poem_out_of_its_window(engine):
    from data.conditions import fitted

    tok = engine.tokenizer
    drawn = {"title": "靜夜思", "poet": "李白", "keywords": ["明月", "故鄉"]}
    full = segment_ids(tok, "靜夜思", "李白", ["明月", "故鄉"])
    assert fitted(tok, drawn, 100) == full
    assert fitted(tok, drawn, len(full) - 1) == segment_ids(tok, "靜夜思", "李白", ["明月"])
    assert fitted(tok, drawn, 7) == segment_ids(tok, "靜夜思", "李白")
    assert fitted(tok, drawn, 5) == segment_ids(tok, "靜夜思") and fitted(tok, drawn, 3) == fitted(tok, drawn, -9) == []


def test_titles_and_poets_per_poem(engine):
    opts = SamplingOptions(num_samples=3, title=["春曉", "江雪", ""], poet=["李白", "", "杜甫"], max_new_tokens=30,
                           title_plan=False)
    rows = sample_ids(engine, opts)
    read = [plan_ids(engine.tokenizer).read_segment(engine.tokenizer, r.tolist()) for r in rows]
    assert read == [{"title": "春曉", "poet": "李白"}, {"title": "江雪"}, {"poet": "杜甫"}]
    with pytest.raises(ValueError, match="one string for each of the 3 poems, got 2"):
        sample_poems(engine, SamplingOptions(num_samples=3, title=["春曉", "江雪"]))


def test_evaluation_sets_of_a_model_with_conditions(engine):
    from model.inspection.evaluation import EVERY_POET, HELD_OUT, sample_planned_sets, sample_requests

    assert "title" not in sample_requests(["conditions"], [], plan_model=True)
    requests = sample_requests(["conditions"], [], plan_model=True, conditions_model=True)
    assert requests == {"title": {"title": HELD_OUT, "title_plan": False}, "poet": {"poet": EVERY_POET},
                        "hints": {"keywords": HELD_OUT, "keywords_forced": False}}
    base = SamplingOptions(num_samples=4, max_new_tokens=40)
    poems, plans, keywords = sample_planned_sets(engine, base, requests, POEMS * 2, ["春曉", "江雪", "相思", "登鸛雀樓"])
    assert all(len(p) == 4 for p in poems.values()) and len(keywords["hints"]["keywords"]) == 4


@pytest.mark.parametrize("words", [["明月。"], ["床前明月光疑是地"]])
def test_keyword_hints_are_checked_as_forced_keywords_are(engine, words):
    with pytest.raises(ValueError, match="keyword hint"):
        sample_poems(engine, SamplingOptions(keywords=words, keywords_forced=False))
