"""Forced keywords (model/sampling/keywords.py) with a tiny random model: every poem holds them,
with every other control, and what cannot be placed is refused before sampling."""
import pytest
import torch

from data.keywords import clean_keywords, keyword_rows, poem_keywords
from data.tokenizer import CharTokenizer, UnknownCharactersError
from data.verse.meter import tones
from data.verse.poetry import FORMS, form_of, keyword_places, split_lines
from data.verse.templates import form_templates
from model.cli import quote_non_ascii_overrides
from model.inspection.evaluation import HELD_OUT, draw_keywords, evaluation_rows, sample_requests
from model.inspection.poem_metrics import keyword_placement, poem_metrics
from model.sampling.keywords import KeywordRow
from model.sampling.poems import SamplingOptions, sample_poems
from model.sampling.shape import TemplateConstraint
from model.training.lit import LitGPT
from tests.conftest import POEMS, write_corpus

OPTIM = {"lr": 1e-3, "weight_decay": 0.1, "betas": [0.9, 0.95], "warmup_steps": 1, "min_lr_ratio": 0.1}
KEYWORDS = ["明月", "故鄉"]


@pytest.fixture(scope="module")
def lit():
    """An untrained model over the test poems' characters (traditional script)."""
    torch.manual_seed(0)
    tok = CharTokenizer.from_texts(POEMS)
    model = {"block_size": 96, "n_layer": 1, "n_head": 2, "n_embd": 16}
    return LitGPT(model, OPTIM, tok.state_dict(), script="traditional").eval()


def poems(lit, n, **kw):
    return sample_poems(lit.engine, SamplingOptions(num_samples=n, temperature=1.0, top_k=None, **kw))


def holds(poem, keywords):
    return all(any(w in line for line in split_lines(poem)) for w in keywords)


@pytest.mark.parametrize("controls", [
    {}, *({"form": f} for f in FORMS), {"form": "wulv", "rhyme": True}, {"form": "qilv", "meter": True},
    {"form": "wujue", "meter": True}, {"form": "qijue", "acrostic": "春花明月"}, {"acrostic": "白花"},
    {"form": "wujue", "rhyme": True, "prompt": "白日依山盡，"},
    {"form": "qilv", "meter": True, "acrostic": "白花千月白花千月"},
])
def test_every_poem_holds_every_keyword_with_every_control(lit, controls):
    out = poems(lit, 40, keywords=KEYWORDS, **controls)
    assert all(holds(p, KEYWORDS) for p in out)
    m = poem_metrics(out, "traditional", frozenset(), keywords=[KEYWORDS] * len(out))
    assert m["keywords"] == 1
    if "form" in controls:
        assert m[controls["form"]] == 1
    if controls.get("rhyme") or controls.get("meter"):
        assert m["rhyme_regulated"] == 1
    if controls.get("meter"):
        assert m["meter"] == 1
    if "acrostic" in controls:
        assert all("".join(line[0] for line in split_lines(p)) == controls["acrostic"] for p in out)
    if "prompt" in controls:
        assert all(p.startswith(controls["prompt"]) for p in out)


def test_keywords_the_same_with_and_without_the_cache_and_on_every_cpu_backend(lit):
    first = poems(lit, 20, keywords=KEYWORDS, form="qijue", rhyme=True, seed=5)
    assert poems(lit, 20, keywords=KEYWORDS, form="qijue", rhyme=True, seed=5, use_cache=False) == first
    attention = [m for m in lit.engine.model.modules() if hasattr(m, "backend")]
    try:
        for m in attention:
            m.backend = "naive"
        naive = poems(lit, 20, keywords=KEYWORDS, form="qijue", rhyme=True, seed=5)
    finally:
        for m in attention:
            m.backend = "sdpa"
    assert all(holds(p, KEYWORDS) for p in naive)
    assert sum(a == b for a, b in zip(naive, first)) >= 18  # float rounding may tip a rare draw


