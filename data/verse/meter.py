"""近体诗 (regulated verse) rules: the 平仄 of a character, the standard tone patterns of the
four forms, 黏 and 对. Written once, shared by the metrics and the `meter=true` constraint.

Tones come from the same 平水韵 table as the rhyme (`data/verse/rhyme.py`): a character has the
level tone 平 if it sits in a level-tone (平声) group, the oblique tone 仄 if it sits in an
oblique (上声, 去声, 入声) group, both if both (看, 思, 望: polyphonic, it fits either), none if
the table lacks it (1.0 % of the simplified corpus's characters, mostly variant glyphs such
as 疎, 劒, 猨): such a character fits no tone, so a check it takes part in fails.

The patterns (王力《汉语诗律学》; any textbook of 近体诗 gives them): a five-character line is
one of four, named by its 2nd and last tone,

    A 仄仄平平仄   B 平平仄仄平   C 平平平仄仄   D 仄仄仄平平

and a seven-character line puts two characters of the opposite tone in front (A → 平平仄仄平平仄).
A poem is fixed by two choices: the tone of its first line's 2nd character (平起 or 仄起) and
whether its first line rhymes (首句入韵: it ends 平; otherwise 仄). Then every line follows:
even lines (2nd, 4th, …) end 平 and rhyme, the other odd lines end 仄; within a couplet the
second line opposes the first (对: 2nd character of the opposite tone); the first line of the
next couplet sticks to the line before (黏: the same tone at the 2nd character). So each form
has four standard patterns (`patterns`). Poets kept them loosely: the saying 一三五不论 frees
the 1st, 3rd (and 5th) characters of a line (not the last); `matching_patterns(relaxed=True)`.
"""
from __future__ import annotations

from functools import lru_cache
from itertools import product
from typing import Iterable

from data.verse.poetry import LINE_END, VERSE_FORMS, split_lines
from data.verse.rhyme import is_level_tone, readings, rhyme_groups

LEVEL, OBLIQUE = "平", "仄"
TONES = frozenset({LEVEL, OBLIQUE})
"""A character's tones are a subset of these; both for a polyphonic character."""
_OPPOSITE = {LEVEL: OBLIQUE, OBLIQUE: LEVEL}


def tones(chars: Iterable[str], script: str) -> dict[str, frozenset[str]]:
    """Each character of `chars` → its tones: {平}, {仄}, {平, 仄} (polyphonic) or {} (not in
    the table), in `script`'s glyphs, from the groups of its own readings (`data.verse.rhyme.readings`,
    the table the sampler rhymes with). raises ValueError for an unknown script."""
    index = readings(script)
    return {c: frozenset(LEVEL if is_level_tone(g) else OBLIQUE for g in index.get(c, ())) for c in dict.fromkeys(chars)}


def line_pattern(n_chars: int, second: str, last: str) -> str:
    """The standard line of 5 or 7 characters with `second` at its 2nd position and `last` at
    its end (A–D of the module docstring; seven characters: two of the opposite tone in front).
    raises ValueError for another length or a tone other than 平/仄."""
    if n_chars not in (5, 7) or {second, last} - TONES:
        raise ValueError(f"a regulated line has 5 or 7 characters and tones 平/仄, got {n_chars}, {second}, {last}")
    o, s = _OPPOSITE[second], second
    five = {(OBLIQUE, OBLIQUE): "仄仄平平仄", (LEVEL, LEVEL): "平平仄仄平",
            (LEVEL, OBLIQUE): "平平平仄仄", (OBLIQUE, LEVEL): "仄仄仄平平"}
    if n_chars == 5:
        return five[s, last]
    return s + s + five[o, last]  # 七言: two of `second`, then the five-character line of the opposite 2nd tone


