"""Keywords every sampled poem holds (`keywords=[明月,故乡]`), whole inside a line, where the model
chooses: `Placement`, the one placement search over templates (forms, acrostics, tunes), used by
`model.sampling.shape.TemplateConstraint`; `FreeKeywords`, the processor of a free poem's keywords.
The rules (the room left, one keyword to each part of the poem, a drawn slot for each, free
poems, why a keyword never takes a rhyming line's last character): docs/sampling.md#keywords-every-poem-holds.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from functools import partial
from typing import Hashable, Iterable, Sequence

import torch

from data.keywords import write_char
from data.tokenizer import CharTokenizer
from data.verse.plan import plan_ids
from data.verse.poetry import FORMS, LINE_END, is_hanzi
from data.verse.templates import FREE_LENGTHS, Template, form_templates
from model.sampling.rules import Acrostic, Row, Rule, Tones, only

MAX_FREE_LINE = max(FREE_LENGTHS)
"""The longest line a keyword may fill without a form (7, as the longest regulated line)."""
@dataclass
class KeywordRow:
    """One row's keywords: still to write (of `total`); being written (the candidates sharing the
    `written` characters so far); the current line's characters; the drawn slot (a position) of the
    next keyword, drawn when `slot_for` keywords were pending. Free poems: the first line's length,
    whether the model would have ended the poem, the planned form's placement and where the poem
    is in it ((position, its mark written), None once it leaves the form)."""
    pending: frozenset[str]
    total: int
    open: tuple[str, ...] = ()
    written: int = 0
    line_text: str = ""
    slot: int | None = None
    slot_for: int = -1
    first_len: int | None = None
    overtime: bool = False
    planned: Placement | None = None
    at: tuple[int, bool] | None = None

    def advance(self, c: str | None, starts: Iterable[str] = ()) -> None:
        """Move past c: a character (`starts`: the keywords that could start where it stands; c
        opens those it begins), or None for a line's closing mark."""
        if c is None:
            self.line_text, self.open, self.written = "", (), 0
            return
        self.line_text, self.open, self.written, done = write_char(self.line_text, self.open, self.written, starts,
                                                                   self.pending, c)
        self.pending -= done