def test_the_model_chooses_the_place_until_the_poem_runs_out_of_room(lit):
    """At the poem's start nothing is masked; with one odd line left for a five-character
    keyword (an even line's last character is the model's rhyme), only its first character may come."""
    tok = lit.engine.tokenizer
    word = frozenset({"白日依山盡"})
    kw = TemplateConstraint(tok, [form_templates("wujue")], "traditional", keywords=[tuple(word)]).kw
    assert kw.placeable(0, 0, word, 1) and kw.placeable(0, 10, word, 1)  # the poem's start, line 3's
    assert not kw.placeable(0, 11, word, 1)  # line 3 less a character: line 4 ends in the rhyme
    row = KeywordRow(word, 1)
    assert kw.mask(0, 5, row, {0}) is None  # line 2's start: room left, the model chooses
    assert kw.mask(0, 10, row, {0}).nonzero().flatten().tolist() == [tok.stoi["白"]]


def test_keywords_leave_the_rhyme_to_the_model_and_take_a_section_each(lit):
    """Without rhyme=true no keyword starts where it would take an even line's last character;
    two keywords in a wulv: the first by the end of line 4, the second by the end of line 8."""
    tok = lit.engine.tokenizer
    kw = TemplateConstraint(tok, [form_templates("wulv")], "traditional", keywords=[tuple(KEYWORDS)]).kw
    row = KeywordRow(frozenset(KEYWORDS), 2)
    assert set(kw.starts(0, 7, row)) == set(KEYWORDS)  # line 2, character 3
    assert kw.starts(0, 8, row) == ()  # 明月 or 故鄉 there would end line 2
    assert set(kw.starts(0, 13, row)) == set(KEYWORDS)  # an odd line may end with one
    mask = kw.mask(0, 17, row, {0})  # line 4, character 3: the last place in section 1
    assert sorted(mask.nonzero().flatten().tolist()) == sorted(tok.stoi[w[0]] for w in KEYWORDS)
    out = poems(lit, 40, keywords=KEYWORDS, form="wulv", seed=2)
    assert all(min(i for i, line in enumerate(split_lines(p)) if any(w in line for w in KEYWORDS)) < 4 for p in out)


def test_a_keyword_the_model_does_not_start_stands_at_a_drawn_slot(lit):
    """Each poem draws a slot for its keyword (a line of its section, the line's head half the
    time, else an even position that leaves the line's last character free), so over 200 qijue
    about half stand at a line's head, every line gets some, and few stand just before the last
    line's rhyme (the room rule alone put nearly all there); the same seed draws the same slots."""
    out = poems(lit, 200, keywords=["明月"], form="qijue", seed=3)
    places = [keyword_places(p, ["明月"])["明月"] for p in out]
    assert 0.35 <= sum(pos == 0 for _, pos, _ in places) / len(places) <= 0.65
    assert sum(pos % 2 == 0 for _, pos, _ in places) / len(places) >= 0.9  # slots, not the model's own starts
    assert all(0.1 <= sum(line == i for line, _, _ in places) / len(places) <= 0.4 for i in range(4))
    assert sum(line == 3 and pos == 4 for line, pos, _ in places) / len(places) <= 0.15
    assert poems(lit, 200, keywords=["明月"], form="qijue", seed=3) == out


@pytest.mark.parametrize("opts, match", [
    ({"keywords": ["明月X"]}, "X"),
    ({"keywords": ["白日依山盡千"], "form": "wujue"}, "has 6 characters, more than a line of wujue holds"),
    ({"keywords": ["白日依山盡黃河入"]}, "more than a line holds"),
    ({"keywords": ["白日依山盡", "黃河入海流", "欲窮千里目", "更上一層樓", "明"], "form": "wujue"},
     "have 21 characters, more than wujue holds"),
    ({"keywords": ["白日依山盡"], "form": "wujue", "acrostic": "春花千月"}, "cannot be placed in wujue with .*the acrostic"),
    ({"keywords": ["春花"], "acrostic": "白花千月白"}, None),  # fits inside a line: accepted
    ({"keywords": ["明月"], "control": "soft"}, None),  # no plan tokens: refused for control=soft anyway
    ({"keywords": ["明月。"]}, "not made of characters of a line"),
])
def test_keywords_that_cannot_be_placed_are_refused_before_sampling(lit, opts, match):
    if match is None:
        if opts.get("control") == "soft":
            with pytest.raises(ValueError, match="control=soft needs a model trained with plan tokens"):
                poems(lit, 1, **opts)
        else:
            assert holds(poems(lit, 3, **opts)[0], opts["keywords"])
        return
    with pytest.raises((ValueError, UnknownCharactersError), match=match):
        poems(lit, 1, **opts)


