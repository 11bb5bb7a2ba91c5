"""词 by 词牌 (issue 39), the data: the 全宋词 corpus (cleaning, ids, tune names, the leakage rule
against every corpus), 词林正韵's rhyme classes, and the tune templates against the corpus
shares they claim."""
import json
from collections import Counter
from functools import lru_cache

import pytest

from data.build_corpus import CORPUS_DIR, body_keys, build_ci, ci_id, split_of
from data.build_tunes import DOC, bindings, check, page
from data.corpus_io import load_corpus
from data.verse.ci import clean_ci, parse_shape, rhyme_classes, shape_of, tune_name
from data.verse.rhyme import rhyme_table
from data.verse.tunes import (
    COVERAGE,
    EITHER,
    bind_share,
    derive,
    derive_aliases,
    rhyme_kept,
    tones_kept,
    tune_aliases,
    tunes,
    variant_of,
)

HUANXISHA = "一曲新词酒一杯。去年天气旧亭台。夕阳西下几时回。无可奈何花落去，似曾相识燕归来。小园香径独徘徊。"


@lru_cache(maxsize=None)
def corpus(name: str) -> tuple[dict, ...]:
    return tuple(load_corpus(CORPUS_DIR / f"{name}.jsonl.xz"))


def test_cleaning_drops_lost_and_foreign_characters_and_fragments_and_removes_notes():
    assert clean_ci(["明月几时有（一作「何」），", "把酒问青天。"]) == ("明月几时有，把酒问青天。", "")
    assert clean_ci(["明月□时有，把酒问青天。"]) == (None, "bad-characters")
    assert clean_ci(["明月け时有，把酒问青天。"]) == (None, "bad-characters")  # kana in the source
    assert clean_ci(["六郡酒泉。"]) == (None, "fragment")
    assert clean_ci(["。"]) == (None, "empty")


def test_shapes_cut_lines_at_every_mark_of_a_ci_the_dun_hao_too():
    assert shape_of("问、青天几时有，把酒。") == "1、5，2。"
    assert shape_of(HUANXISHA) == "7。7。7。7，7。7。"
    assert parse_shape("7。7。7。7，7。7。") == [(7, "。")] * 3 + [(7, "，"), (7, "。"), (7, "。")]
    with pytest.raises(ValueError, match="is not a shape"):
        parse_shape("七。")


@pytest.mark.parametrize("heading, tune", [("浣溪沙", "浣溪沙"), ("酹江月・念奴娇", "念奴娇"),
                                           ("木兰花・玉楼春", "玉楼春"), ("失调名", None), ("", None)])
def test_tune_names_are_normalised_to_the_tunes_usual_name(heading, tune):
    assert tune_name(heading) == tune


def test_rhyme_classes_merge_pingshui_groups_into_the_19_bu_and_split_the_half_groups_by_final():
    classes = rhyme_classes("simplified")
    assert (3, "平") in classes["回"] and (5, "平") in classes["来"]  # 十灰 split: uei → 3, ai → 5
    assert classes["魂"] == {(6, "平")} and classes["园"] == {(7, "平")}  # 十三元 split
    assert classes["东"] == {(1, "平")} and (1, "平") in classes["冬"]  # 东 and 冬 rhyme in 词
    assert classes["月"] == {(18, "仄")} and (18, "仄") in classes["雪"]  # 入声 月 and 屑: 部 18
    assert classes["去"] == {(4, "仄")}
    bus = {b for cls in classes.values() for b, _ in cls}
    assert bus == set(range(1, 20))


def test_the_ci_source_gets_the_rules_an_id_from_its_content_and_the_leakage_rule(tmp_path):
    songci = tmp_path / "package" / "dist" / "songci"
    songci.mkdir(parents=True)
    records = [
        {"author": "晏殊", "rhythmic": "浣溪沙", "paragraphs": [HUANXISHA]},
        {"author": "晏殊", "rhythmic": "浣溪沙", "paragraphs": [HUANXISHA]},  # an exact duplicate
        {"author": "某", "rhythmic": "失调名", "paragraphs": ["明月□时有，把酒问青天。"]},  # lost character
        {"author": "苏轼", "rhythmic": "酹江月・念奴娇", "paragraphs": ["大江东去，浪淘尽、千古风流人物。"]},
        {"author": "某", "rhythmic": "失调名", "paragraphs": ["床前明月光，疑是地上霜。"]},  # a Tang body
    ]
    (songci / "ci.song.0.json").write_text(json.dumps(records, ensure_ascii=False))
    (songci / "宋词三百首.json").write_text(json.dumps(records[:1], ensure_ascii=False))  # a selection: not read
    shi = [{"id": "t", "title": "", "author": "", "form": "wujue", "split": "val",
            "text": "床前明月光，疑是地上霜。舉頭望明月，低頭思故鄉。"[:12]}]
    poems, stats = build_ci(tmp_path / "package", shi)
    assert [p["tune"] for p in poems] == ["浣溪沙", "念奴娇"]
    assert poems[1]["heading"] == "酹江月・念奴娇" and poems[1]["title"] == "念奴娇" and poems[1]["shape"] == "4，3、6。"
    assert poems[0]["id"] == ci_id(records[0]) and poems[0]["split"] == split_of(poems[0]["id"])
    assert stats["dropped"] == {"bad-characters": 1, "duplicate": 1, "shi-duplicate": 1}
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no songci"):
        build_ci(tmp_path / "empty", shi)


