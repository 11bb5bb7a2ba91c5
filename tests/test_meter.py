"""近体诗 rules (data/verse/meter.py): tones from the 平水韵 table, the standard patterns, 黏, 对."""
import pytest

from data.verse.meter import (
    LEVEL,
    OBLIQUE,
    alternates,
    free_positions,
    line_pattern,
    matching_patterns,
    opposed,
    patterns,
    poem_lines,
    shared_rhyme_groups,
    sticks,
    tones,
)

P, Z, PZ = frozenset({LEVEL}), frozenset({OBLIQUE}), frozenset({LEVEL, OBLIQUE})

JINGYESI = "床前明月光，疑是地上霜。举头望明月，低头思故乡。"  # 李白《静夜思》: a 古绝, not regulated
DENG_GUANQUE_LOU = "白日依山尽，黄河入海流。欲穷千里目，更上一层楼。"  # 王之涣《登鹳雀楼》
CHUNWANG = ("国破山河在，城春草木深。感时花溅泪，恨别鸟惊心。"
            "烽火连三月，家书抵万金。白头搔更短，浑欲不胜簪。")  # 杜甫《春望》
TRADITIONAL = {  # the corpus's glyphs (a simplified text alone cannot say 万 → 萬, 胜 → 勝)
    JINGYESI: "牀前明月光，疑是地上霜。舉頭望明月，低頭思故鄉。",
    DENG_GUANQUE_LOU: "白日依山盡，黃河入海流。欲窮千里目，更上一層樓。",
    CHUNWANG: "國破山河在，城春草木深。感時花濺淚，恨別鳥驚心。烽火連三月，家書抵萬金。白頭搔更短，渾欲不勝簪。",
}
STRICT = "白日依山尽，黄河入海流。春城花草木，白日月山楼。"  # made to fit 仄起首句不入韵 at every character


def test_tones_from_the_table_in_both_scripts():
    t = tones("床月看思乡鄉疎", "simplified")
    assert t["床"] == P and t["月"] == Z  # level only, entering tone
    assert t["看"] == t["思"] == PZ  # polyphonic: either
    assert t["乡"] == PZ  # 鄉 (t2s → 乡) is in 七陽 and, read 向, in 去聲
    assert t["疎"] == frozenset()  # a variant glyph the table lacks
    trad = tones("牀爲鄉月", "traditional")  # the corpus's glyphs; the table has 床, 為
    assert trad["牀"] == P and LEVEL in trad["爲"] and trad["月"] == Z


@pytest.mark.parametrize("form, name, lines", [  # the textbook patterns (王力《诗词格律》)
    ("wujue", "仄起首句不入韵", "仄仄平平仄 平平仄仄平 平平平仄仄 仄仄仄平平"),
    ("wujue", "仄起首句入韵", "仄仄仄平平 平平仄仄平 平平平仄仄 仄仄仄平平"),
    ("wujue", "平起首句不入韵", "平平平仄仄 仄仄仄平平 仄仄平平仄 平平仄仄平"),
    ("wujue", "平起首句入韵", "平平仄仄平 仄仄仄平平 仄仄平平仄 平平仄仄平"),
    ("qijue", "仄起首句入韵", "仄仄平平仄仄平 平平仄仄仄平平 平平仄仄平平仄 仄仄平平仄仄平"),
    ("qijue", "平起首句不入韵", "平平仄仄平平仄 仄仄平平仄仄平 仄仄平平平仄仄 平平仄仄仄平平"),
    ("wulv", "仄起首句不入韵", "仄仄平平仄 平平仄仄平 平平平仄仄 仄仄仄平平 仄仄平平仄 平平仄仄平 平平平仄仄 仄仄仄平平"),
    ("qilv", "平起首句入韵", "平平仄仄仄平平 仄仄平平仄仄平 仄仄平平平仄仄 平平仄仄仄平平 "
                            "平平仄仄平平仄 仄仄平平仄仄平 仄仄平平平仄仄 平平仄仄仄平平"),
])
def test_patterns_are_the_textbook_ones(form, name, lines):
    assert patterns(form)[name] == tuple(lines.split())
    assert len(patterns(form)) == 4


