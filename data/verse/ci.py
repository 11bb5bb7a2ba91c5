"""词 (ci): lyrics written to a tune (词牌). Its lines and shape, its tune's name, and the rhyme
classes of 词林正韵 its rhymes are judged by. Written once, shared by the corpus script, the tune
templates (`data/verse/tunes.py`) and the checks.

A 词's lines end at any of `CI_LINE_END` (the 顿号 、 too: in 词 it cuts a short line or a
leading word, 领字, from what follows). Its **shape** is its lines' lengths, each followed by
its closing mark: 浣溪沙's commonest is `7。7。7。7，7。7。`.

**Rhyme.** 词 rhyme more loosely than 近体诗: 戈载's 词林正韵 (1821) merges the 平水韵 groups
into 19 部, each with a level (平) and an oblique (仄: 上声 and 去声) side; 部 15–19 are the
入声 rhymes. `cilin.tsv` beside this file maps every 平水韵 group to its 部. Six groups are
split between two 部 (灰 and its 上/去 groups between 3 and 5, 泰 the same, 佳 蟹 卦 between 5
and 10, 元 阮 愿 between 6 and 7); a character of such a group goes by its Mandarin final
(pypinyin): 回 (uei) 3, 来 (ai) 5; 涯 (ia) 10, 柴 (ai) 5; 魂 (uen) 6, 园 (van) 7. That is the
usual approximation of 戈载's character lists, not the lists themselves.
"""
from __future__ import annotations

import csv
import re
import unicodedata
from collections import defaultdict
from functools import lru_cache
from pathlib import Path

from data.verse.poetry import strip_notes
from data.verse.rhyme import is_level_tone, readings

CI_LINE_END = "，。、？！；"
"""A 词's line ends at one of these marks."""
CI = "ci"
"""The form label of a 词 (a corpus record's `form`, `tune=`'s form, its evaluation set)."""
LOST_TUNE = "失调名"
"""The source's name for a 词 whose tune is lost: it has no tune."""
LEVEL, OBLIQUE = "平", "仄"
CILIN_PATH = Path(__file__).with_name("cilin.tsv")
_LINE = re.compile(f"[^{CI_LINE_END}]+[{CI_LINE_END}]?")
_SHAPE = re.compile(f"(\\d+)([{CI_LINE_END}]?)")


def is_ideograph(c: str) -> bool:
    """Whether c is a CJK ideograph (unified or compatibility), the only characters a 词 line holds."""
    return unicodedata.name(c, "").startswith(("CJK UNIFIED IDEOGRAPH", "CJK COMPATIBILITY IDEOGRAPH"))


def ci_lines(text: str) -> list[str]:
    """A 词's lines, each with its closing mark from `CI_LINE_END` (a last piece without one
    kept as it is): `明月几时有，把酒问青天。` → `['明月几时有，', '把酒问青天。']`."""
    return [m.group(0) for m in _LINE.finditer(re.sub(r"\s+", "", text))]


def closed_lines(text: str) -> tuple[list[tuple[int, str]], int]:
    """The start of a 词: ([(length, mark)] of its lines that have their mark, the characters of a
    last line without one): `明月几时有，把酒` → ([(5, "，")], 2)."""
    lines = ci_lines(text)
    rest = len(lines[-1]) if lines and lines[-1][-1] not in CI_LINE_END else 0
    return [(len(line) - 1, line[-1]) for line in lines[:len(lines) - bool(rest)]], rest


def shape_of(text: str) -> str:
    """The 词's shape: each line's length followed by its mark (`7。7。7。7，7。7。`)."""
    return "".join(f"{len(line.rstrip(CI_LINE_END))}{line[-1] if line[-1] in CI_LINE_END else ''}"
                   for line in ci_lines(text))


def parse_shape(shape: str) -> list[tuple[int, str]]:
    """`shape_of`'s string → [(line length, closing mark)]. raises ValueError if it is not one."""
    parts = [(int(n), mark) for n, mark in _SHAPE.findall(shape)]
    if not parts or "".join(f"{n}{m}" for n, m in parts) != shape:
        raise ValueError(f"{shape!r} is not a shape such as 7。7。7。7，7。7。")
    return parts


def tune_name(rhythmic: str) -> str | None:
    """The tune of a source heading (`rhythmic`): the heading itself, or for `A・B` (a name the
    词 was published under, then the tune's usual name: 酹江月・念奴娇, 木兰花・玉楼春) the last
    name; None for `失调名` (tune lost) and an empty heading."""
    name = rhythmic.strip().split("・")[-1].strip()
    return None if not name or name == LOST_TUNE else name


def clean_ci(paragraphs: list[str]) -> tuple[str | None, str]:
    """The cleaning rules of the Tang corpus (`data.verse.poetry.clean_poem`) for one 词:
    `(text, "")` for a kept 词, or `(None, reason)`, reason one of `bad-characters` (a lost
    character `□`, or anything but CJK ideographs and `CI_LINE_END` once notes are removed),
    `empty`, `fragment` (fewer than two lines)."""
    text = re.sub(r"\s+", "", strip_notes("".join(p.strip() for p in paragraphs)))
    if not text.strip(CI_LINE_END):
        return None, "empty"
    if any(c not in CI_LINE_END and not is_ideograph(c) for c in text):
        return None, "bad-characters"
    if len(ci_lines(text)) < 2:
        return None, "fragment"
    return text, ""


@lru_cache(maxsize=None)
def cilin_table() -> dict[str, tuple[tuple[int, frozenset[str] | None], ...]]:
    """`cilin.tsv`: 平水韵 group → its (部, Mandarin finals that go there, None for the rest) rows."""
    table: defaultdict[str, list] = defaultdict(list)
    with CILIN_PATH.open(encoding="utf-8") as f:
        for row in csv.DictReader((line for line in f if not line.startswith("#")), delimiter="\t"):
            finals = None if row["finals"] == "*" else frozenset(row["finals"].split(","))
            table[row["group"]].append((int(row["bu"]), finals))
    return {group: tuple(sorted(rows, key=lambda r: r[1] is None)) for group, rows in table.items()}


def _final(c: str) -> str:
    from pypinyin import Style, lazy_pinyin

    return lazy_pinyin(c, style=Style.FINALS)[0]


@lru_cache(maxsize=None)
def rhyme_classes(script: str) -> dict[str, frozenset[tuple[int, str]]]:
    """Character of `script` → its 词林正韵 rhyme classes: (部 1–19, 平 or 仄), one per reading
    (`data.verse.rhyme.readings`); two characters rhyme in a 词 when they share a class.
    raises ValueError for an unknown script."""
    table, out = cilin_table(), {}
    for c, groups in readings(script).items():
        classes = set()
        for group in groups:
            rows = table[group]
            bu = rows[0][0] if len(rows) == 1 else next(b for b, finals in rows if finals is None or _final(c) in finals)
            classes.add((bu, LEVEL if is_level_tone(group) else OBLIQUE))
        out[c] = frozenset(classes)
    return out