def test_a_keyword_whose_tones_fit_no_pattern_is_refused_under_meter(lit):
    level = [c for c, t in tones(lit.engine.tokenizer.itos, "traditional").items() if t == {"平"}]
    word = "".join(level[:4])  # four level tones in a row: no line of a 5-character pattern has them
    with pytest.raises(ValueError, match=rf"the keyword {word} \(平平平平\) fits no position of wujue's 平仄"):
        poems(lit, 1, keywords=[word], form="wujue", meter=True)
    assert holds(poems(lit, 2, keywords=[word], form="wujue")[0], [word])  # without meter it fits


def test_keywords_that_fit_alone_but_not_together_are_refused(lit):
    with pytest.raises(ValueError, match="cannot all be placed"):
        poems(lit, 1, keywords=["白日依山", "黃河入海", "欲窮千里", "更上一層", "明月"], form="wujue",
              acrostic="春花千月")


def test_keywords_are_cleaned_and_parsed():
    assert clean_keywords(["明月", " 明月", "", "月", "故鄉，秋風", "秋風"]) == ("明月", "故鄉", "秋風")
    assert keyword_rows("明月,故鄉、秋風", 3) == [("明月", "故鄉", "秋風")]
    assert keyword_rows([["明月"], ["故鄉"]], 2) == [("明月",), ("故鄉",)]
    with pytest.raises(ValueError, match="one list for each of the 3 poems"):
        keyword_rows([["明月"], ["故鄉"]], 3)
    assert quote_non_ascii_overrides(["keywords=明月,故乡"]) == ["keywords='明月,故乡'"]
    assert quote_non_ascii_overrides(["keywords=[明月,,故乡]"]) == ["keywords='明月,,故乡'"]


def test_keywords_per_poem(lit):
    per_row = [["明月"], ["故鄉", "千里"], ["黃河"]]
    out = poems(lit, 3, keywords=per_row, form="wujue")
    assert all(holds(p, ws) for p, ws in zip(out, per_row))


def test_keyword_places_and_placement():
    poem = "床前明月光，疑是地上霜。舉頭望明月，低頭思故鄉。"
    assert keyword_places(poem, ["明月", "故鄉", "江南"]) == {"明月": (0, 2, 5), "故鄉": (3, 3, 5)}
    place = keyword_placement([poem], [["明月", "故鄉"]])
    assert place == {"n": 2, "first_line": 0.5, "last_line": 0.5, "first_half": 0.5, "head": 0.0, "tail": 0.5,
                     "alone": 1.0}


def test_textrank_keywords_of_a_poem():
    assert poem_keywords("白日依山尽，黄河入海流。欲穷千里目，更上一层楼。", 1) == ["黄河"]
    words = poem_keywords("国破山河在，城春草木深。感时花溅泪，恨别鸟惊心。", 2)
    assert len(words) == 2 and all(len(w) >= 2 and w in "国破山河在城春草木深感时花溅泪恨别鸟惊心" for w in words)


