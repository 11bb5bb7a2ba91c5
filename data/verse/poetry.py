"""What "a poem" means here: line splitting, form tags and the corpus cleaning rules.

Shared by `data/build_corpus.py` (cleaning), the data module and the sampler, so each
rule is written once. All functions work on either script (traditional or simplified).
"""
from __future__ import annotations

import re
import unicodedata
from typing import Iterable

LINE_END = "，。？！；"
"""A line (句) ends at one of these full-width marks."""

FORMS = {"wujue": (4, 5), "qijue": (4, 7), "wulv": (8, 5), "qilv": (8, 7)}
"""form name → (number of lines, characters per line): 五言绝句, 七言绝句, 五言律诗, 七言律诗: the
corpus's forms (`form_of`), each with its plan token (`data.verse.plan.FORM_LABELS`)."""
VERSE_FORMS = {**FORMS, "wupai": (12, 5), "qipai": (12, 7)}
"""Every regulated form the sampler writes (`data.verse.templates.form_templates`): `FORMS` and the
排律 of twelve lines (五言六韵, 七言六韵), which the corpus counts as `other`."""
FORM_TITLES = {"wujue": "五言绝句", "qijue": "七言绝句", "wulv": "五言律诗", "qilv": "七言律诗", "wupai": "五言排律",
               "qipai": "七言排律"}
"""`VERSE_FORMS` by their Chinese names, for the studio's form menu (a form without one shows its name alone)."""

_NOTE = re.compile(r"（[^（）]*）")  # an editor's note such as （一作「叉」）
_BRACKET = re.compile(r"\[([^\[\]]*)\]")  # an editor's emendation such as [爽]
_LINE = re.compile(f"[^{LINE_END}]+[{LINE_END}]?")
_BAD = re.compile(
    r"[□{}〖〗「」《》/●\u2ff0-\u2fff0-9０-９A-Za-zＡ-Ｚａ-ｚ"
    r"\ue000-\uf8ff\U000f0000-\U000ffffd\U00100000-\U0010fffd]"
)


def strip_notes(text: str) -> str:
    """Remove notes in full-width parentheses and unwrap editor brackets.

    `邏人（一作「叉」）橫鳥道` → `邏人橫鳥道`; `[爽]節` → `爽節`. Nested notes are removed
    from the inside out. Returns the text without notes; never raises.
    """
    previous = None
    while previous != text:
        previous, text = text, _NOTE.sub("", text)
    return _BRACKET.sub(r"\1", text)


def bad_characters(text: str) -> set[str]:
    """Characters that disqualify a poem: `□` (lost), `{…}` component placeholders,
    `〖〗`, `「」《》`, stray `/` and `●`, ideographic description characters (`⿰`…),
    digits, Latin letters and private-use code points."""
    return set(_BAD.findall(text))


def is_hanzi(c: str) -> bool:
    """Whether c is one character that can stand in a line: a CJK ideograph (Unicode category
    Lo), not punctuation, not a `<bos>`-like special token."""
    return len(c) == 1 and unicodedata.category(c) == "Lo"


def split_lines(text: str) -> list[str]:
    """Split a poem into lines, each keeping its closing mark from `LINE_END`.

    `床前明月光，疑是地上霜。` → `['床前明月光，', '疑是地上霜。']`. A trailing piece
    without a closing mark is kept as its own line. Whitespace is ignored.
    """
    return [m.group(0) for m in _LINE.finditer(re.sub(r"\s+", "", text))]


def line_length(line: str) -> int:
    """Number of characters in a line, not counting its closing mark."""
    return len(line.rstrip(LINE_END))


def form_of(text: str, forms: dict[str, tuple[int, int]] = FORMS) -> str:
    """Tag a poem `wujue` (4 lines × 5), `qijue` (4 × 7), `wulv` (8 × 5), `qilv` (8 × 7)
    or `other` (with forms=VERSE_FORMS also `wupai`, `qipai`: 12 × 5, 12 × 7). Every line must have
    the same length and end with a mark from `LINE_END`."""
    lines = split_lines(text)
    if not lines or any(line[-1] not in LINE_END for line in lines):
        return "other"
    lengths = {line_length(line) for line in lines}
    for name, (n_lines, n_chars) in forms.items():
        if len(lines) == n_lines and lengths == {n_chars}:
            return name
    return "other"


def clean_poem(paragraphs: list[str]) -> tuple[str | None, str]:
    """Apply the per-poem cleaning rules to the `paragraphs` of one chinese-poetry record.

    Returns `(text, "")` for a kept poem, or `(None, reason)` where reason is one of
    `bad-characters`, `empty`, `fragment` (fewer than two lines).
    """
    text = strip_notes("".join(p.strip() for p in paragraphs))
    text = re.sub(r"\s+", "", text)
    if not text.strip(LINE_END):
        return None, "empty"
    if bad_characters(text):
        return None, "bad-characters"
    if len(split_lines(text)) < 2:
        return None, "fragment"
    return text, ""


def keyword_places(poem: str, keywords: Iterable[str]) -> dict[str, tuple[int, int, int]]:
    """Where each keyword first stands whole inside a line of a poem: {keyword: (line index
    from 0, position of its first character in the line from 0, the line's characters)}; a
    keyword not found is left out. Lines as `split_lines`, marks not counted."""
    lines = [re.sub(f"[{LINE_END}]", "", line) for line in split_lines(poem)]
    places = {}
    for w in keywords:
        if w and (found := next(((i, line.find(w), len(line)) for i, line in enumerate(lines) if w in line), None)):
            places[w] = found
    return places