def test_the_shipped_ci_corpus_matches_its_stats_and_trains_on_no_validation_body_of_any_corpus():
    ci = corpus("ci")
    stats = json.loads((CORPUS_DIR / "ci-stats.json").read_text())
    assert len(ci) == stats["kept"] == 19689
    assert Counter(p["split"] for p in ci) == stats["split"]
    assert all(p["form"] == "ci" and p["shape"] == shape_of(p["text"]) and p["tune"] == tune_name(p["heading"])
               and p["title"] == (p["tune"] or "") for p in ci)
    keys = body_keys([p["text"] for p in ci])
    val = {k for p, k in zip(ci, keys) if p["split"] == "val"}
    assert not any(k in val for p, k in zip(ci, keys) if p["split"] == "train")
    shi = {k for name in ("tang", "song") for k in body_keys([p["text"] for p in corpus(name)])}
    assert not shi & set(keys)  # no 词 body is a Tang or Song poem's, in either split


def test_every_tune_with_100_ci_has_templates_holding_the_shares_they_claim():
    ci, templates = corpus("ci"), tunes()
    counts = Counter(p["tune"] for p in ci if p["tune"])
    assert set(templates) == {t for t, n in counts.items() if n >= 100} and len(templates) == 49
    shapes = Counter((p["tune"], p["shape"]) for p in ci if p["split"] == "train")
    for tune, variants in templates.items():
        assert all(v.count == shapes[tune, v.shape] for v in variants), tune
        train = sum(n for (t, _), n in shapes.items() if t == tune)
        assert sum(v.count for v in variants) >= COVERAGE * train > sum(v.count for v in variants[:-1]), tune
        for v in variants:
            assert [len(t) for t in v.tones] == [n for n, _ in v.lines] == [len(t) for t in v.tones]
            assert len(v.rhymes) == len(v.lines) and {r for r in v.rhymes if r is not None} == set(range(len(v.segments)))
            assert v.rhymes[-1] is not None, (tune, v.shape)  # a 词 ends on a rhyme


def test_known_tunes_get_the_shape_rhymes_and_stanzas_of_the_ci_pu():
    t = tunes()
    huanxisha = t["浣溪沙"][0]
    assert (huanxisha.shape, huanxisha.stanza, huanxisha.rhymes, huanxisha.segments) == (
        "7。7。7。7，7。7。", 3, (0, 0, 0, None, 0, 0), ("平",))
    pusaman = t["菩萨蛮"][0]
    assert pusaman.segments == ("仄", "平", "仄", "平") and pusaman.rhymes == (0, 0, 1, 1, 2, 2, 3, 3)
    assert pusaman.stanza == 4
    assert t["如梦令"][0].stanza is None  # one stanza (单调)
    assert t["水调歌头"][0].stanza == 9 and t["水调歌头"][0].segments == ("平",)
    assert variant_of(HUANXISHA, "浣溪沙") == huanxisha
    # 杯 回 (uei, ei: 部 3) and 台 来 徊 (ai, uai: 部 5): 晏殊 rhymed 灰 whole, the split by final does not
    assert rhyme_kept(HUANXISHA, huanxisha) == (3, 5)
    kept, fixed = tones_kept(HUANXISHA, huanxisha)
    assert fixed == sum(len(line) - line.count(EITHER) for line in huanxisha.tones) and kept / fixed > 0.9


def test_the_templates_are_what_the_derivation_gives_for_those_tunes():
    ci = [p for p in corpus("ci") if p["tune"] in ("浣溪沙", "菩萨蛮", "如梦令", "西江月")]
    derived = derive(ci)
    assert {t: tuple(v) for t, v in derived.items()} == {t: tunes()[t] for t in derived}