def test_evaluation_keyword_sets(lit, tmp_path):
    requests = sample_requests(["keywords"], ["wujue"])
    assert requests == {"keywords": {"keywords": HELD_OUT}, "wujue+keywords": {"form": "wujue", "keywords": HELD_OUT},
                        "wujue+rhyme+keywords": {"form": "wujue", "rhyme": True, "keywords": HELD_OUT},
                        "wujue+meter+keywords": {"form": "wujue", "meter": True, "keywords": HELD_OUT},
                        "wujue+acrostic+keywords": {"form": "wujue", "acrostic": "春夏秋冬", "keywords": HELD_OUT}}
    words, sources = draw_keywords(lit.engine, {"form": "wujue", "meter": True}, POEMS * 3, 4)
    assert len(words) == 4 and all(1 <= len(w) <= 2 for w in words)
    assert all(all(k in POEMS[i % len(POEMS)] for k in w) for w, i in zip(words, sources))
    with pytest.raises(ValueError, match="held-out poems have keywords"):
        draw_keywords(lit.engine, {"form": "wujue"}, POEMS[:1], 4)
    out = poems(lit, 4, keywords=words, form="wujue", meter=True)
    rows = evaluation_rows({"wujue+meter+keywords": out}, POEMS, write_corpus(tmp_path / "c.jsonl.xz"), "traditional",
                           keywords={"wujue+meter+keywords": {"keywords": words, "sources": sources}})
    assert rows["wujue+meter+keywords"]["keywords"] == 1 and rows["human (held-out)"]["keywords"] is None
    assert all(form_of(p) == "wujue" for p in out)


def test_free_poems_of_a_plan_model_hold_their_keywords():
    """A model with plan tokens: each free poem's keywords are placed as in the form its plan
    names while the poem keeps that form (an untrained model soon leaves it), then as free."""
    from data.verse.plan import plan_labels

    torch.manual_seed(0)
    tok = CharTokenizer.from_texts(POEMS, plan_labels())
    model = {"block_size": 96, "n_layer": 1, "n_head": 2, "n_embd": 16}
    plan = LitGPT(model, OPTIM, tok.state_dict(), script="traditional").eval()
    out = poems(plan, 30, keywords=KEYWORDS)
    assert all(holds(p, KEYWORDS) for p in out)


def test_the_refusal_names_the_rules_in_force_only(lit):
    with pytest.raises(ValueError) as err:
        poems(lit, 1, keywords=["白日依山盡", "黃河入海流", "欲窮千里目", "更上一層樓"], form="wujue")
    assert str(err.value) == ("the keywords 白日依山盡、黃河入海流、欲窮千里目、更上一層樓 cannot all be placed in wujue "
                              "with each rhyming line's last character left to the rhyme, "
                              "one keyword to each part of the poem")
    with pytest.raises(ValueError, match="last character left to the rhyme, the 平仄, the acrostic"):
        poems(lit, 1, keywords=["黃河入海流"], form="wujue", meter=True, acrostic="黃白欲更")
    odd = ["白日依山盡", "欲窮千里目"]  # whole lines that do not rhyme: lines 1 and 3, with rhyme=true too
    assert all(holds(p, odd) for p in poems(lit, 2, keywords=odd, form="wujue", rhyme=True))


def test_per_poem_keywords_from_the_command_line_recorded_in_the_models_script(lit, tmp_path):
    """`"keywords=[[明月,故乡],[白日,黄河]]" num_samples=2` on the command line (quoted as sample.py
    quotes its arguments) gives each poem its own keywords, as the same lists from Python do;
    format=jsonl records them as the poems hold them, in the model's script (traditional here)."""
    import io
    import json

    from hydra import compose, initialize_config_dir

    from sample import sample
    from tests.conftest import ROOT

    ckpt = tmp_path / "run" / "last.ckpt"
    ckpt.parent.mkdir()
    torch.save({"hyper_parameters": dict(lit.hparams), "state_dict": lit.state_dict()}, ckpt)
    argv = quote_non_ascii_overrides(["keywords=[[明月,故乡],[白日,黄河]]", "num_samples=2"])
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("sample", overrides=[f"ckpt_path={ckpt}", "format=jsonl", "form=wujue", *argv])
    out = io.StringIO()
    written = sample(cfg, out)
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["keywords"] for r in records] == [["明月", "故鄉"], ["白日", "黃河"]]
    assert all(holds(p, r["keywords"]) for p, r in zip(written, records))
    assert written == sample_poems(lit.engine, SamplingOptions(num_samples=2, form="wujue",
                                                               keywords=[["明月", "故乡"], ["白日", "黄河"]]))
    with pytest.raises(ValueError, match=r"one list for each of the 3 poems, got 2: write keywords=\[\["):
        poems(lit, 3, keywords=[["明月"], ["故鄉"]])

