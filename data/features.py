"""Per-vocabulary tables for the network's optional input features (`model/gpt.py`): what a
token sounds like (`phonology_tables`, for `GPTConfig.phonology`) and what kind of token it is
(`token_kinds`: poem start and end, line-end marks; for `GPTConfig.structure` and the auxiliary
rhyme loss). The network imports no poetry rules: it takes these as buffers.

Phonology (`phonology_tables`):
What a token sounds like, from the 平水韵 table (`data.verse.rhyme`): the level-tone (平声)
rhyme groups of its readings and its tone class. The network takes these as buffers
(`model.gpt.GPT.set_phonology`), saved in the checkpoint, so it imports no poetry rules and
sampling needs nothing from outside. A token stands for its last character (a BPE piece rhymes
by its last character); specials, plan tokens and non-hanzi get the "none" ids.

Group ids: 0 none (no level-tone reading), 1…30 the level-tone groups in the table's order
(上平聲一東 = 1 … 下平聲十五咸 = 30). Tone ids (`TONES`): 0 none (not in the table), 1 level
only, 2 oblique only, 3 both (a polyphonic character read in either).

A tokenizer with tune tokens (a model that writes 词, many of whose tunes rhyme in 仄) also gets
the oblique (仄) classes of 词林正韵 (`data.verse.ci.rhyme_classes`: 部 1–19) as group ids
31…49, after a character's level-tone groups (`group_count`): 月 gets [id of 18部仄, PAD, …],
乡 [id of 下平聲七陽, id of 2部仄, PAD, PAD]. Two characters lose a reading to READINGS.
"""
from __future__ import annotations

from dataclasses import dataclass

from data.tokenizer import Tokenizer
from data.verse.ci import CI_LINE_END, OBLIQUE, rhyme_classes
from data.verse.plan import plan_ids
from data.verse.poetry import LINE_END
from data.verse.rhyme import is_level_tone, level_tone_table, readings
from data.verse.tunes import Variant, tunes

TUNE_LINES = 32
"""Lines a tune's template row holds (`tune_tables`; the longest template has 26)."""
TEMPLATE_MARKS = "，。、"
"""The marks that close a template's lines (`data.verse.tunes`), by id 1, 2, 3 (`tune_tables`)."""
TONES = ("none", "level", "oblique", "both")
TOKEN_KINDS = ("other", "bos", "eos", "line_end")
"""`token_kinds` ids: 0 any other token, 1 `<bos>` or a plan token (the poem's text starts after
it), 2 `<eos>`, 3 a mark that ends a line (`data.verse.poetry.LINE_END`: ，。？！；, and for a
tokenizer with tune tokens the 词's 、 too, `data.verse.ci.CI_LINE_END`)."""
GROUPS = 31
"""Group ids: 0 none, then the 30 level-tone groups (`group_ids`)."""
OBLIQUE_CLASSES = 19
"""The 词林正韵 部 with an oblique (仄) side: all 19 (`group_count`)."""
READINGS = 4
"""Groups kept per character (the most level-tone groups any character of the table has: 4)."""
PAD = -1
"""Group id filling a row past a character's last level-tone group."""


@dataclass
class PhonologyTables:
    """groups: vocab_size rows of READINGS group ids (PAD after the last; a row without a
    level-tone group is [0, PAD, …]); tones: vocab_size tone ids."""
    groups: list[list[int]]
    tones: list[int]


def group_ids() -> dict[str, int]:
    """Level-tone group name → its id, 1…30 in the table's order."""
    return {g: i + 1 for i, g in enumerate(level_tone_table())}


def group_count(tokenizer: Tokenizer) -> int:
    """How many group ids `phonology_tables` gives `tokenizer`'s tokens: GROUPS, and with tune
    tokens the OBLIQUE_CLASSES of 词林正韵 besides (`GPTConfig.rhyme_groups`)."""
    return GROUPS + (OBLIQUE_CLASSES if _tune_rows(tokenizer) else 0)