@lru_cache(maxsize=None)
def patterns(form: str) -> dict[str, tuple[str, ...]]:
    """The four standard tone patterns of `form` (`data.verse.poetry.VERSE_FORMS`: wujue, qijue, wulv,
    qilv, and the 排律 wupai, qipai, the 律 continued): name (平起首句不入韵, 平起首句入韵, 仄起首句不入韵,
    仄起首句入韵) → one string of 平/仄 per line. raises ValueError for an unknown form."""
    if form not in VERSE_FORMS:
        raise ValueError(f"unknown form {form!r}; choose one of {', '.join(VERSE_FORMS)}")
    n_lines, n_chars = VERSE_FORMS[form]
    if not has_patterns(form):
        raise ValueError(f"meter=true: {form}'s lines have {n_chars} characters, and the standard 平仄 patterns are of "
                         "lines of 5 or 7; leave meter out (rhyme=true still rhymes the even lines)")
    out = {}
    for start, first_rhymes in product((LEVEL, OBLIQUE), (False, True)):
        lines, second = [], start
        for k in range(n_lines):
            if k % 2 == 1:  # 对: the couplet's second line opposes its first
                second = _OPPOSITE[second]
            last = LEVEL if k % 2 == 1 or (k == 0 and first_rhymes) else OBLIQUE
            lines.append(line_pattern(n_chars, second, last))  # 黏: the next odd line keeps `second`
        out[f"{start}起首句{'入韵' if first_rhymes else '不入韵'}"] = tuple(lines)
    return out


def has_patterns(form: str) -> bool:
    """Whether a form of `VERSE_FORMS` has the standard patterns: lines of 5 or 7 characters."""
    return VERSE_FORMS[form][1] in (5, 7)


def poem_lines(text: str) -> list[str]:
    """The lines of a poem without their closing marks: `床前明月光，疑是地上霜。` → [床前明月光, 疑是地上霜]."""
    return [line.rstrip(LINE_END) for line in split_lines(text)]


def free_positions(n_chars: int, relaxed: bool) -> frozenset[int]:
    """0-based positions of a line that `relaxed` (一三五不论) leaves free: the 1st, 3rd (5th)
    characters but not the last; none when not relaxed."""
    return frozenset(range(0, n_chars - 1, 2)) if relaxed else frozenset()


def matching_patterns(lines: list[str], form: str, script: str, relaxed: bool = False) -> list[str]:
    """The names of `form`'s standard patterns whose tone every character of `lines` has (a
    polyphonic one has both); relaxed: positions of `free_positions` are not checked. Empty
    if none fits, the lines do not have the form's shape, or the form has no patterns
    (`has_patterns`). raises ValueError for an unknown form."""
    if form in VERSE_FORMS and not has_patterns(form):
        return []
    pats = patterns(form)
    n_lines, n_chars = VERSE_FORMS[form]
    if len(lines) != n_lines or any(len(line) != n_chars for line in lines):
        return []
    have, free = tones("".join(lines), script), free_positions(n_chars, relaxed)
    return [name for name, pattern in pats.items()
            if all(i in free or t in have[c] for line, line_tones in zip(lines, pattern)
                   for i, (c, t) in enumerate(zip(line, line_tones)))]


def even_positions(n_chars: int) -> range:
    """0-based indices of the 2nd, 4th (and 6th) characters of a line: 二四六."""
    return range(1, n_chars, 2)


def alternates(line: str, script: str) -> bool:
    """Whether the 2nd, 4th (and 6th) characters can alternate 平/仄 (二四六分明): some choice
    of tones the characters allow alternates."""
    have = tones(line, script)
    steps = [have[line[i]] for i in even_positions(len(line))]
    return any(all((t if j % 2 == 0 else _OPPOSITE[t]) in h for j, h in enumerate(steps)) for t in TONES)


def _each_even_position(a: str, b: str, script: str, same: bool) -> bool:
    have = tones(a + b, script)
    for i in even_positions(min(len(a), len(b))):
        ha, hb = have[a[i]], have[b[i]]
        if not any(t in ha and (t if same else _OPPOSITE[t]) in hb for t in TONES):
            return False
    return True


def opposed(first: str, second: str, script: str) -> bool:
    """对: the two lines of a couplet can have opposite tones at every 2nd, 4th (6th) character."""
    return _each_even_position(first, second, script, same=False)


def sticks(previous: str, line: str, script: str) -> bool:
    """黏: a couplet's first line can have the tones of the line before at every 2nd, 4th (6th) character."""
    return _each_even_position(previous, line, script, same=True)


def shared_rhyme_groups(finals: Iterable[str], script: str) -> frozenset[str]:
    """The 平水韵 level-tone groups every one of `finals` sits in (empty if they share none, or
    if one has no level tone)."""
    finals = list(finals)
    groups = rhyme_groups(finals, script)
    if not finals or any(c not in groups for c in finals):
        return frozenset()
    return frozenset.intersection(*(groups[c] for c in finals))