class Placement:
    """Where keywords may stand in templates (module docstring): the one placement search.

    templates: the constraint's; tones: the `Tones` rule under `meter`, else None; acrostic: the
    `Acrostic` rule, or None; first: the position after the prompt (the sections start at its
    line); seed: the slots' draws; only: characters → (V,) bool of just them.
    """

    def __init__(self, templates: Sequence[Template], tones: Tones | None, acrostic: Acrostic | None, first: int,
                 seed: int, only):
        self.templates, self.tones, self.acrostic = templates, tones, acrostic
        self.first, self.only, self.rng = first, only, random.Random(seed)
        self._memo: dict[tuple, bool] = {}
        self._fits: dict[tuple, bool] = {}
        self._starts: dict[tuple, tuple[str, ...]] = {}

    def fits(self, i: int, k: int, w: str) -> bool:
        """Whether keyword w can stand from position k of template i (module docstring)."""
        key = (i, k, w)
        if key not in self._fits:
            t = self.templates[i]
            _, start, end = t.span(k)
            self._fits[key] = k + len(w) <= end and not any(k + j in t.rhyme_at for j in range(len(w))) and \
                (self.acrostic is None or k != start or w[0] == self.acrostic.at(i, k)) and \
                (self.tones is None or self.tones.fits(i, k, w))
        return self._fits[key]

    def _behind(self, i: int, line: int, words: frozenset[str], total: int) -> bool:
        """Whether a row starting `line` of template i with `words` of `total` unwritten is behind its sections."""
        first, n_lines = self.templates[i].line_of(self.first), len(self.templates[i].starts)
        return line > first and total - len(words) < (line - first) * total // (n_lines - first)

    def placeable(self, i: int, k: int, words: frozenset[str], total: int) -> bool:
        """Whether `words` can all be written, whole and apart, from position k of template i on,
        each of the row's `total` keywords by the end of its section."""
        if not words:
            return True
        if sum(map(len, words)) > self.templates[i].length - k:
            return False
        line, start, _ = self.templates[i].span(k)
        if k == start and self._behind(i, line, words, total):
            return False
        key = (i, k, words, total)
        if key not in self._memo:
            self._memo[key] = any(self.fits(i, k, w) and self.placeable(i, k + len(w), words - {w}, total)
                                  for w in words) or self.placeable(i, k + 1, words, total)
        return self._memo[key]

    def starts(self, i: int, k: int, row: KeywordRow) -> tuple[str, ...]:
        """The pending keywords that may start at position k of template i (memoised)."""
        key = (i, k, row.pending, row.total)
        if key not in self._starts:
            self._starts[key] = tuple(w for w in sorted(row.pending) if self.fits(i, k, w) and
                                      self.placeable(i, k + len(w), row.pending - {w}, row.total))
        return self._starts[key]

    def key(self, row: KeywordRow, k: int, live: Iterable[int]) -> tuple:
        """What the masks of a row at position k depend on (for the masks' cache); draws the slot of
        its next keyword when one is due (in the first live template)."""
        if row.pending and row.slot_for != len(row.pending):
            row.slot, row.slot_for = self._draw_slot(min(live), k, row), len(row.pending)
        return row.pending, row.total, row.open, row.written, row.slot == k

    def allowed(self, i: int, k: int, row: KeywordRow, live: Iterable[int]) -> set[str] | None:
        """The characters template i allows at position k for the row's keywords (`key` called
        first): the next one of a keyword being written; at the row's slot, or where the keywords
        would no longer fit after any other character, the first ones of those that may start
        here; None: no restriction."""
        if row.open:
            return {w[row.written] for w in row.open}
        if not row.pending:
            return None
        here = {w[0] for w in self.starts(i, k, row)}
        if row.slot == k and any(self.starts(j, k, row) for j in live):
            return here
        return None if self.placeable(i, k + 1, row.pending, row.total) else here

    def mask(self, i: int, k: int, row: KeywordRow, live: Iterable[int]) -> torch.Tensor | None:
        """`allowed` as (V,) bool, None for no restriction."""
        chars = self.allowed(i, k, row, live)
        return None if chars is None else self.only(chars)

    def _draw_slot(self, i: int, k: int, row: KeywordRow) -> int | None:
        """A position for the row's next keyword in template i (module docstring), None if none."""
        t, shortest = self.templates[i], min(map(len, row.pending))
        first, n_lines = t.line_of(self.first), len(t.starts)
        due, places = row.total - len(row.pending), {}
        for line in range(t.line_of(k), n_lines):
            if (line - first) * row.total // (n_lines - first) == due:
                if found := [p for p in range(t.starts[line], t.ends[line] - shortest, 2) if p >= k]:
                    places[line] = found
        if not places:
            return None
        line = self.rng.choice(sorted(places))
        head, rest = places[line][0] == t.starts[line], places[line][1:]
        return places[line][0] if head and (not rest or self.rng.random() < 0.5) else self.rng.choice(
            rest if head else places[line])

    def check(self, name: str, live: frozenset[int], k: int, words: tuple[str, ...], rules: list[str]) -> None:
        """raises ValueError, in one line, if `words` cannot all be placed from position k in the
        templates `live` of `name` (a form or tune): a keyword longer than every line before its rhyme,
        more keyword characters than the poem holds, one whose 平仄 fits no position (meter), or no
        joint placement under `rules` (the rules in force, named in the message)."""
        templates = [self.templates[i] for i in live]
        longest = max(n - (r is not None) for t in templates for (n, _), r in zip(t.lines, t.rhymes))
        if long := [w for w in words if len(w) > longest]:
            raise ValueError(f"the keyword {long[0]} has {len(long[0])} characters, more than a line of {name} holds "
                             f"before its rhyme ({longest})")
        if (total := sum(map(len, words))) > (size := max(t.length for t in templates)):
            raise ValueError(f"the keywords {'、'.join(words)} have {total} characters, more than {name} holds ({size})")
        for w in words:
            if self.tones and not any(self.tones.fits(i, j, w) for i in live for j in range(self.templates[i].length)
                                      if j + len(w) <= self.templates[i].span(j)[2]):
                tones = "".join("/".join(sorted(self.tones.tones.get(c, ()))) or "?" for c in w)
                raise ValueError(f"the keyword {w} ({tones}) fits no position of {name}'s 平仄 (meter=true)")
        if not any(self.placeable(i, k, frozenset(words), len(words)) for i in live):
            said = f"the keywords {'、'.join(words)} cannot all" if len(words) > 1 else f"the keyword {words[0]} cannot"
            rules = [*rules, *(["one keyword to each part of the poem"] * (len(words) > 1))]
            raise ValueError(f"{said} be placed in {name} with {', '.join(rules)}")