def test_the_tunes_other_names_are_what_the_corpus_headings_give():
    aliases = derive_aliases(corpus("ci"), tunes())
    assert aliases == tune_aliases() and aliases["浣溪纱"] == "浣溪沙" and aliases["金缕曲"] == "贺新郎"
    assert not set(aliases) & set(tunes()) and set(aliases.values()) <= set(tunes())


def test_the_tunes_page_is_generated_from_the_shipped_templates():
    templates = tunes()
    poems = list(corpus("ci"))
    assert DOC.read_text(encoding="utf-8") == page(templates, check(poems, templates), bindings(poems, templates))


def test_only_xijiangyue_binds_a_segment_and_most_of_its_poets_do():
    """西江月's 仄 lines rhyme in its 平 rhyme's 部 (叶韵): every rhyme in one 部 in 320 of the 417
    training 词 of its shape; 菩萨蛮, which changes rhyme, binds nothing."""
    bound = {t: [(k, v.bound) for k, v in enumerate(vs) if v.bound] for t, vs in tunes().items()}
    assert {t: b for t, b in bound.items() if b} == {"西江月": [(0, (None, 0))]}
    poems = [p["text"] for p in corpus("ci") if p["tune"] == "西江月" and p["split"] == "train"
             and p["shape"] == tunes()["西江月"][0].shape]
    assert bind_share(poems, tunes()["西江月"][0], 0, 1) == (320, 417)
    pusaman = tunes()["菩萨蛮"][0]
    texts = [p["text"] for p in corpus("ci") if p["tune"] == "菩萨蛮" and p["shape"] == pusaman.shape][:200]
    assert bind_share(texts, pusaman, 0, 1)[0] < 20


def test_every_pingshui_group_has_a_bu():
    from data.verse.ci import cilin_table

    assert set(cilin_table()) == set(rhyme_table())


def test_a_tang_and_ci_data_module_plans_each_ci_by_its_tune_and_refuses_traditional_script(tmp_path):
    import lzma

    from data.datamodule import PoetryDataModule
    from data.verse.plan import plan_ids
    from tests.conftest import write_corpus

    tang = write_corpus(tmp_path / "corpus" / "tang.jsonl.xz")
    ci = tmp_path / "corpus" / "ci.jsonl.xz"
    with lzma.open(ci, "wt", encoding="utf-8") as f:
        for c in range(10):  # ci-0 and ci-5 are validation 词; ci-5's tune has no token (too rare)
            tune = "无名调" if c == 5 else "浣溪沙"
            f.write(json.dumps({"id": f"ci-{c}", "title": tune, "heading": tune, "author": "晏殊", "form": "ci",
                                "tune": tune, "shape": shape_of(HUANXISHA), "split": "val" if c % 5 == 0 else "train",
                                "text": HUANXISHA}, ensure_ascii=False) + "\n")
    dm = PoetryDataModule(str(tang), str(tmp_path / "cache"), block_size=64, train_corpora=[str(tang), str(ci)],
                          also_validate={"ci": str(ci)}, plan_tokens=True)
    assert dm.meta["val_ci"]["poems"] == 2 and set(HUANXISHA) <= set(dm.tokenizer.stoi)
    ids = plan_ids(dm.tokenizer)
    assert len(ids.tunes) == len(tunes()) and ids.read([0, ids.tunes["浣溪沙"][0]]) == \
        {"form": "ci", "rhyme": None, "tune": "浣溪沙", "template": 1}
    val = [int(i) for i in dm.tokens("val_ci")]
    firsts = [val[k + 1] for k, i in enumerate(val) if i == 0]  # after each <bos>: the form slot
    assert firsts == [ids.tunes["浣溪沙"][0], ids.forms["other"]]
    tang_only = PoetryDataModule(str(tang), str(tmp_path / "cache"), block_size=64, plan_tokens=True)
    assert plan_ids(tang_only.tokenizer).tunes == {} and tang_only.cache_dir != dm.cache_dir
    with pytest.raises(ValueError, match="ci.jsonl.xz .* simplified script only .* data.script=simplified"):
        PoetryDataModule(str(tang), str(tmp_path / "cache"), script="traditional", train_corpora=[str(tang), str(ci)])


