"""Keywords every sampled poem contains (`keywords=[明月,故乡]`): a logits processor that
guarantees them and lets the model choose where they go.

A keyword is a run of characters that stands whole, in its order, inside one line (keywords in any
order). The
processor (`KeywordConstraint`, after `PoemConstraint` in the engine's processors) keeps, for
every row, the keywords still to write and the rule that decides each step:

- **started keywords are finished**: when the model draws a keyword's first character at a
  place where the keyword can stand (and the rest can still be placed), the next characters
  are forced, so the keyword is written whole (keywords sharing a first character stay open
  together until the text tells them apart);
- **nothing that makes a keyword impossible**: with a form, a character is allowed only if all
  the keywords not yet written can still be placed in the lines left, character by character
  under the same rules `PoemConstraint` enforces: line lengths, the acrostic's first
  characters, the rhyme slots (a keyword character there must rhyme, in a group every rhyme
  shares, and not repeat a rhyme) and, with `meter`, one tone pattern for the whole poem.
  This is an exact search (`_placeable`: over the positions left, memoised), so a keyword
  is forced only when the poem would otherwise run out of room, and the model picks every
  other place. Two rules shape the room: without `rhyme`, an even line's last character is
  left to the model (which rhymes by itself; a keyword there would break it), and with k
  keywords the lines left are cut into k sections, one more keyword (any) due by the end of
  each (one keyword to each part of the poem, as the planning-based systems give each line
  its keyword);
- **free poems whose plan names a form** (a model with plan tokens draws one first): placed
  as in that form, with the same two rules (the masks do not force the form); from the first
  character that leaves the form, as other free poems (below);
- **other free poems**: a keyword may start where it fits in the line (the first line's
  length, 5 to 7) before the line's last character, which stays the model's (its rhyme),
  and the poem cannot end before every keyword is written; once the model would have ended
  it (`<eos>` its likeliest token), or when the tokens left (`max_new_tokens`) just hold the
  keywords' lines, each further line must take a keyword where it still fits by the line's
  end (a line already too long for one closes).

A keyword already in the prompt counts as written. How the requested ones are cleaned and
checked before sampling: `clean_keywords`, `keyword_rows`, `KeywordConstraint.check`.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

from data.tokenizer import CharTokenizer
from data.verse.meter import LEVEL
from data.verse.plan import plan_ids
from data.verse.poetry import FORMS, LINE_END, is_hanzi
from model.sampling.constraints import FREE_LENGTHS, PoemConstraint, _Row, poem_tokens

MAX_FREE_LINE = max(FREE_LENGTHS)
"""The longest line a keyword may fill without a form (7, as the longest regulated line)."""


SEPARATORS = re.compile(r"[,，、;；\s]+")
"""What separates keywords written in one string: `明月,故乡`, `明月，故乡`, `明月、故乡`."""


def clean_keywords(keywords: Iterable[str]) -> tuple[str, ...]:
    """Keywords as asked → the ones to force: split at SEPARATORS, empty entries and repeats
    dropped, and a keyword inside another dropped (it is written with the longer one); order kept."""
    kept = list(dict.fromkeys(w for k in keywords for w in SEPARATORS.split(str(k)) if w))
    return tuple(k for k in kept if not any(k != other and k in other for other in kept))


def keyword_rows(keywords: str | Sequence, num_samples: int) -> list[tuple[str, ...]]:
    """`SamplingOptions.keywords` → the keywords of each row, cleaned (`clean_keywords`): one
    tuple for every row (a string, or a list of strings), or one per row (a list of
    `num_samples` lists). raises ValueError for a list of lists of another length."""
    if isinstance(keywords, str):
        return [clean_keywords([keywords])]
    keywords = list(keywords)
    if not keywords or all(isinstance(k, str) for k in keywords):
        return [clean_keywords(keywords)]
    if len(keywords) != num_samples or any(isinstance(k, str) for k in keywords):
        raise ValueError(f"keywords per poem need one list for each of the {num_samples} poems, got {len(keywords)}")
    return [clean_keywords(k) for k in keywords]


def write_char(line_text: str, open_: tuple[str, ...], written: int, starts: Iterable[str], pending: Iterable[str],
               c: str) -> tuple[str, tuple[str, ...], int, frozenset[str]]:
    """Character c written in a line (`line_text` before it): the keywords being written (`open_`,
    `written` characters in) narrowed to those c continues, or when none is, those of `starts` c
    begins → (the line's text, the keywords still open, their characters written, the keywords of
    `pending` the line now ends with: written whole, which closes every open one)."""
    line_text += c
    if open_:
        open_, written = tuple(w for w in open_ if w[written] == c), written + 1
    else:
        open_, written = tuple(w for w in starts if w[0] == c), 1
    done = frozenset(w for w in pending if line_text.endswith(w))
    open_ = tuple(w for w in open_ if w not in done and len(w) > written)
    return (line_text, (), 0, done) if done or not open_ else (line_text, open_, written, done)


@dataclass
class _KeywordRow:
    """A row's keywords: still to write; being written (the candidates sharing the `written`
    characters so far); may start at the next position (decided when its mask was made)."""
    pending: tuple[str, ...]
    total: int = 0  # the row's keywords, written or not
    open: tuple[str, ...] = ()
    written: int = 0
    starts: tuple[str, ...] = ()
    line_text: str = ""  # the current line's characters
    first_len: int | None = None  # free poems: the first line's length
    overtime: bool = False  # free poems: the model would have ended the poem
    planned: KeywordConstraint | None = None  # free poems: the placement of the form its plan names
    shape: _Row | None = None  # free poems: where the poem is in that form, while it keeps it
    slot: tuple[int, int] | None = None  # (line, position) drawn for the next keyword
    slot_for: int = -1  # the number of keywords pending when the slot was drawn


class KeywordConstraint:
    """Logits processor forcing every row's keywords into its poem (module docstring).

    tokenizer: the model's CharTokenizer; keywords: one tuple of cleaned keywords per row
    (`clean_keywords`; in the model's script and vocabulary); poem: the `PoemConstraint` of
    the same call (its rows give the line, position, patterns and rhyme of each row; it must
    come before this processor), None for free poems; prompt: the text given after `<bos>`
    (and the plan), whose keywords count as written; max_new_tokens: the tokens the poem may
    take (free poems place their keywords before they run out); seed: the draws of the slots
    (module docstring). Call `check()` before generating.
    """

    def __init__(self, tokenizer: CharTokenizer, keywords: Sequence[tuple[str, ...]],
                 poem: PoemConstraint | None = None, prompt: str = "", max_new_tokens: int = 10**9, seed: int = 0):
        self.tok, self.poem, self.prompt, self.max_new_tokens = tokenizer, poem, prompt, max_new_tokens
        self.rng = random.Random(seed)
        self.start: int | None = None  # the length of the sequence at the first step
        self.after_prompt = _Row()  # where the prompt leaves a poem (with a form or acrostic)
        for c in prompt if poem is not None else "":
            poem._advance(self.after_prompt, c)
        self.first_line = self.after_prompt.line  # keyword sections start at the first line left to write
        self.keywords = [tuple(k for k in row if k not in prompt) for row in keywords]
        self.rows: list[_KeywordRow] = []
        self.consumed = 0
        self._memo: dict[tuple, bool] = {}  # _placeable's answers
        self._masks: dict[tuple, tuple[torch.Tensor | None, tuple[str, ...]]] = {}  # _form_mask's, by state
        self._chars: dict[tuple[str, ...], tuple[frozenset[str], frozenset[str]]] = {}
        self._forms: dict[str, KeywordConstraint] = {}  # free poems: placement per planned form
        ids = plan_ids(tokenizer)
        self._plan_forms = {i: form for form, i in ids.forms.items()} if ids else {}
        self._all = torch.ones(tokenizer.vocab_size, dtype=torch.bool)
        self._plan = torch.arange(tokenizer.vocab_size) >= tokenizer.plan_start  # (V,) bool: the plan tokens
        self._no_eos = self._all.clone()
        self._no_eos[tokenizer.eos_id] = False
        self._no_mark = self._no_eos.clone()
        self._no_mark[[tokenizer.stoi[m] for m in LINE_END if m in tokenizer.stoi]] = False

    # --- the shape of the poem, as PoemConstraint sees it --------------------------------------

    def _n_chars(self, row: _Row) -> int:
        """The line length to place keywords in (an acrostic without form: 5 until a line says 7)."""
        return row.n_chars or self.poem.n_chars or (max(FREE_LENGTHS) if row.pos > min(FREE_LENGTHS) else min(FREE_LENGTHS))

    def _rhyme_slot(self, line: int, pos: int, n: int, pattern: str | None) -> bool:
        """Whether a character at (line, pos) must rhyme: an even line's end with `rhyme`; the
        first line's end under a pattern whose first line rhymes (首句入韵, `meter`)."""
        if not self.poem.rhyme or pos != n - 1:
            return False
        return line % 2 == 1 or (pattern is not None and line == 0 and self.poem.patterns[pattern][0][-1] == LEVEL)

    def _fits(self, word: str, line: int, start: int, n: int, pattern: str | None, groups: frozenset[str],
              used: frozenset[str]) -> tuple[frozenset[str], frozenset[str]] | None:
        """(rhyme groups, rhymes used) after writing `word` from (line, start) under `pattern`, or
        None if a character breaks the acrostic, the pattern's tone or a rhyme slot (without
        `rhyme`, an even line's last character is left to the model, which rhymes by itself)."""
        poem = self.poem
        for j, c in enumerate(word):
            pos = start + j
            if pos == 0 and poem.acrostic and c != poem.acrostic[line]:
                return None
            if pattern is not None and poem.patterns[pattern][line][pos] not in poem.tones.get(c, ()):
                return None
            if not poem.rhyme and line % 2 == 1 and pos == n - 1:
                return None  # an even line's last character: the model's own rhyme
            if self._rhyme_slot(line, pos, n, pattern):
                groups = groups & poem.groups.get(c, frozenset())
                if c in used or not groups:
                    return None
                used = used | {c}
        return groups, used

    def _placeable(self, n: int, pattern: str | None, line: int, pos: int, words: frozenset[str],
                   groups: frozenset[str], used: frozenset[str], total: int) -> bool:
        """Whether `words` can all be written, whole and apart, in the lines from (line, pos) on,
        under one tone pattern (None without meter), rhyming in `groups` without repeating `used`,
        each of the row's `total` keywords by the end of its section (`_behind`)."""
        if not words:
            return True
        if pos + min(map(len, words)) > n:
            line, pos = line + 1, 0
        room = (n - pos) + (self.poem.n_lines - line - 1) * n
        if line >= self.poem.n_lines or sum(map(len, words)) > room or (pos == 0 and self._behind(line, words, total)):
            return False
        key = (n, pattern, line, pos, words, groups, used, total)
        if key not in self._memo:
            self._memo[key] = any(
                (after := self._fits(w, line, pos, n, pattern, groups, used)) is not None
                and self._placeable(n, pattern, line, pos + len(w), words - {w}, *after, total)
                for w in words if pos + len(w) <= n
            ) or self._placeable(n, pattern, line, pos + 1, words, groups, used, total)
        return self._memo[key]

    def _behind(self, line: int, words: frozenset[str], total: int) -> bool:
        """Whether a row starting `line` with `words` of its `total` keywords unwritten is behind:
        the lines after the prompt are cut into `total` sections, and the k-th keyword is written
        by the end of the k-th (one keyword per part of the poem, as planning-based systems give
        each line its keyword)."""
        first, n_lines = self.first_line, self.poem.n_lines
        return line > first and total - len(words) < (line - first) * total // (n_lines - first)

    def _state(self, row: _Row) -> tuple[int, frozenset[str], frozenset[str], frozenset[str]]:
        """(line length, the row's tone patterns, rhyme groups, rhymes used) for the search."""
        poem = self.poem
        patterns = poem._row_patterns(row) if poem.meter else frozenset({None})
        groups = row.groups if row.groups is not None else frozenset(poem.open_groups)
        return self._n_chars(row), patterns, groups, frozenset(row.rhymes)

    def placeable(self, row: _Row, words: Iterable[str], total: int | None = None) -> bool:
        """Whether `words` (of a row's `total` keywords, default all) can all still be written in a
        poem at PoemConstraint row `row`."""
        n, patterns, groups, used = self._state(row)
        words = frozenset(words)
        return any(self._placeable(n, p, row.line, row.pos, words, groups, used, total or len(words)) for p in patterns)

    # --- the masks -----------------------------------------------------------------------------

    def _form_mask(self, krow: _KeywordRow, row: _Row) -> torch.Tensor | None:
        """(V,) bool of what keeps every keyword placeable at this step, None = no restriction
        (shared tensors: do not modify); sets the row's `starts`. Rows in the same state share one."""
        n, patterns, groups, used = self._state(row)
        chars, rhymes = self._keyword_chars(krow.pending)
        if not row.plan_left and not any(self._rhyme_slot(row.line, row.pos, n, p) for p in patterns):
            groups = groups & rhymes  # the same answers: only keyword characters' groups are ever looked up
        state = (row.line, row.pos, row.plan_left, row.ended, n, patterns, groups, used & chars, krow.pending, krow.total)
        if state not in self._masks:
            self._masks[state] = self._mask_of(krow, row, *state[4:8])
        mask, krow.starts = self._masks[state]
        return mask

    def _at_slot(self, krow: _KeywordRow, row: _Row, mask: torch.Tensor | None) -> torch.Tensor | None:
        """`mask`, or only the first characters of the keywords that may start here when the row
        is at the slot drawn for its next keyword (module docstring; drawn when it is due)."""
        if krow.slot_for != len(krow.pending):
            krow.slot, krow.slot_for = self._draw_slot(krow, row), len(krow.pending)
        if krow.starts and krow.slot == (row.line, row.pos):
            return self._only(w[0] for w in krow.starts) | self._plan  # a free poem may be still in its plan
        return mask

    def _draw_slot(self, krow: _KeywordRow, row: _Row) -> tuple[int, int] | None:
        """A (line, position) for the row's next keyword: a line of its section from the row's
        place on, then the line's head (half the time) or another even position where the
        shortest pending keyword leaves the line's last character free. None: no such slot."""
        n, n_lines, first = self._n_chars(row), self.poem.n_lines, self.first_line
        due, shortest = krow.total - len(krow.pending), min(map(len, krow.pending))
        lines = [line for line in range(max(row.line, first), n_lines)
                 if (line - first) * krow.total // (n_lines - first) == due]
        places = {line: [p for p in range(0, n - shortest, 2) if line > row.line or p >= row.pos] for line in lines}
        lines = [line for line in lines if places[line]]
        if not lines:
            return None
        line = self.rng.choice(lines)
        head, rest = places[line][0] == 0, places[line][1:] if places[line][0] == 0 else places[line]
        return line, 0 if head and (not rest or self.rng.random() < 0.5) else self.rng.choice(rest)

    def _keyword_chars(self, pending: tuple[str, ...]) -> tuple[frozenset[str], frozenset[str]]:
        """(the characters of these keywords, the rhyme groups any of them is in)."""
        if pending not in self._chars:
            chars = frozenset("".join(pending))
            self._chars[pending] = chars, frozenset().union(*(self.poem.groups.get(c, frozenset()) for c in chars))
        return self._chars[pending]

    def _mask_of(self, krow: _KeywordRow, row: _Row, n: int, patterns: frozenset, groups: frozenset[str],
                 used: frozenset[str]) -> tuple[torch.Tensor | None, tuple[str, ...]]:
        """(`_form_mask`'s mask, the keywords that may start here) for a row in this state."""
        poem, words, total = self.poem, frozenset(krow.pending), krow.total
        if row.plan_left:  # a plan's rhyme token fixes the group: only groups the keywords can rhyme in
            allowed = self._all.clone()
            for g, i in (poem.plan.rhymes.items() if poem.rhyme else ()):
                allowed[i] = g in groups and any(self._placeable(n, p, 0, 0, words, frozenset({g}), used, total)
                                                 for p in patterns)
            return allowed, ()
        if row.ended or row.pos >= n:
            return None, ()
        starts = tuple(w for w in krow.pending if row.pos + len(w) <= n and any(
            (after := self._fits(w, row.line, row.pos, n, p, groups, used)) is not None
            and self._placeable(n, p, row.line, row.pos + len(w), words - {w}, *after, total) for p in patterns))
        fillers, all_ok = [], True  # the characters that may stand here without starting a keyword
        for mask, kept, gs in self._filler_classes(row, n, patterns, groups, krow.pending):
            if any(self._placeable(n, p, row.line, row.pos + 1, words, gs, used, total) for p in kept):
                fillers.append(mask)
            else:
                all_ok = False
        if all_ok:
            return None, starts
        allowed = torch.stack(fillers).any(0) if fillers else torch.zeros_like(self._all)
        allowed[[self.tok.stoi[w[0]] for w in starts]] = True
        return allowed, starts

    def _filler_classes(self, row: _Row, n: int, patterns: frozenset, groups: frozenset[str],
                        pending: tuple[str, ...]) -> list[tuple[torch.Tensor, frozenset, frozenset[str]]]:
        """The kinds of character that may stand at the row's position without a keyword, each
        as (its characters (V,) bool, the patterns kept after one, the rhyme groups after one).
        A rhyme here is never a character of a pending keyword (it could not rhyme again)."""
        poem, line, pos = self.poem, row.line, row.pos
        tones = {poem.patterns[p][line][pos] for p in patterns} if poem.meter else {None}
        classes = []
        for tone in tones:
            kept = frozenset(p for p in patterns if tone is None or poem.patterns[p][line][pos] == tone)
            mask = self._all if tone is None else poem.tone_masks[tone]
            if rhyming := frozenset(p for p in kept if self._rhyme_slot(line, pos, n, p)):
                mask = mask.clone()
                mask[[self.tok.stoi[c] for w in pending for c in w]] = False
                classes += [(mask & poem.group_masks[g], rhyming, frozenset({g})) for g in sorted(groups)]
            if kept - rhyming:
                classes.append((mask, kept - rhyming, groups))
        return classes

    def _free_mask(self, krow: _KeywordRow, last: int, eos_best: bool, left: int) -> torch.Tensor:
        """Free poems: the row's allowed tokens (module docstring; shared tensors: do not modify);
        last: the row's last token; eos_best: `<eos>` is the model's likeliest next token; left:
        tokens still to draw."""
        pos = len(krow.line_text)
        limit = min(max(krow.first_len or MAX_FREE_LINE, min(FREE_LENGTHS)), MAX_FREE_LINE)  # the line length
        end = {w: limit - 1 if len(w) < limit else len(w) for w in krow.pending}  # the last character is the model's
        krow.starts = starts = tuple(w for w in krow.pending if pos + len(w) <= end[w])
        if eos_best and self.tok.itos[last] in LINE_END[1:]:
            krow.overtime = True  # the model would have ended the poem here
        if left <= (len(krow.pending) + 1) * (MAX_FREE_LINE + 1) + 1:
            krow.overtime = True  # just enough tokens left for a line per keyword
        if krow.overtime and any(pos + len(w) >= end[w] for w in starts):
            return self._only(w[0] for w in starts)  # the last place in this line where one fits: it starts
        if krow.overtime and starts:
            return self._no_mark  # no line closes before its keyword
        if krow.overtime and pos:
            return self._only(m for m in LINE_END if m in self.tok.stoi)  # no keyword fits any more: the line closes
        return self._no_eos

    def _only(self, chars: Iterable[str]) -> torch.Tensor:
        """(V,) bool: only these characters."""
        allowed = torch.zeros_like(self._all)
        allowed[[self.tok.stoi[c] for c in chars]] = True
        return allowed

    def __call__(self, idx: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """idx: (B, T) int64, the sequence so far; logits: (B, V) → logits with forbidden tokens -inf."""
        if self.start is None:
            self.start = idx.size(1)
        if not self.rows:
            self.rows = [_KeywordRow(k, len(k)) for k in (self.keywords * idx.size(0) if len(self.keywords) == 1
                                                  else self.keywords)]
        for krow, ids in zip(self.rows, poem_tokens(idx, self.consumed, plan_ids(self.tok))):
            for i in ids:
                if i in self._plan_forms and self.poem is None:  # a free poem's plan names its form
                    krow.planned = self._planned(self._plan_forms[i])
                    krow.shape = _Row() if krow.planned else None
                elif i not in (self.tok.bos_id, self.tok.eos_id) and not self.tok.is_plan(i):
                    self._advance(krow, self.tok.itos[i])
        self.consumed = idx.size(1)
        masks, last, eos_best = {}, idx[:, -1].tolist(), None
        for b, krow in enumerate(self.rows):
            if krow.open:
                masks[b] = self._only(w[krow.written] for w in krow.open)
            elif krow.pending and self.poem is not None:
                masks[b] = self._at_slot(krow, self.poem.rows[b], self._form_mask(krow, self.poem.rows[b]))
            elif krow.pending and krow.shape is not None:  # free, to its plan's form: placed as in that form
                mask = krow.planned._at_slot(krow, krow.shape, krow.planned._form_mask(krow, krow.shape))
                masks[b] = self._no_eos if mask is None else mask & self._no_eos
            elif krow.pending:
                if eos_best is None:
                    eos_best = (logits.argmax(dim=-1) == self.tok.eos_id).tolist()  # (B,)
                masks[b] = self._free_mask(krow, last[b], eos_best[b], self.max_new_tokens - idx.size(1) + self.start)
        masks = {b: m for b, m in masks.items() if m is not None}
        if not masks:
            return logits
        rows = list(masks)
        allowed = torch.stack(list(masks.values())).to(logits.device)  # (rows with a mask, V)
        logits = logits.clone()
        logits[rows] = logits[rows].masked_fill(~allowed, float("-inf"))
        return logits

    def _planned(self, form: str) -> KeywordConstraint | None:
        """The keyword placement of a poem of `form` without other controls (for a free poem whose
        plan token names the form; None for `<其他>`), one per form."""
        if form not in FORMS:
            return None
        if form not in self._forms:
            self._forms[form] = KeywordConstraint(self.tok, [], PoemConstraint(self.tok, form), self.prompt,
                                                  seed=self.rng.randrange(2**31))
        return self._forms[form]

    def _advance(self, krow: _KeywordRow, c: str) -> None:
        """Move the row past character c (drawn or given); a free poem leaves its plan's form (and
        is placed as free) at the first character that breaks it."""
        if krow.shape is not None and (krow.planned.poem._advance(krow.shape, c) or krow.shape.ended):
            krow.shape = None
        if not is_hanzi(c):
            krow.first_len = krow.first_len or len(krow.line_text) or None
            krow.line_text, krow.open, krow.starts = "", (), ()
            return
        krow.line_text, krow.open, krow.written, done = write_char(krow.line_text, krow.open, krow.written,
                                                                   krow.starts, krow.pending, c)
        krow.starts = ()
        krow.pending = tuple(w for w in krow.pending if w not in done)

    def check(self) -> None:
        """raises ValueError if some row's keywords cannot all be placed (module docstring): a
        keyword longer than a line, more keyword characters than the poem holds, a keyword whose
        平仄 fits no position of the form's patterns (meter), one that clashes with the
        acrostic, or no joint placement of them."""
        for keywords in self.keywords:
            if keywords:
                self._check_row(keywords)

    def _check_row(self, keywords: tuple[str, ...]) -> None:
        if self.poem is None:
            if long := [w for w in keywords if len(w) > MAX_FREE_LINE]:
                raise ValueError(f"the keyword {long[0]} has {len(long[0])} characters, more than a line holds "
                                 f"({MAX_FREE_LINE} without form=)")
            return
        poem = self.poem
        n = poem.n_chars or min(FREE_LENGTHS)
        what = f"a {poem.form}" if poem.form else f"an acrostic of {n}-character lines (form= gives 7)"
        if long := [w for w in keywords if len(w) > n]:
            raise ValueError(f"the keyword {long[0]} has {len(long[0])} characters, more than a line of {what} holds")
        if (total := sum(map(len, keywords))) > poem.n_lines * n:
            raise ValueError(f"the keywords {'、'.join(keywords)} have {total} characters, more than {what} holds "
                             f"({poem.n_lines} × {n})")
        for w in keywords:
            places = [(line, s) for line in range(poem.n_lines) for s in range(n - len(w) + 1)
                      if s or not poem.acrostic or w[0] == poem.acrostic[line]]
            if not places:
                raise ValueError(f"the keyword {w} clashes with the acrostic {poem.acrostic}: it fills a line from "
                                 "its first character, which the acrostic fixes")
            if poem.meter and not any(all(poem.patterns[p][line][s + j] in poem.tones.get(c, ()) for j, c in enumerate(w))
                                      for p in poem.patterns for line, s in places):
                tones = "".join("/".join(sorted(poem.tones.get(c, ()))) or "?" for c in w)
                raise ValueError(f"the keyword {w} ({tones}) fits no position of the {poem.form}'s tone patterns "
                                 "(meter=true)")
        if not self.placeable(self.after_prompt, keywords):
            rules = ["a rhyme in one group at each even line's end" if poem.rhyme else
                     "each even line's last character left to the model's own rhyme",
                     *(["the tone patterns"] * poem.meter), *(["the acrostic"] * bool(poem.acrostic)),
                     *(["the prompt"] * bool(self.prompt)),
                     *(["one keyword to each part of the poem"] * (len(keywords) > 1))]
            said = (f"the keywords {'、'.join(keywords)} cannot all" if len(keywords) > 1
                    else f"the keyword {keywords[0]} cannot")
            raise ValueError(f"{said} be placed in {what} with {', '.join(rules)}")
