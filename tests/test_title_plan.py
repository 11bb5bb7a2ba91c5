"""A plan from the title (data/title_plan.py, model/sampling/title_plan.py): the words a title plans,
their determinism, the cache, and how sampling, sample.py's JSONL and the studio give them."""
import dataclasses
import json
import math

import pytest
import torch

from data.title_plan import LEAN_CAP, LEAN_PRIOR, TitlePlanner, check_mode, load_planner, plan_size
from model.sampling import title_plan
from model.sampling.poems import SamplingOptions, poem_steps, sample_poems
from model.sampling.title_plan import topic_lean, unplanned, with_plan
from tests.conftest import POEMS, write_corpus
from tests.test_conditions import conditioned

TITLES = ["靜夜思", "登鸛雀樓", "春曉", "江雪", "相思", "早發白帝城"]
TEXTS = POEMS  # the six poems, traditional script, their titles above


@pytest.fixture(scope="module")
def planner():
    """Three copies of the six poems (a word needs 3 poems), their titles, and a 思 poem more."""
    return TitlePlanner.build(TITLES * 3 + ["秋思"], TEXTS * 3 + ["明月照高樓，流光正徘徊。故鄉何處是，思歸多苦顏。"])


def test_a_title_plans_its_neighbours_words_first_and_echo_its_own_words_first(planner):
    plan = planner.plan("靜夜思", 4)
    shared = [bool(set(w) & set("靜夜思")) for w in plan]
    assert plan and shared == sorted(shared)  # issue 60: the sub-topics first, the title's own words only after
    words = planner.plan("靜夜思", 4, echo=True)
    assert words == planner.plan("靜夜思", 4, echo=True) and sorted(words) == sorted(plan)  # deterministic
    assert 1 <= len(words) <= 4 and len(set("".join(words))) == len("".join(words))  # no character twice
    assert all(len(w) == 2 for w in words)
    assert all(w in TEXTS[0] for w in words)  # the nearest title's poem lends them (秋思's shares only 思)
    assert all(w in TEXTS[3] for w in planner.plan("江雪", 2)) and planner.plan("江雪", 2)
    assert planner.plan("靜夜思", 1, echo=True) == words[:1]


def test_a_title_the_corpus_never_used_plans_nothing(planner):
    assert planner.plan("xyz", 4) == [] and planner.plan("龘", 4) == []


def test_the_index_is_cached_and_reads_back_the_same(tmp_path, planner):
    corpus = write_corpus(tmp_path / "tang.jsonl.xz", POEMS, copies=5)
    built = load_planner(str(corpus), str(tmp_path / "cache"), "traditional")
    files = list((tmp_path / "cache").glob("title-plan-*.npz"))
    assert len(files) == 1
    load_planner.cache_clear()
    again = load_planner(str(corpus), str(tmp_path / "cache"), "traditional")
    assert again.words == built.words and (again.df == built.df).all()
    path = tmp_path / "p.npz"
    planner.save(path)
    assert TitlePlanner.load(path).plan("靜夜思", 4) == planner.plan("靜夜思", 4)


def test_the_planned_words_lean_toward_the_characters_of_their_poems(planner):
    lean = planner.leaning(["故鄉"], skip="靜夜思")
    n_w = 4  # 靜夜思 three times and 秋思 use 故鄉; 床 stands in 3 of them, in 3 of the 19 poems
    expected = math.log((3 + LEAN_PRIOR) / (n_w * 3 / 19 + LEAN_PRIOR))
    assert lean["床"] == pytest.approx(expected, abs=1e-4) and 0 < lean["床"] <= LEAN_CAP
    assert lean["明"] > lean["床"] and not set(lean) & set("故鄉靜夜思")  # 明 in all 4; never the words' or title's
    assert "雪" not in lean  # 江雪's, in none of the poems using 故鄉: less likely there, no lean
    assert planner.leaning(["故鄉", "故鄉"]) == planner.leaning(["故鄉"])  # the mean over the words
    assert planner.leaning(["龘龘"]) == {} and planner.leaning([]) == {}


