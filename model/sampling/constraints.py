"""Constrained decoding of poem forms, acrostics (藏头诗), rhyme (押韵) and 格律 (meter).

`PoemConstraint` is a logits processor for the engine (`model.engine.Engine.steps`): at each
step it sets to -inf the logits of every token that would break the requested shape, so 100%
of the poems have it:
- `form` (wujue, qijue, wulv, qilv): each line has the form's number of characters, `，`
  closes the odd lines and `。` the even ones (and the last line, for an odd acrostic), and
  the poem ends (`<eos>`) after 4 or 8 lines;
- `acrostic`: line i starts with the acrostic's i-th character; without `form` the line
  count is the acrostic's length and the first line's length (5 or 7) sets the others';
- `rhyme`: the last characters of the even lines share one 平水韵 level-tone group and do
  not repeat (the first rhyme picks the group, among those with a character in the
  vocabulary for every even line; a prompt's rhyme fixes it);
- `meter` (with `form`; implies `rhyme`): every character's tone (平/仄) follows one of the
  form's four standard 近体诗 patterns (`data.verse.meter.patterns`: 平起/仄起, first line rhymed or
  not; 黏 and 对 follow), the poem settling on a pattern as it goes. A polyphonic character
  fits either tone; a character outside the tone table never stands in such a poem. A first
  line that ends level rhymes with the even lines.
A line's characters are CJK ideographs (Unicode category Lo); punctuation only closes lines.

With a tokenizer that has plan tokens (`data/verse/plan.py`), the plan slots after `<bos>` are left
to the plan (`model.sampling.decoding.PlanGrammar` says which plan token goes where; with
`rhyme`, only rhyme tokens of groups the constraint can rhyme in); the poem's rules start
after them, and a rhyme token in the sequence (drawn or given) fixes the rhyme group.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import torch

from data.tokenizer import CharTokenizer
from data.verse.meter import LEVEL, OBLIQUE, patterns, tones
from data.verse.plan import PLAN_SLOTS, PlanIds, plan_ids
from data.verse.poetry import FORMS, is_hanzi
from data.verse.rhyme import rhyme_groups

FREE_LENGTHS = (5, 7)
"""Line lengths an acrostic without `form` may choose on its first line."""
MARKS = ("，", "。")
"""The mark that closes an odd line (1st, 3rd, ...) and an even line (2nd, 4th, ...)."""


@dataclass
class _Row:
    """Where one poem is: line index (0-based), characters so far in that line, its rhymes."""
    line: int = 0
    pos: int = 0
    n_chars: int | None = None  # characters per line, once known
    groups: frozenset[str] | None = None  # rhyme groups every rhyme so far shares
    rhymes: set[str] = field(default_factory=set)
    patterns: frozenset[str] | None = None  # meter: the patterns the poem still fits (None = all)
    ended: bool = False  # the last line is closed: only <eos> remains
    plan_left: int = 0  # plan slots still open (plan tokens may come before the poem)


def poem_tokens(idx: torch.Tensor, consumed: int, plan: PlanIds | None) -> list[list[int]]:
    """Each row's ids from position `consumed` on, without its condition segment (`PlanIds.segment_mask`;
    a segment is given at the start, never drawn, so only a first call, consumed = 0, has one)."""
    rows = idx[:, consumed:].tolist()
    if consumed or plan is None or not plan.segments:
        return rows
    return [[i for i, inside in zip(row, plan.segment_mask(row)) if not inside] for row in rows]


@lru_cache(maxsize=8)
def vocabulary_tables(tok: CharTokenizer, script: str) -> tuple:
    """(hanzi (V,) bool, character → its 平水韵 level-tone groups, group → (V,) bool, character →
    its tones, tone → (V,) bool) of a vocabulary read in `script`: built once per tokenizer
    (shared tensors: do not modify)."""
    V, chars = tok.vocab_size, [c for c in tok.itos if is_hanzi(c)]
    hanzi = torch.tensor([is_hanzi(c) for c in tok.itos])  # (V,) bool
    groups = rhyme_groups(chars, script)
    group_masks: dict[str, torch.Tensor] = {}
    for c, gs in groups.items():
        for g in gs:
            group_masks.setdefault(g, torch.zeros(V, dtype=torch.bool))[tok.stoi[c]] = True
    char_tones = tones(chars, script)
    tone_masks = {t: torch.tensor([t in char_tones.get(c, ()) for c in tok.itos]) for t in (LEVEL, OBLIQUE)}
    return hanzi, groups, group_masks, char_tones, tone_masks


class PoemConstraint:
    """Logits processor forcing `form`, `acrostic`, `rhyme` and `meter` (see the module docstring).

    tokenizer: the model's CharTokenizer; script: the model's script, for the rhyme and tone
    tables. Call `check_text(prompt)` before generating: it raises ValueError if the prompt
    cannot begin such a poem. raises ValueError for an unknown form, a form and acrostic of
    different line counts, rhyme without form or acrostic, meter without form, an acrostic
    that fits no tone pattern, a non-character tokenizer, or a vocabulary without `，` and
    `。` (or, for meter, without characters of both tones); UnknownCharactersError for
    acrostic characters outside the vocabulary.
    """

    def __init__(self, tokenizer: CharTokenizer, form: str | None = None, acrostic: str = "",
                 rhyme: bool = False, script: str = "simplified", meter: bool = False):
        if not isinstance(tokenizer, CharTokenizer):
            raise ValueError("form, acrostic, rhyme and meter need a character-level model (tokenizer=char)")
        if form is not None and form not in FORMS:
            raise ValueError(f"unknown form {form!r}; choose one of {', '.join(FORMS)}")
        if meter and form is None:
            raise ValueError(f"meter needs a form to know the tone patterns; give form= one of {', '.join(FORMS)}")
        rhyme = rhyme or meter
        if not_hanzi := [c for c in acrostic if not is_hanzi(c)]:
            raise ValueError(f"an acrostic is made of characters that start lines; {''.join(not_hanzi)!r} cannot")
        tokenizer.encode(acrostic)  # raises UnknownCharactersError listing them
        n_lines, n_chars = FORMS[form] if form else (len(acrostic) or None, None)
        if form and acrostic and len(acrostic) != n_lines:
            raise ValueError(f"form={form} has {n_lines} lines but the acrostic {acrostic!r} has {len(acrostic)}")
        if n_lines is None:
            raise ValueError("rhyme needs a form or an acrostic to know where lines end" if rhyme else
                             "nothing to constrain: give a form, an acrostic or both")
        if missing := [m for m in MARKS if m not in tokenizer.stoi]:
            raise ValueError(f"the vocabulary lacks {''.join(missing)}; it cannot close lines")
        self.tok, self.form, self.acrostic, self.rhyme, self.meter = tokenizer, form, acrostic, rhyme, meter
        self.n_lines, self.n_chars = n_lines, n_chars
        self.hanzi, groups, group_masks, char_tones, tone_masks = vocabulary_tables(tokenizer, script)
        self.groups = groups if rhyme else {}  # character → its level-tone groups
        self.group_masks: dict[str, torch.Tensor] = group_masks if rhyme else {}  # group → (V,) bool
        # the first rhyme picks among groups with a character for every even line
        self.open_groups = [g for g, m in self.group_masks.items() if m.sum() >= (n_lines or 0) // 2]
        if rhyme and not self.open_groups:
            raise ValueError(f"no 平水韵 level-tone group has {n_lines // 2} characters in this vocabulary")
        self._masks: dict[str, torch.Tensor] = {}  # allowed tokens per expectation, built once
        self.patterns: dict[str, tuple[str, ...]] = {}  # meter: name → one 平/仄 string per line
        self.tones: dict[str, frozenset[str]] = char_tones if meter else {}  # meter: character → its tones
        self.tone_masks: dict[str, torch.Tensor] = tone_masks if meter else {}  # meter: tone → (V,) bool
        if meter:
            self._set_up_meter()
        self.plan = plan_ids(tokenizer)
        self.plan_groups = frozenset(self.open_groups)  # rhyme: the groups a plan's rhyme token may name
        self.rows: list[_Row] = []
        self.consumed = 0

    def _set_up_meter(self) -> None:
        """The form's patterns (those the acrostic's line openings fit). raises ValueError if the
        vocabulary lacks a tone or the acrostic fits no pattern."""
        if not all(m.any() for m in self.tone_masks.values()):
            raise ValueError("meter needs characters of both tones (平 and 仄) in the vocabulary")
        self.patterns = {name: lines for name, lines in patterns(self.form).items()
                         if all(line[0] in self.tones[c] for line, c in zip(lines, self.acrostic))}
        if not self.patterns:
            raise ValueError(f"the acrostic {self.acrostic!r} fits none of the {self.form} tone patterns (meter=true)")

    def max_tokens(self) -> int:
        """Tokens of the longest allowed poem, marks and `<eos>` included (not `<bos>`)."""
        return self.n_lines * ((self.n_chars or max(FREE_LENGTHS)) + 1) + 1

    def check_text(self, text: str) -> None:
        """raises ValueError saying where `text` (a prompt) breaks the constraint. A prompt that
        rhymes already leaves a plan's rhyme token only its groups."""
        row = _Row()
        for i, c in enumerate(text):
            if reason := self._advance(row, c):
                raise ValueError(f"the prompt {text!r} does not fit at {c!r} (character {i + 1}): {reason}")
        if row.groups is not None:
            self.plan_groups = row.groups

    @property
    def plan_tokens(self) -> torch.Tensor:
        """(V,) bool: the plan tokens allowed in the plan slots (with rhyme: rhyme tokens of
        `plan_groups` only, and `<无韵>`)."""
        allowed = torch.zeros(self.tok.vocab_size, dtype=torch.bool)
        if self.plan:
            rhymes = [i for g, i in self.plan.rhymes.items() if not self.rhyme or g in self.plan_groups]
            allowed[[*self.plan.forms.values(), *rhymes, self.plan.none]] = True
        return allowed

    def __call__(self, idx: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """idx: (B, T) int64, the sequence so far; logits: (B, V) → logits with forbidden tokens -inf."""
        if not self.rows:
            self.rows = [_Row(plan_left=PLAN_SLOTS if self.plan else 0) for _ in range(idx.size(0))]
        for row, ids in zip(self.rows, poem_tokens(idx, self.consumed, self.plan)):
            for i in ids:
                if i in (self.tok.bos_id, self.tok.eos_id):
                    continue
                if self.tok.is_plan(i):
                    self._advance_plan(row, i)
                    continue
                row.plan_left = 0
                if reason := self._advance(row, self.tok.itos[i]):
                    raise ValueError(f"a generated token broke the constraint: {reason}")  # a bug if seen
        self.consumed = idx.size(1)
        allowed = torch.stack([self._allowed(row) for row in self.rows]).to(logits.device)  # (B, V)
        return logits.masked_fill(~allowed, float("-inf"))

    def _expected(self, row: _Row) -> tuple[str, set[str] | None]:
        """(what comes next, in words; the characters allowed, None = any hanzi) — for a row."""
        if row.ended:
            return f"the poem ends after {row.line} lines", set()
        mark = MARKS[1] if row.line + 1 == self.n_lines else MARKS[row.line % 2]  # the last line ends with 。
        n = row.n_chars or self.n_chars
        if n is not None and row.pos == n:
            return f"line {row.line + 1} ends with {mark} after {n} characters", {mark}
        if n is None and row.pos in FREE_LENGTHS:  # first line of a free-length acrostic
            end = {mark} if row.pos == max(FREE_LENGTHS) else {mark, None}
            return f"line {row.line + 1} has {' or '.join(map(str, FREE_LENGTHS))} characters", end
        if row.pos == 0 and self.acrostic:
            return f"line {row.line + 1} starts with {self.acrostic[row.line]} (acrostic)", {self.acrostic[row.line]}
        if self.rhyme and row.line % 2 == 1 and n is not None and row.pos == n - 1:
            return f"line {row.line + 1} ends with a level-tone rhyme", {"rhyme"}
        return f"line {row.line + 1} continues with a character, not a mark", None

    def _advance_plan(self, row: _Row, i: int) -> None:
        """Move `row` past plan token i: a rhyme token of a usable group fixes the rhyme group."""
        row.plan_left = max(0, row.plan_left - 1)
        group = next((g for g, j in self.plan.rhymes.items() if j == i), None)
        if self.rhyme and group in self.plan_groups:
            row.groups = frozenset({group})

    def _allowed(self, row: _Row) -> torch.Tensor:
        """(V,) bool: the tokens allowed next in this row (shared tensors: do not modify); in the
        plan slots also the plan tokens."""
        allowed = self._allowed_in_poem(row)
        return allowed | self.plan_tokens if row.plan_left else allowed

    def _allowed_in_poem(self, row: _Row) -> torch.Tensor:
        _, expected = self._expected(row)
        if expected is None:
            allowed = self.hanzi
        elif "rhyme" in expected:
            allowed = self._rhyme_candidates(row)
        else:
            key = "".join(sorted(c or "*" for c in expected))
            if key not in self._masks:
                allowed = torch.zeros(self.tok.vocab_size, dtype=torch.bool)
                allowed[self.tok.eos_id] = row.ended
                allowed[[self.tok.stoi[c] for c in expected if c]] = True
                self._masks[key] = allowed | self.hanzi if None in expected else allowed
            allowed = self._masks[key]
        if self.meter and not row.ended and row.pos < self.n_chars:
            allowed = allowed & self._tone_mask(row)
        return allowed

    def _row_patterns(self, row: _Row) -> frozenset[str]:
        return frozenset(self.patterns) if row.patterns is None else row.patterns

    def _first_line_rhyme(self, row: _Row) -> bool:
        """Whether the row is at the first line's last character, where a level tone is a rhyme."""
        return self.meter and row.line == 0 and row.pos == self.n_chars - 1

    def _tone_mask(self, row: _Row) -> torch.Tensor:
        """(V,) bool: characters of a tone some pattern the row still fits has at this position;
        at the first line's end a level character must also be a rhyme (首句入韵)."""
        allowed = torch.zeros(self.tok.vocab_size, dtype=torch.bool)
        for tone in {self.patterns[p][row.line][row.pos] for p in self._row_patterns(row)}:
            rhymes = tone == LEVEL and self._first_line_rhyme(row)
            allowed |= self._rhyme_candidates(row) if rhymes else self.tone_masks[tone]
        return allowed

    def _advance_meter(self, row: _Row, c: str) -> str | None:
        """Narrow the row's patterns to those c's tones fit; returns why c fits none, or None."""
        have = self.tones.get(c, frozenset())
        kept = frozenset(p for p in self._row_patterns(row) if self.patterns[p][row.line][row.pos] in have)
        if not kept:
            needed = "/".join(sorted({self.patterns[p][row.line][row.pos] for p in self._row_patterns(row)}))
            return f"line {row.line + 1} character {row.pos + 1} must be {needed} (meter: the tone patterns so far)"
        if self._first_line_rhyme(row) and LEVEL in have and any(self.patterns[p][0][-1] == LEVEL for p in kept):
            groups = self.groups[c] if row.groups is None else self.groups[c] & row.groups  # a plan's group kept
            if groups:
                row.groups, row.rhymes = groups, {c}  # 首句入韵: it picks the rhyme group (within the plan's)
            else:  # outside the plan's group: a polyphonic c stands as 仄, the first line unrhymed
                kept = frozenset(p for p in kept if self.patterns[p][0][-1] == OBLIQUE)
                if not kept:
                    return f"line 1 ends with a rhyme of the group {'/'.join(sorted(row.groups))}"
        row.patterns = kept
        return None

    def _rhyme_candidates(self, row: _Row) -> torch.Tensor:
        groups = row.groups if row.groups is not None else self.open_groups
        mask = torch.stack([self.group_masks[g] for g in groups]).any(dim=0)  # (V,)
        fresh = mask.clone()
        fresh[[self.tok.stoi[c] for c in row.rhymes]] = False
        return fresh if fresh.any() else mask  # repeat a rhyme only if nothing else is left

    def _advance(self, row: _Row, c: str) -> str | None:
        """Move `row` past character c; returns why c is not allowed there, or None."""
        why, expected = self._expected(row)
        if expected is None:
            ok = is_hanzi(c)
        elif "rhyme" in expected:
            ok = c in self.groups and (row.groups is None or bool(self.groups[c] & row.groups))
            why += " (a character of the rhyme group so far)" if row.groups else ""
        else:
            ok = c in expected or (None in expected and is_hanzi(c))
        if not ok:
            return why
        if self.meter and c not in MARKS and (reason := self._advance_meter(row, c)):
            return reason
        if c in MARKS:
            row.n_chars = row.n_chars or row.pos
            row.line, row.pos = row.line + 1, 0
            row.ended = row.line == self.n_lines
        else:
            if "rhyme" in (expected or ()):
                row.groups = self.groups[c] & row.groups if row.groups is not None else self.groups[c]
                row.rhymes.add(c)
            row.pos += 1
        return None