class Keywords(Rule):
    """`keywords` in a form, tune or acrostic (`TemplateConstraint`): each row's keywords placed by
    `placement` from its position `first` on (after the prompt); no line closes inside a keyword, no
    poem before its keywords."""

    def __init__(self, placement: Placement):
        self.kw = placement

    def key(self, row: Row) -> Hashable:
        return row.kw and self.kw.key(row.kw, row.k, row.live)

    def mask(self, i: int, row: Row) -> torch.Tensor | None:
        return None if row.kw is None else self.kw.mask(i, row.k, row.kw, row.live)

    def why_not(self, i: int, row: Row, c: str) -> str | None:
        if row.kw is None or row.k < self.kw.first:
            return None
        self.kw.key(row.kw, row.k, row.live)
        chars = self.kw.allowed(i, row.k, row.kw, row.live)
        return None if chars is None or c in chars else "the keywords could not all be placed after it"

    def advance(self, row: Row, c: str, live: frozenset[int]) -> None:
        if row.kw is not None and row.k >= self.kw.first:
            row.kw.advance(c, {w for i in live for w in self.kw.starts(i, row.k, row.kw)})

    def may_close(self, row: Row, end: bool) -> bool:
        return row.kw is None or not (row.kw.open or end and row.kw.pending)

    def close(self, row: Row) -> None:
        if row.kw is not None:
            row.kw.advance(None)