def test_plan_sizes_and_modes():
    assert [plan_size(f) for f in ("wujue", "qijue", "wulv", "qilv", None, "ci")] == [2, 2, 4, 4, 4, 2]  # a couplet each
    assert [plan_size(f, echo=True) for f in ("wujue", "qijue", "wulv", "qilv", None, "ci")] == [2, 2, 4, 4, 2, 2]
    assert [plan_size("ci", t) for t in ("浣溪沙", "如梦令")] == [2, 1]  # a stanza each
    assert [check_mode(m) for m in (True, "true", False, "false", "hints", "echo")] == \
        [True, True, False, False, "hints", "echo"]
    with pytest.raises(ValueError, match="title_plan='maybe' is not one of true"):
        check_mode("maybe")


@pytest.fixture
def engine(monkeypatch, planner):
    monkeypatch.setattr(title_plan, "planner", lambda script: planner)
    return conditioned()


def test_a_title_without_keywords_is_written_around_its_plan(engine, planner):
    opts = SamplingOptions(num_samples=4, title="静夜思", form="wujue", max_new_tokens=40, seed=3)
    planned = with_plan(engine, opts, opts.form)
    assert planned.keywords == planner.plan("靜夜思", 2) and planned.keywords_forced  # a word a couplet
    assert all(all(w in p for w in planned.keywords) for p in sample_poems(engine, opts))  # forced, as keywords
    assert with_plan(engine, SamplingOptions(title="静夜思", title_plan=False)).keywords == ""
    assert with_plan(engine, SamplingOptions(title="静夜思", keywords="明月")).keywords == "明月"  # the user's words
    assert with_plan(engine, SamplingOptions(title="静夜思", title_plan="hints")).keywords_forced is False
    rows = with_plan(engine, SamplingOptions(num_samples=2, title=["静夜思", "江雪"])).keywords
    assert rows == [planner.plan("靜夜思", 4), planner.plan("江雪", 4)]
    echoed = with_plan(engine, SamplingOptions(title="静夜思", title_plan="echo"), "wujue")
    assert echoed.keywords == planner.plan("靜夜思", 2, echo=True) and echoed.keywords_forced  # as before issue 60
    opts = SamplingOptions(title="杜甫")
    assert with_plan(engine, opts) is opts  # no training title shares a character: the title alone, said in one line
    _, _, decision = poem_steps(engine, opts)
    assert decision.title_plan_words is None
    assert unplanned(opts, decision.title_plan_words).startswith("title_plan: nothing planned for title=杜甫")
    _, _, decision = poem_steps(engine, SamplingOptions(title="静夜思"))
    assert decision.title_plan_words == (tuple(planner.plan("靜夜思", 4)),)
    with pytest.raises(dataclasses.FrozenInstanceError):  # decided once (issue 59): nothing changes it afterwards
        decision.plans = ((),)
    assert unplanned(SamplingOptions(title="静夜思"), decision.title_plan_words) == ""
    poem_steps(engine, SamplingOptions(title="静夜思", title_plan="hints", max_new_tokens=30))  # hints: no mask, checks pass