def phonology_tables(tokenizer: Tokenizer, script: str) -> PhonologyTables:
    """The tables for every id of `tokenizer`, its characters read in `script` ('simplified' |
    'traditional'). `光`, `霜` and `乡` all get [id of 下平聲七陽, PAD, PAD, PAD]; `乡`'s tone is
    3 (both: it also reads 去聲), `光`'s 1; with tune tokens `乡` also gets 2部仄 (module doc).
    raises ValueError for an unknown script."""
    index, ids = readings(script), group_ids()
    classes = rhyme_classes(script) if group_count(tokenizer) > GROUPS else {}
    groups, tones = [], []
    for i in range(tokenizer.vocab_size):
        text = "" if tokenizer.is_plan(i) else tokenizer.token_bytes(i).decode("utf-8", errors="ignore")
        char = text[-1:] if text else ""
        found = index.get(char, frozenset())
        level = sorted(ids[g] for g in found if is_level_tone(g))
        level += sorted(GROUPS + bu - 1 for bu, tone in classes.get(char, ()) if tone == OBLIQUE)
        level = level[:READINGS] or [0]
        groups.append(level + [PAD] * (READINGS - len(level)))
        has_level, has_oblique = level != [0], any(not is_level_tone(g) for g in found)
        tones.append(0 if not found else 3 if has_level and has_oblique else 1 if has_level else 2)
    return PhonologyTables(groups, tones)


FULL_STOPS = "。？！"
"""Line-end marks that close a couplet: the line after one is a couplet's first (odd) line; after
，or ； comes its second (even) line, whose last character rhymes."""


def full_stops(tokenizer: Tokenizer) -> list[bool]:
    """Whether each id of `tokenizer` ends in a mark of FULL_STOPS (what `structure_ids` reads a
    line's parity from where the poem's `<bos>` is out of sight)."""
    return [not tokenizer.is_plan(i) and tokenizer.token_bytes(i).decode("utf-8", errors="ignore")[-1:] in
            tuple(FULL_STOPS) for i in range(tokenizer.vocab_size)]


def token_kinds(tokenizer: Tokenizer) -> list[int]:
    """The `TOKEN_KINDS` id of every id of `tokenizer` (a token ending in a line-end mark is one)."""
    bos, eos = tokenizer.encode("", bos=True, eos=True)
    marks = tuple(CI_LINE_END if _tune_rows(tokenizer) else LINE_END)
    kinds = []
    for i in range(tokenizer.vocab_size):
        text = "" if tokenizer.is_plan(i) else tokenizer.token_bytes(i).decode("utf-8", errors="ignore")
        kinds.append(1 if i == bos or tokenizer.is_plan(i) else 2 if i == eos else 3 if text[-1:] in marks else 0)
    return kinds


def _tune_rows(tokenizer: Tokenizer) -> dict[int, Variant]:
    """Token id → its template, for the tune tokens of a tokenizer (`data.verse.plan.tune_tokens`;
    none: {})."""
    ids = plan_ids(tokenizer)
    return {} if ids is None else {i: tunes()[t][k] for i, (t, k) in ids.templates.items()}


def tune_tables(tokenizer: Tokenizer) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
    """Per token id, TUNE_LINES line lengths, rhyme tones and mark ids: for a tune token its
    template's (`data.verse.tunes`: each line's characters, the tone its last one rhymes in, 1 平
    or 2 仄 (0: no rhyme), the mark that closes it, 1 + its index in TEMPLATE_MARKS; 0, 0 and 0
    past its last line), for every other token 0, 0 and 0 (what `structure_ids` reads a 词's lines
    from, as SongNet gives its model the template). raises ValueError for a template mark not in
    TEMPLATE_MARKS."""
    rows = _tune_rows(tokenizer)
    lengths = [[0] * TUNE_LINES for _ in range(tokenizer.vocab_size)]
    rhymes = [[0] * TUNE_LINES for _ in range(tokenizer.vocab_size)]
    marks = [[0] * TUNE_LINES for _ in range(tokenizer.vocab_size)]
    for i, v in rows.items():
        for k, ((n, mark), r) in enumerate(zip(v.lines[:TUNE_LINES], v.rhymes)):
            if mark not in TEMPLATE_MARKS:
                raise ValueError(f"a template of the tune token {i} ends a line with {mark!r}, not one of {TEMPLATE_MARKS}")
            lengths[i][k], marks[i][k] = n, 1 + TEMPLATE_MARKS.index(mark)
            rhymes[i][k] = 0 if r is None else 1 + (v.segments[r] == OBLIQUE)
    return lengths, rhymes, marks
