import pytest

from data.verse.poetry import bad_characters, clean_poem, form_of, line_length, split_lines, strip_notes


@pytest.mark.parametrize("raw, clean", [
    ("邏人（一作「叉」）橫鳥道", "邏人橫鳥道"),
    ("[爽]節", "爽節"),
    ("鐘聲[杳杳]隔前林", "鐘聲杳杳隔前林"),
    ("風流變動一園（一作「國」）春（外（內）注）。", "風流變動一園春。"),
    ("床前明月光，", "床前明月光，"),
])
def test_strip_notes(raw, clean):
    assert strip_notes(raw) == clean


@pytest.mark.parametrize("text, bad", [
    ("侯門處處槐花□，", {"□"}),
    ("{𥫗/戢}子", {"{", "}", "/"}),
    ("〖注〗", {"〖", "〗"}),
    ("卷四一四", set()),
    ("第3首", {"3"}),
    ("abc字", {"a", "b", "c"}),
    ("私\ue000用", {"\ue000"}),
    ("「凰」《集》", {"「", "」", "《", "》"}),
    ("⿰木木●", {"⿰", "●"}),
    ("床前明月光，疑是地上霜。", set()),
])
def test_bad_characters(text, bad):
    assert bad_characters(text) == bad


def test_split_lines_keeps_marks_and_trailing_piece():
    assert split_lines("床前明月光，疑是地上霜。") == ["床前明月光，", "疑是地上霜。"]
    assert split_lines("何處？ 春來！未完") == ["何處？", "春來！", "未完"]
    assert line_length("疑是地上霜。") == 5


@pytest.mark.parametrize("text, form", [
    ("床前明月光，疑是地上霜。舉頭望明月，低頭思故鄉。", "wujue"),
    ("朝辭白帝彩雲間，千里江陵一日還。兩岸猿聲啼不住，輕舟已過萬重山。", "qijue"),
    ("一二三四五，" * 4 + "一二三四五。" * 4, "wulv"),
    ("一二三四五六七，" * 8, "qilv"),
    ("一二三四五，一二三四五六七。一二三四五，一二三四五。", "other"),  # mixed lengths
    ("一二三四五，一二三四五。一二三四五，一二三四五", "other"),  # last line unfinished
    ("一二三四五，" * 6, "other"),  # six lines
])
def test_form_of(text, form):
    assert form_of(text) == form


def test_clean_poem_reasons():
    assert clean_poem(["床前明月光，疑是地上霜。"]) == ("床前明月光，疑是地上霜。", "")
    assert clean_poem(["邏人（一作「叉」）橫鳥道，[爽]節。"]) == ("邏人橫鳥道，爽節。", "")
    assert clean_poem([]) == (None, "empty")
    assert clean_poem(["。"]) == (None, "empty")
    assert clean_poem(["□□□滿山，花落。"]) == (None, "bad-characters")
    assert clean_poem(["獨句無對。"]) == (None, "fragment")