class FreeKeywords:
    """Logits processor forcing every row's keywords into a free poem (module docstring).

    tokenizer: the model's CharTokenizer; keywords: one tuple of cleaned keywords per row (or one
    for every row), in the model's script; prompt: the text given (its keywords count as written,
    and it starts the planned form); max_new_tokens: the tokens the poem may take; seed: the draws
    of the planned forms' slots. raises ValueError for a keyword longer than `MAX_FREE_LINE`.
    """

    def __init__(self, tokenizer: CharTokenizer, keywords: Sequence[tuple[str, ...]], prompt: str = "",
                 max_new_tokens: int = 10**9, seed: int = 0):
        if long := [w for row in keywords for w in row if len(w) > MAX_FREE_LINE]:
            raise ValueError(f"the keyword {long[0]} has {len(long[0])} characters, more than a line holds "
                             f"({MAX_FREE_LINE} without form=)")
        self.tok, self.prompt, self.max_new_tokens, self.rng = tokenizer, prompt, max_new_tokens, random.Random(seed)
        self.only = partial(only, tokenizer)
        self.keywords = [tuple(k for k in row if k not in prompt) for row in keywords]
        self.rows: list[KeywordRow] = []
        self.start: int | None = None  # the length of the sequence at the first step
        self.consumed = 0
        self._forms: dict[str, Placement] = {}  # placement per planned form
        ids = plan_ids(tokenizer)
        self._plan_forms = {i: form for form, i in ids.forms.items()} if ids else {}
        V = tokenizer.vocab_size
        self._plan = torch.arange(V) >= tokenizer.plan_start  # (V,) bool: the plan tokens
        self._no_eos = torch.ones(V, dtype=torch.bool)
        self._no_eos[tokenizer.eos_id] = False
        self._no_mark = self._no_eos.clone()
        self._no_mark[[tokenizer.stoi[m] for m in LINE_END if m in tokenizer.stoi]] = False

    def _planned(self, form: str) -> Placement | None:
        """The placement in the template of `form` (None for `<其他>`), one per form."""
        if form not in FORMS:
            return None
        if form not in self._forms:
            self._forms[form] = Placement(form_templates(form), None, None, sum(map(is_hanzi, self.prompt)),
                                          self.rng.randrange(2**31), self.only)
        return self._forms[form]

    def _free_mask(self, row: KeywordRow, last: int, eos_best: bool, left: int) -> torch.Tensor:
        """The row's allowed tokens without a form (module docstring; shared tensors: do not modify);
        last: the row's last token; eos_best: `<eos>` is the model's likeliest; left: tokens still to draw."""
        room = self._room(row)
        starts = tuple(w for w, r in room.items() if r >= 0)
        if eos_best and self.tok.itos[last] in LINE_END[1:] or left <= (len(row.pending) + 1) * (MAX_FREE_LINE + 1) + 1:
            row.overtime = True  # the model would have ended the poem here, or just enough tokens are left
        if row.overtime and any(room[w] == 0 for w in starts):
            return self.only(w[0] for w in starts)  # the last place in this line where one fits: it starts
        if row.overtime and starts:
            return self._no_mark  # no line closes before its keyword
        if row.overtime and row.line_text:
            return self.only(m for m in LINE_END if m in self.tok.stoi)  # no keyword fits any more: the line closes
        return self._no_eos

    @staticmethod
    def _room(row: KeywordRow) -> dict[str, int]:
        """Pending keyword → the characters the row's free line may still take before it must start
        (< 0: it fits no more): it ends before the line's last character (the model's rhyme), in a
        line of the first line's length (5 to 7)."""
        limit = min(max(row.first_len or MAX_FREE_LINE, min(FREE_LENGTHS)), MAX_FREE_LINE)
        return {w: (limit - 1 if len(w) < limit else len(w)) - len(w) - len(row.line_text) for w in row.pending}

    def _planned_mask(self, row: KeywordRow) -> torch.Tensor:
        """The row's allowed tokens while it keeps its planned form: placed as in that form."""
        (k, marked), t = row.at, row.planned.templates[0]
        row.planned.key(row, k, (0,))  # the slot is drawn at the first step it is due, a line's end too
        mask = row.planned.mask(0, k, row, (0,)) if t.expects(k, marked)[0] == "char" else None
        return self._no_eos if mask is None else (mask | self._plan) & self._no_eos  # the rhyme slot may be still to draw

    def _advance(self, row: KeywordRow, c: str) -> None:
        """Move the row past c (drawn or given); a free poem leaves its planned form at the first
        character that breaks it."""
        starts = ()
        if row.at is not None:  # the template's walk (`Template.expects`); None once the poem leaves it
            (k, marked), t = row.at, row.planned.templates[0]
            kind, mark = t.expects(k, marked)
            if kind == "char" and is_hanzi(c):
                starts, row.at = row.planned.starts(0, k, row), (k + 1, False)
            else:
                row.at = (k, True) if kind == "mark" and c == mark and k < t.length else None
            if row.at is not None and row.at[0] == t.length and row.at[1]:
                row.at = None  # the poem kept its form to the end
        else:
            starts = tuple(w for w, r in self._room(row).items() if r >= 0)
        if not is_hanzi(c):
            row.first_len = row.first_len or len(row.line_text) or None
            row.advance(None)
            return
        row.advance(c, starts)

    def __call__(self, idx: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """idx: (B, T) int64, the sequence so far; logits: (B, V) → logits with forbidden tokens -inf."""
        if self.start is None:
            self.start = idx.size(1)
            self.rows = [KeywordRow(frozenset(k), len(k)) for k in (self.keywords * idx.size(0)
                                                                    if len(self.keywords) == 1 else self.keywords)]
        ids = plan_ids(self.tok)
        for row, seq in zip(self.rows, idx[:, self.consumed:].tolist()):
            for i in (seq if self.consumed or ids is None or not ids.segments else ids.body(seq)):
                if i in self._plan_forms:  # a free poem's plan names its form
                    row.planned = self._planned(self._plan_forms[i])
                    row.at = (0, False) if row.planned else None
                elif i not in (self.tok.bos_id, self.tok.eos_id) and not self.tok.is_plan(i):
                    self._advance(row, self.tok.itos[i])
        self.consumed = idx.size(1)
        masks, last, eos_best = {}, idx[:, -1].tolist(), None
        for b, row in enumerate(self.rows):
            if row.open:
                masks[b] = self.only(w[row.written] for w in row.open)
            elif row.pending and row.at is not None:
                masks[b] = self._planned_mask(row)
            elif row.pending:
                if eos_best is None:
                    eos_best = (logits.argmax(dim=-1) == self.tok.eos_id).tolist()  # (B,)
                masks[b] = self._free_mask(row, last[b], eos_best[b], self.max_new_tokens - idx.size(1) + self.start)
        if not masks:
            return logits
        rows = list(masks)
        allowed = torch.stack(list(masks.values())).to(logits.device)  # (rows with a mask, V)
        logits = logits.clone()
        logits[rows] = logits[rows].masked_fill(~allowed, float("-inf"))
        return logits
