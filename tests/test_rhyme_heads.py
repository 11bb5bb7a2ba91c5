"""The "rhyme head" verdict (model/inspection/rhyme_heads.py) and the random head sets it is
measured against (model/inspection/head_effects.py): controls, free poems, the interval."""
import math

import pytest
import torch

from data.tokenizer import CharTokenizer
from model.engine import Engine
from model.gpt import GPT, GPTConfig
from model.inspection.head_effects import HeadScorer, control, random_sets
from model.inspection.rhyme_heads import (
    difference_interval,
    format_study,
    free_poems,
    looking_heads,
    rhyme_study,
    verdict,
)
from tests.conftest import POEMS, write_corpus


def engine(silent=()):
    """A random 2-layer, 4-head model over POEMS' characters; heads in `silent` write nothing."""
    tok = CharTokenizer.from_texts(POEMS)
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=40, n_layer=2, n_head=4, n_embd=32)).eval()
    with torch.no_grad():
        for p in gpt.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
        for layer, head in silent:
            gpt.blocks[layer].attn.c_proj.weight[:, 8 * head: 8 * head + 8] = 0
    return Engine(gpt, tok, "traditional")


def test_the_interval_of_a_change_in_rhyme():
    low, high = difference_interval(240, 300, 240, 300)  # no change: symmetric about 0
    p = 241 / 302
    assert high == pytest.approx(1.959964 * math.sqrt(2 * p * (1 - p) / 302)) and low == pytest.approx(-high)
    assert high == pytest.approx(0.0640, abs=1e-4)
    low, high = difference_interval(180, 300, 240, 300)  # 60 % against 80 %
    assert -0.2 == pytest.approx((low + high) / 2, abs=0.002) and high < 0


def test_random_sets_are_seeded_distinct_heads():
    a = random_sets(2, 4, 3, [0, 1], 5)
    assert a == random_sets(2, 4, 3, [0, 1], 5) and len(a) == 10
    assert all(len(set(s)) == 3 and s == sorted(s) for s in a)
    assert {h for s in a for h in s} <= {f"L{ly}H{h}" for ly in range(2) for h in range(4)}
    assert a[:5] != a[5:]  # another seed, other sets
    with pytest.raises(ValueError, match="1 to 8 heads, not 9"):
        random_sets(2, 4, 9, [0], 1)


def test_the_control_bar_is_the_95th_percentile_of_random_sets():
    e = engine(silent=[(0, h) for h in range(4)] + [(1, 0), (1, 1), (1, 2)])  # only L1H3 writes
    scorer = HeadScorer(e, POEMS, batch_size=4)
    c = control(scorer, 1, range(5), 4)
    assert len(c["sets"]) == 20 and len(c["rhyme_slot"]) == 20
    drawn = [s == ["L1H3"] for s in c["sets"]]
    assert all((v != 0) == d for v, d in zip(c["all"], drawn))  # only the head that writes moves the nats
    assert c["p95"]["all"] == pytest.approx(torch.quantile(torch.tensor(c["all"], dtype=torch.float64), 0.95).item())
    assert scorer.delta(["L0H1", "L0H2"]) == {k: 0 for k in scorer.delta([])}


def test_a_head_is_a_rhyme_head_only_when_both_measures_say_so():
    cost = {"change": -12.0, "interval": [-18.0, -6.0]}
    noise = {"change": -2.0, "interval": [-8.0, 4.0]}
    assert verdict(["L3H1"], "previous-rhyme head", 0.30, 0.10, cost)["label"] == "rhyme head"
    v = verdict(["L3H1"], "previous-rhyme head", 0.30, 0.10, noise)
    assert (v["nats_needed"], v["free_needed"], v["rhyme_head"]) == (True, False, False)
    assert v["label"] == ("previous-rhyme head: looks at the previous rhyme; not a rhyme head: its rhyme-slot cost is "
                          "above random heads', but without it the free rhyme moves within the sampling noise")
    both = verdict(["L1H1", "L3H1"], "", 0.01, 0.10, cost)["label"]
    assert both == ("they look at the previous rhyme; not a rhyme head: the free rhyme drops without them together, "
                    "but their rhyme-slot cost is within random heads'")
    assert verdict(["L1H1", "L3H1"], "", 0.3, 0.10, cost)["label"] == "rhyme heads together"
    neither = verdict(["L3H1"], "previous-rhyme head", 0.05, 0.10, noise)["label"]
    assert neither == "previous-rhyme head: looks at the previous rhyme; the rhyme does not need it"
    other = verdict(["L1H3"], "punctuation head", 0.05, 0.10, noise)["label"]
    assert other == "punctuation head: also looks at the previous rhyme; the rhyme does not need it"
    assert "free rhyme -2.0 points (95 % interval -8.0 to +4.0)" in v["measured"]
    assert not verdict(["L3H1"], "previous-rhyme head", 0.05, 0.10, cost)["rhyme_head"]
    assert not verdict(["L3H1"], "previous-rhyme head", 0.30, 0.10, None)["rhyme_head"]  # no free poems: no verdict


def test_free_poems_pool_the_seeds_and_turn_every_head_on_again(tmp_path):
    corpus = write_corpus(tmp_path / "tang.jsonl.xz")
    e = engine()
    idx = e.encode_line(POEMS[0])[0]
    before = e.model(idx)
    rows = free_poems(e, {"intact": [], "L0H0": ["L0H0"]}, [1, 2], 3, corpus)
    assert rows["intact"]["n"] == 6 and rows["L0H0"]["heads"] == ["L0H0"]
    assert rows["intact"]["change"] == 0 and rows["intact"]["interval"][0] < 0 < rows["intact"]["interval"][1]
    assert torch.equal(e.model(idx), before) and e.ablated == []


def test_the_study_names_its_sets_controls_and_verdicts(tmp_path):
    corpus = write_corpus(tmp_path / "tang.jsonl.xz")
    e = engine()
    rows = [{"layer": ly, "head": h, "pattern": "previous-rhyme head" if (ly, h) in ((0, 1), (1, 2)) else "focused",
             "flags": {"prev_line_rhyme": "high"} if (ly, h) in ((0, 1), (1, 2)) else {}}
            for ly in range(2) for h in range(4)]
    assert looking_heads(rows) == ["L0H1", "L1H2"]
    study = rhyme_study(e, HeadScorer(e, POEMS, 4), rows, range(5), 2, [1, 2], 2, corpus)
    assert list(study["sets"]) == ["looking heads together", "layer 0", "layer 1"]
    assert study["sets"]["layer 1"]["heads"] == ["L1H0", "L1H1", "L1H2", "L1H3"]
    assert sorted(study["controls"]) == ["1", "2", "4"] and len(study["controls"]["2"]["sets"]) == 10
    assert list(study["free"]) == ["intact", "L0H1", "L1H2", "looking heads together", "layer 0", "layer 1",
                                   "random set 1", "random set 2"]
    assert [v["heads"] for v in study["verdicts"]] == [["L0H1"], ["L1H2"], ["L0H1", "L1H2"]]
    text = format_study(study, ["all", "rhyme_slot"])
    assert "random sets of 2: 95th pct" in text and "(2 sets for each of seeds 0–4)" in text and "verdicts:" in text
    assert text.count("look at the previous rhyme") + text.count("looks at the previous rhyme") == 3