def test_the_plan_leans_the_logits_toward_its_words_characters(engine, planner):
    lean = topic_lean(engine, [("故鄉",)], ["静夜思"], 2.0, 1)  # one row of words, one title: every row
    leaning = planner.leaning(["故鄉"], "靜夜思")
    ids = {engine.tokenizer.stoi[c]: v for c, v in leaning.items() if c in engine.tokenizer.stoi}  # 秋思's 照: none
    assert lean.bias.shape == (1, engine.tokenizer.vocab_size) and len(ids) > 3
    assert all(lean.bias[0, i].item() == pytest.approx(2 * v) for i, v in ids.items())
    assert int((lean.bias != 0).sum()) == len(ids)
    bed = engine.tokenizer.stoi["床"]
    ids_of = engine.tokenizer.encode
    idx = torch.tensor([[engine.tokenizer.bos_id, *ids_of("低頭")], ids_of("低頭床")])  # the same, and 床
    out = lean(idx, torch.zeros(2, engine.tokenizer.vocab_size))  # (2, V)
    assert out[0, bed].item() == pytest.approx(2 * leaning["床"]) and out[1, bed].item() == 0.0  # written: no more
    assert torch.equal(out[0], out[1].index_put((torch.tensor([bed]),), out[0, bed:bed + 1]))
    line_end = lean(torch.tensor([[engine.tokenizer.bos_id, *ids_of("舉頭望明")]]), torch.zeros(1, out.size(1)))
    assert not line_end.any()  # the fifth character of the first line: where a rhyme may fall, not leaned
    second = ids_of("床前明月光，疑是地")  # the first line had 5: the second line's 5th is its last
    assert lean(torch.tensor([[0, *second]]), torch.zeros(1, out.size(1))).any()
    assert not lean(torch.tensor([[0, *second, *ids_of("上")]]), torch.zeros(1, out.size(1))).any()
    seven = topic_lean(engine, [("故鄉",)], ["静夜思"], 2.0, 1, line_len=7)  # a 七言 form: 7 a line
    assert seven(torch.tensor([[0, *ids_of("舉頭望明月")]]), torch.zeros(1, out.size(1))).any()
    opts = SamplingOptions(num_samples=8, title="静夜思", form="wujue", max_new_tokens=40, seed=3)
    base, leaned = (sample_poems(engine, dataclasses.replace(opts, topic_lean=w)) for w in (0.0, 8.0))
    words = planner.plan("靜夜思", 2)
    assert all(all(w in p for w in words) for p in leaned)  # the forced words stay
    near = set(leaning) - set("".join(words))
    assert sum(c in near for p in leaned for c in p) > sum(c in near for p in base for c in p)
    with pytest.raises(ValueError, match=r"^topic_lean must be ≥ 0 \(0 = off\), got -1.0$"):
        poem_steps(engine, dataclasses.replace(opts, topic_lean=-1.0))
    with pytest.raises(ValueError, match=r"^topic_lean must be ≥ 0 \(0 = off\), got 'abc'$"):  # not a TypeError
        poem_steps(engine, dataclasses.replace(opts, topic_lean="abc"))
    echo = dataclasses.replace(opts, title_plan="echo")  # the plan before issue 60, kept as it was: no lean
    assert sample_poems(engine, echo) == sample_poems(engine, dataclasses.replace(echo, topic_lean=0.0))


def test_sample_py_records_the_planned_words(engine, planner, monkeypatch, capsys):
    import io

    import sample
    from tests.conftest import compose_sample

    monkeypatch.setattr(sample, "load_engine", lambda *a, **k: engine)
    cfg = compose_sample("title='静夜思'", "form=wujue", "num_samples=2", "format=jsonl", "max_new_tokens=40")
    out = io.StringIO()
    sample.sample(cfg, out)
    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["title_plan_words"] for r in rows] == [planner.plan("靜夜思", 2)] * 2
    assert all(all(w in r["poem"] for w in r["title_plan_words"]) for r in rows) and rows[0]["keywords_forced"]
    out = io.StringIO()
    sample.sample(compose_sample("title='静夜思'", "title_plan=hints", "num_samples=1", "format=jsonl",
                                 "max_new_tokens=40"), out)
    assert json.loads(out.getvalue())["keywords_forced"] is False  # the plan's words as hints, as recorded
    capsys.readouterr()
    sample.sample(compose_sample("title='静夜思'", "form=wujue", "num_samples=2", "max_new_tokens=40"), io.StringIO())
    assert capsys.readouterr().err == "title_plan: " + "、".join(planner.plan("靜夜思", 2)) + "\n"  # text: said once


def test_the_studio_shows_the_plan_before_the_poem(engine, planner, monkeypatch, tmp_path):
    from starlette.testclient import TestClient

    from model.studio import server

    monkeypatch.setattr(server, "load_engine", lambda *a, **k: engine)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "last.ckpt").write_bytes(b"")
    client = TestClient(server.create_app(tmp_path, str(tmp_path / "run" / "last.ckpt")), base_url="http://127.0.0.1")
    assert client.get("/plan", params={"title": "静夜思", "form": "wulv"}).json() == {"words": planner.plan("靜夜思", 4)}
    assert client.get("/plan", params={"title": "静夜思"}).json() == {"words": planner.plan("靜夜思", 4)}  # free: 4
    assert client.get("/plan", params={"title": "静夜思", "form": "wulv", "title_plan": "echo"}).json() == {
        "words": planner.plan("靜夜思", 4, echo=True)}
    assert client.get("/plan", params={"title": "abc"}).json()["error"].startswith("error: title='abc' holds characters")
    assert client.get("/plan", params={"title": "杜甫"}).json() == {
        "words": [], "note": "nothing planned for title=杜甫 (no training title shares a character with it): the poem "
                             "is written to the title alone"}
