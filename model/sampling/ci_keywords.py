"""Keywords in a 词 (`keywords=[明月,故乡] tune=水调歌头`): the placement rules of
`model.sampling.keywords`, on a tune's templates, for `model.sampling.tunes.TuneConstraint`.

A keyword stands whole, in its order, inside one line of the template, never on a line's
rhyming last character (the model's, or the rhyme mask's), on positions whose 平/仄 it fits
with `meter`, and with an acrostic its first character is the acrostic's where it starts a
line. Per template the processor keeps every keyword placeable (`placeable`: an exact search
over the positions left, memoised): a character is allowed only if the keywords still to write
fit in what follows, started keywords are finished, the lines after the prompt are cut into as
many sections as the row has keywords and the k-th is written by the end of the k-th section,
and each keyword gets a drawn **slot** (a line of its section; its head half the time, else an
even position that leaves the line's last character free), where only the keywords that can
start there are allowed. The model chooses every other place, and may write a keyword earlier.
"""
from __future__ import annotations

import random
from bisect import bisect_right
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

from data.verse.tunes import EITHER
from model.sampling.keywords import write_char


@dataclass
class KeywordRow:
    """One row's keywords: still to write (of `total`); being written (the candidates sharing the
    `written` characters so far); the current line's characters; the drawn slot (a body index)
    of the next keyword, drawn when `slot_for` keywords were pending."""
    pending: frozenset[str]
    total: int
    open: tuple[str, ...] = ()
    written: int = 0
    line_text: str = ""
    slot: int | None = None
    slot_for: int = -1


class TuneKeywords:
    """The keyword rules of a `TuneConstraint` (module docstring).

    templates: the constraint's templates (each with `length`, `starts` (line starts), `tones`
    (平/仄/中 per position) and `rhyme_at` (rhyming positions)); tones: character → its tones;
    first: the body index after the prompt (the keyword sections start at its line); seed: the
    slots' draws; only: characters → (V,) bool of just them.
    """

    def __init__(self, templates: Sequence, tones: dict[str, frozenset[str]], meter: bool, acrostic: str,
                 first: int, seed: int, only):
        self.templates, self.tones, self.meter, self.acrostic = templates, tones, meter, acrostic
        self.first, self.only, self.rng = first, only, random.Random(seed)
        self._memo: dict[tuple, bool] = {}  # placeable's answers
        self._fits: dict[tuple, bool] = {}
        self._starts: dict[tuple, tuple[str, ...]] = {}

    def _line(self, i: int, k: int) -> tuple[int, int, int]:
        """(line, its first body index, its end) of position k in template i."""
        t = self.templates[i]
        line = bisect_right(t.starts, k) - 1
        return line, t.starts[line], t.starts[line + 1] if line + 1 < len(t.starts) else t.length

    def fits(self, i: int, k: int, w: str) -> bool:
        """Whether keyword w can stand from body index k of template i (module docstring)."""
        key = (i, k, w)
        if key not in self._fits:
            self._fits[key] = self._fits_at(i, k, w)
        return self._fits[key]

    def _fits_at(self, i: int, k: int, w: str) -> bool:
        t = self.templates[i]
        line, start, end = self._line(i, k)
        if k + len(w) > end or any(k + j in t.rhyme_at for j in range(len(w))):
            return False
        if self.acrostic and k == start and w[0] != self.acrostic[line]:
            return False
        return not self.meter or self.tones_fit(i, k, w)

    def tones_fit(self, i: int, k: int, w: str) -> bool:
        """Whether w's characters have the 平/仄 of template i's positions from body index k (中:
        either; a polyphonic character fits either)."""
        tones = self.templates[i].tones[k:k + len(w)]
        return len(tones) == len(w) and all(t == EITHER or t in self.tones.get(c, ()) for t, c in zip(tones, w))

    def _behind(self, i: int, line: int, words: frozenset[str], total: int) -> bool:
        """Whether a row starting `line` of template i with `words` of `total` unwritten is behind
        its sections (module docstring)."""
        first, n_lines = self._line(i, self.first)[0], len(self.templates[i].starts)
        return line > first and total - len(words) < (line - first) * total // (n_lines - first)

    def placeable(self, i: int, k: int, words: frozenset[str], total: int) -> bool:
        """Whether `words` can all be written, whole and apart, from body index k of template i on,
        each of the row's `total` keywords by the end of its section."""
        t = self.templates[i]
        if not words:
            return True
        if sum(map(len, words)) > t.length - k:
            return False
        line, start, _ = self._line(i, k)
        if k == start and self._behind(i, line, words, total):
            return False
        key = (i, k, words, total)
        if key not in self._memo:
            self._memo[key] = any(self.fits(i, k, w) and self.placeable(i, k + len(w), words - {w}, total)
                                  for w in words) or self.placeable(i, k + 1, words, total)
        return self._memo[key]

    def starts(self, i: int, k: int, row: KeywordRow) -> tuple[str, ...]:
        """The pending keywords that may start at body index k of template i (memoised)."""
        key = (i, k, row.pending, row.total)
        if key not in self._starts:
            self._starts[key] = tuple(w for w in sorted(row.pending) if self.fits(i, k, w) and
                                      self.placeable(i, k + len(w), row.pending - {w}, row.total))
        return self._starts[key]

    def key(self, row: KeywordRow, k: int, live: Iterable[int]) -> tuple:
        """What the masks of a row at body index k depend on (for the constraint's mask cache);
        draws the slot of its next keyword when one is due (in the commonest live template)."""
        if row.pending and row.slot_for != len(row.pending):
            row.slot, row.slot_for = self._draw_slot(min(live), k, row), len(row.pending)
        return row.pending, row.total, row.open, row.written, row.slot == k

    def allowed(self, i: int, k: int, row: KeywordRow, live: Iterable[int]) -> set[str] | None:
        """The characters template i allows at body index k for the row's keywords (`key` called
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
        """A body index for the row's next keyword in template i (module docstring), None if none."""
        t, shortest = self.templates[i], min(map(len, row.pending))
        first, n_lines = self._line(i, self.first)[0], len(t.starts)
        due, places = row.total - len(row.pending), {}
        for line in range(self._line(i, k)[0], n_lines):
            if (line - first) * row.total // (n_lines - first) == due:
                end = t.starts[line + 1] if line + 1 < n_lines else t.length
                if found := [p for p in range(t.starts[line], end - shortest, 2) if p >= k]:
                    places[line] = found
        if not places:
            return None
        line = self.rng.choice(sorted(places))
        head, rest = places[line][0] == t.starts[line], places[line][1:]
        return places[line][0] if head and (not rest or self.rng.random() < 0.5) else self.rng.choice(
            rest if head else places[line])

    @staticmethod
    def advance(row: KeywordRow, c: str | None, starts: Iterable[str] = ()) -> None:
        """Move the row past c: a character (`starts`: the keywords that could start where it
        stands; c opens those it begins), or None for a line's closing mark."""
        if c is None:
            row.line_text, row.open, row.written = "", (), 0
            return
        row.line_text, row.open, row.written, done = write_char(row.line_text, row.open, row.written, starts,
                                                                row.pending, c)
        row.pending -= done
