"""平水韵 groups come from a character's own readings, in both scripts."""
import csv

import pytest
import torch

from data.tokenizer import CharTokenizer
from data.verse.rhyme import (
    MERGE_FIELDS,
    MERGES_PATH,
    is_level_tone,
    level_tone_table,
    merged_cases,
    readings,
    rhyme_groups,
    rhyme_table,
    script_chars,
    written_as,
)
from data.verse.script import SCRIPTS, corpus_to_script
from model.sampling.poems import SamplingOptions, sample_poems
from model.training.lit import LitGPT
from tests.conftest import POEMS


def test_table_has_level_and_oblique_groups():
    table = rhyme_table()
    assert len(table) == 106 and len(level_tone_table()) == 30
    assert "先" in table["下平聲一先"] and "暗" in table["去聲二十八勘"] and "闇" in table["下平聲十三覃"]
    assert is_level_tone("上平聲一東") and not is_level_tone("入聲一屋")


def test_a_merged_character_keeps_its_own_readings():
    assert script_chars("鄉", "下平聲七陽", "simplified") == {"鄉", "乡"}  # a plain change of glyph
    assert script_chars("闇", "下平聲十三覃", "simplified") == {"闇"}  # 暗 is 去聲 on its own
    assert script_chars("聽", "下平聲九青", "simplified") == {"聽", "听"}  # 听 is mostly 聽 in the corpus
    assert script_chars("為", "上平聲四支", "traditional") == {"為", "爲"}
    simplified = rhyme_groups("暗听乡", "simplified")
    assert "暗" not in simplified and "下平聲九青" in simplified["听"] and simplified["乡"] == {"下平聲七陽"}
    assert rhyme_groups("暗闇", "traditional") == {"闇": {"下平聲十三覃"}}
    assert readings("simplified")["种"] == {"上平聲一東", "上聲二腫", "去聲二宋"}  # 種's oblique tones reach 种
    with pytest.raises(ValueError, match="unknown script"):
        script_chars("鄉", "下平聲七陽", "klingon")


@pytest.mark.parametrize("script", SCRIPTS)
def test_rhyme_refuses_an_oblique_character_that_only_a_merge_made_level(script):
    texts = corpus_to_script(POEMS + ["暗"], script)
    torch.manual_seed(0)
    lit = LitGPT({"block_size": 64, "n_layer": 1, "n_head": 2, "n_embd": 16}, {},
                 CharTokenizer.from_texts(texts).state_dict(), script=script).eval()
    opts = dict(form="wujue", rhyme=True, num_samples=1)
    with pytest.raises(ValueError, match="level-tone rhyme"):  # was accepted through 闇 (下平聲十三覃)
        sample_poems(lit.engine, SamplingOptions(prompt="白日依山尽，黄河入海暗。", **opts))
    [poem] = sample_poems(lit.engine, SamplingOptions(prompt="白日依山尽，黄河入海流。", **opts))
    assert poem.startswith(corpus_to_script(["白日依山盡，黃河入海流。"], script)[0])


def test_every_merged_case_is_listed_with_its_decision(corpus_texts):
    """rhyme_merges.tsv is what the table, OpenCC and the corpus give (`python -m data.build_merges`)."""
    with MERGES_PATH.open(encoding="utf-8", newline="") as f:
        listed = list(csv.DictReader(f, delimiter="\t"))
    expected = [{k: str(v) for k, v in row.items()} for script in SCRIPTS
                for row in merged_cases(script, written_as(corpus_texts, script))]
    assert listed == expected
    assert list(listed[0]) == list(MERGE_FIELDS) and len(listed) == 300
    decisions = {(r["script"], r["char"], r["table_char"], r["group"]): r["decision"] for r in listed}
    assert decisions["simplified", "暗", "闇", "下平聲十三覃"] == "drop"
    assert decisions["simplified", "听", "聽", "下平聲九青"] == "keep"
    assert sum(d == "drop" for d in decisions.values()) == 33
