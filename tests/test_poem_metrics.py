"""The evaluation metrics on hand-made poems and famous ones, with the answers worked out by hand."""
import pytest

from model.inspection.poem_metrics import METRICS, distinct_n, format_table, poem_metrics, training_lines
from tests.conftest import write_corpus
from tests.test_meter import CHUNWANG, DENG_GUANQUE_LOU, JINGYESI, STRICT

S = "simplified"


def test_famous_poems():
    """静夜思 (古绝), 登鹳雀楼 (五绝), 春望 (五律) and one irregular poem, counted by hand."""
    other = "床前明月光，疑是地上霜。举头望明月。"  # three lines: not regulated
    m = poem_metrics([JINGYESI, DENG_GUANQUE_LOU, CHUNWANG, other], S, frozenset({"床前明月光", "更上一层楼"}))
    assert m["n"] == 4 and m["regulated"] == 3 / 4
    assert (m["wujue"], m["wulv"], m["qijue"], m["qilv"], m["other"]) == (2 / 4, 1 / 4, 0, 0, 1 / 4)
    assert m["level_finals"] == 1 and m["rhyme"] == 1 and m["rhyme_regulated"] == 1  # 霜乡, 流楼, 深心金簪
    assert m["alternation"] == (2 + 4 + 8) / 16  # 静夜思's 2nd and 3rd lines do not alternate
    assert m["nian"] == (0 + 1 + 3) / 5 and m["dui"] == (0 + 2 + 4) / 8
    assert m["meter"] == 0 and m["meter_relaxed"] == 2 / 3
    assert m["copy"] == 3 / (4 + 4 + 8 + 3)  # 床前明月光 twice, 更上一层楼 once


def test_hand_made_poems_with_known_answers():
    no_rhyme = STRICT.replace("山楼", "山霜")  # 霜 (七陽) does not rhyme with 流 (十一尤); still level
    oblique = STRICT.replace("山楼", "山月")  # 月: an oblique final
    no_nian = STRICT.replace("春城花草木", "春草花城木")  # line 3's 2nd, 草, oblique: 河 above is level, 日 below oblique
    m = poem_metrics([STRICT, no_rhyme, oblique], S, frozenset())
    assert m["regulated"] == 1 and m["wujue"] == 1
    assert m["level_finals"] == 2 / 3 and m["rhyme"] == 1 / 2 and m["rhyme_regulated"] == 1 / 3
    assert m["meter"] == 2 / 3  # the oblique final breaks the pattern; a level one that does not rhyme does not
    assert m["alternation"] == 1 and m["dui"] == 1 and m["nian"] == 1
    m = poem_metrics([no_nian], S, frozenset())
    assert m["nian"] == 0 and m["alternation"] == 1 and m["dui"] == 1 / 2 and m["meter"] == 0
    empty = poem_metrics([], S, frozenset())
    assert empty["n"] == 0 and all(empty[k] is None for k in METRICS if k != "n")


def test_irregular_poems_leave_the_tone_figures_undefined():
    m = poem_metrics(["床前明月光，疑是地上霜。举头望明月。"], S, frozenset())
    assert m["regulated"] == 0 and m["other"] == 1
    assert m["rhyme"] is None and m["alternation"] is None and m["meter"] is None
    assert m["copy"] == 0 and m["distinct_1"] == 13 / 15  # 明 and 月 twice


def test_distinct_n_on_equal_counts():
    assert distinct_n(["白日白日。"], 1) == 2 / 4 and distinct_n(["白日白日。"], 2) == 2 / 3  # 白日, 日白
    assert distinct_n(["白日，", "白日。"], 2) == 1 / 2  # n-grams stay within a poem
    assert distinct_n([], 2) is None
    m = poem_metrics(["白日。", "黄河。", "白日。"], S, frozenset(), n_distinct=2)
    assert m["distinct_1"] == 1 and m["n"] == 3  # only the first two poems count


def test_training_lines_come_from_the_training_split(tmp_path):
    corpus = write_corpus(tmp_path / "tang.jsonl.xz", ["白日依山盡，黃河入海流。", "床前明月光，疑是地上霜。"], copies=1)
    lines = training_lines(corpus, S)  # write_corpus holds out every fifth copy: copy 0 is held out
    assert lines == frozenset()
    corpus = write_corpus(tmp_path / "two.jsonl.xz", ["白日依山盡，黃河入海流。"], copies=2)
    assert training_lines(corpus, S) == {"白日依山尽", "黄河入海流"}  # copy 1 trains; simplified


def test_format_table():
    rows = {"human": poem_metrics([DENG_GUANQUE_LOU], S, frozenset()), "none": poem_metrics([], S, frozenset())}
    lines = format_table(rows).splitlines()
    assert len(lines) == 3 and lines[0].split()[:3] == ["n", "reg", "wujue"]
    assert lines[1].split()[:3] == ["human", "1", "100.0%"] and lines[1].split()[-1] == "1.000"  # no bigram twice
    assert lines[2].split()[1:4] == ["0", "–", "–"]


@pytest.mark.parametrize("script", ["simplified", "traditional"])
def test_scripts_give_the_same_figures(script):
    from tests.test_meter import TRADITIONAL

    poems = [TRADITIONAL[p] if script == "traditional" else p for p in (JINGYESI, DENG_GUANQUE_LOU, CHUNWANG)]
    m = poem_metrics(poems, script, frozenset())
    assert (m["rhyme"], m["alternation"], m["nian"], m["dui"], m["meter_relaxed"]) == (1, 14 / 16, 4 / 5, 6 / 8, 2 / 3)