def test_patterns_keep_nian_dui_and_rhyme():
    for form in ("wujue", "qijue", "wulv", "qilv"):
        for lines in patterns(form).values():
            assert all(line[-1] == LEVEL for line in lines[1::2])  # even lines rhyme: level
            assert all(line[-1] == OBLIQUE for line in lines[2::2])  # later odd lines: oblique
            assert all(a[1] != b[1] for a, b in zip(lines[0::2], lines[1::2]))  # 对
            assert all(a[1] == b[1] for a, b in zip(lines[1::2], lines[2::2]))  # 黏
            assert all(line[1] != line[3] for line in lines)  # 二四 alternate


def test_line_pattern_errors_and_free_positions():
    assert line_pattern(7, OBLIQUE, LEVEL) == "仄仄平平仄仄平"
    with pytest.raises(ValueError, match="5 or 7"):
        line_pattern(6, LEVEL, LEVEL)
    with pytest.raises(ValueError, match="unknown form"):
        patterns("sonnet")
    assert free_positions(5, True) == {0, 2} and free_positions(7, True) == {0, 2, 4}
    assert free_positions(7, False) == frozenset()


def test_a_made_poem_fits_one_pattern_strictly():
    lines = poem_lines(STRICT)
    assert matching_patterns(lines, "wujue", "simplified") == ["仄起首句不入韵"]
    broken = poem_lines(STRICT.replace("春城", "草城"))  # 1st character of line 3 oblique: only relaxed fits
    assert matching_patterns(broken, "wujue", "simplified") == []
    assert matching_patterns(broken, "wujue", "simplified", relaxed=True) == ["仄起首句不入韵"]
    assert matching_patterns(lines, "qijue", "simplified") == []  # not the form's shape


def test_jingyesi_is_not_regulated_verse():
    lines = poem_lines(JINGYESI)
    s = "simplified"
    assert [alternates(line, s) for line in lines] == [True, False, False, True]  # 是/上 both oblique
    assert [opposed(a, b, s) for a, b in zip(lines[0::2], lines[1::2])] == [False, False]
    assert not sticks(lines[1], lines[2], s)  # 是 oblique, 头 level
    assert matching_patterns(lines, "wujue", s, relaxed=True) == []
    assert shared_rhyme_groups(["霜", "乡"], s) == {"下平聲七陽"}


@pytest.mark.parametrize("poem, form, rhyme_group", [
    (DENG_GUANQUE_LOU, "wujue", "下平聲十一尤"),
    (CHUNWANG, "wulv", "下平聲十二侵"),
], ids=["deng_guanque_lou", "chunwang"])
@pytest.mark.parametrize("script", ["simplified", "traditional"])
def test_famous_regulated_poems(poem, form, rhyme_group, script):
    """Both keep 二四六, 黏 and 对 and rhyme, and fit 仄起首句不入韵 with 一三五不论 — but not at
    every character (欲 in 登鹳雀楼, 感, 烽, 白 in 春望 take the other tone)."""
    lines = poem_lines(TRADITIONAL[poem] if script == "traditional" else poem)
    assert all(alternates(line, script) for line in lines)
    assert all(opposed(a, b, script) for a, b in zip(lines[0::2], lines[1::2]))
    assert all(sticks(a, b, script) for a, b in zip(lines[1::2], lines[2::2]))
    assert matching_patterns(lines, form, script) == []
    assert matching_patterns(lines, form, script, relaxed=True) == ["仄起首句不入韵"]
    assert shared_rhyme_groups([line[-1] for line in lines[1::2]], script) == {rhyme_group}


def test_polyphonic_and_unknown_characters():
    s = "simplified"
    assert alternates("看花", s) and alternates("花看", s)  # one even position: trivially alternates
    assert alternates("春看秋月", s) and alternates("春花秋看", s)  # 看 takes the tone needed
    assert not alternates("春疎秋月", s)  # 疎 is not in the table: fits no tone
    assert opposed("白看", "黄看", s) and sticks("白看", "黄看", s)  # 看 opposite of, or equal to, itself
    assert not opposed("白日", "黄月", s) and sticks("白日", "黄月", s)
    assert shared_rhyme_groups(["霜", "月"], s) == frozenset()  # 月 has no level tone
    assert shared_rhyme_groups([], s) == frozenset()