def test_a_tune_has_a_token_per_common_template_and_a_ci_plans_the_one_it_has():
    """A template other than a tune's commonest gets a token with ≥ MIN_VARIANT training 词; a 词
    plans the token of the template it has (whole), or whose lines it begins (a start), else <其他>;
    the structure inputs read that template."""
    from data.features import tune_tables
    from data.tokenizer import CharTokenizer
    from data.verse.plan import MIN_VARIANT, plan_ids, plan_labels, poem_plan, tune_label, tune_tokens, tune_variant

    shui = tunes()["水调歌头"]
    assert [k for t, k in tune_tokens() if t == "水调歌头"] == [k for k, v in enumerate(shui) if k == 0 or
                                                            v.count >= MIN_VARIANT] == [0, 1, 2, 3]
    assert tune_label("水调歌头", 1) == "<水调歌头·2>" and "<水调歌头·5>" not in plan_labels(tunes=True)
    second = "".join("字" * n + m for n, m in shui[1].lines)  # a 词 of the second template's shape
    assert tune_variant(second, "水调歌头") == 1 and poem_plan(second, "ci", "simplified", "水调歌头")[0] == "<水调歌头·2>"
    assert tune_variant("明月几时有，把酒问青天。", "水调歌头", complete=False) == 0
    assert tune_variant("明月几时有，把酒问青天。", "水调歌头") is None  # not a whole 词 of any template
    assert poem_plan(second[:-3] + "。", "ci", "simplified", "水调歌头")[0] == "<其他>"
    tok = CharTokenizer.from_texts([second], plan=plan_labels(tunes=True))
    ids = plan_ids(tok)
    lengths, rhymes, marks = tune_tables(tok)
    for i, k in zip(ids.tunes["水调歌头"], (0, 1, 2, 3)):
        assert ids.templates[i] == ("水调歌头", k) and ids.tune_of[i] == "水调歌头"
        assert lengths[i][:len(shui[k].lines)] == [n for n, _ in shui[k].lines]
        assert rhymes[i][:len(shui[k].lines)] == [r is not None for r in shui[k].rhymes]
        assert marks[i][:len(shui[k].lines) + 1] == [" ，。、".index(m) for _, m in shui[k].lines] + [0]
    assert ids.read([0, ids.tunes["水调歌头"][1]]) == {"form": "ci", "rhyme": None, "tune": "水调歌头", "template": 2}
    assert ids.read([0, ids.forms["wujue"]]) == {"form": "wujue", "rhyme": None, "tune": None, "template": None}


def test_a_ci_plans_the_cilin_class_it_rhymes_in_first():
    """A 词 with a template token plans the 词林正韵 class its first rhyme segment shares (晏殊's 浣溪沙:
    杯 台 回 来 徊, 第三部平); the start of one, its first rhyme's; no shared class: <无韵>; a 诗 keeps
    a 词 without a tune the 诗's rule."""
    from data.tokenizer import CharTokenizer
    from data.verse.plan import ci_rhyme_classes, ci_rhyme_label, plan_ids, plan_labels, poem_plan

    assert len(ci_rhyme_classes()) == 33 and ci_rhyme_label((7, "平")) == "<7部平>"
    assert poem_plan(HUANXISHA, "ci", "simplified", "浣溪沙") == ("<浣溪沙>", "<3部平>")
    assert poem_plan("明月几时有，把酒问青天。", "ci", "simplified", "水调歌头", complete=False) == \
        ("<水调歌头>", "<7部平>")  # 天
    unrhymed = "".join(line[:-2] + "一" + line[-1] for line in (HUANXISHA[i:i + 8] for i in range(0, 48, 8)))
    assert poem_plan(unrhymed, "ci", "simplified", "浣溪沙") == ("<浣溪沙>", "<无韵>")
    assert poem_plan(HUANXISHA, "ci", "simplified") == ("<其他>", "<无韵>")  # no tune: the 诗's rule (去 is 仄)
    tok = CharTokenizer.from_texts([HUANXISHA], plan=plan_labels(tunes=True))
    ids = plan_ids(tok)
    assert ids.read([0, ids.tunes["浣溪沙"][0], ids.ci_rhymes[(3, "平")]]) == \
        {"form": "ci", "rhyme": "3部平", "tune": "浣溪沙", "template": 1}


def test_closed_lines_reads_the_start_of_a_ci():
    from data.verse.ci import closed_lines

    assert closed_lines("明月几时有，把酒") == ([(5, "，")], 2)
    assert closed_lines("明月几时有，把酒问青天。") == ([(5, "，"), (5, "。")], 0)
    assert closed_lines("") == ([], 0)
