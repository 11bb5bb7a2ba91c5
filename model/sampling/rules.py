"""The kinds of rule a template (`data.verse.templates.Template`) gives a poem, one class each, for
`model.sampling.shape.TemplateConstraint`; a rule knows templates, positions and characters,
nothing of 诗 or 词: `Tones` (`meter`: the 平 or 仄 a position fixes), `Acrostic` (a line's first
character), `Rhyme` (`rhyme`: a segment's rhyme positions in one class of its book and tone, not
repeating, a bound segment in its partner's 部; a plan's rhyme token fixes the first segment's).

For template i at a row's position a rule gives `mask` ((V,) bool, None: anything), `why_not` (why
character c may not stand, None if it may) and `key` (what its mask depends on beyond the position
and the live templates: the masks' cache); `advance` moves the row past an allowed character,
`close` past a line's mark, which `may_close` allows. The keywords are a rule too
(`model.sampling.keywords.Keywords`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Hashable, Iterable, Sequence

import torch

from data.tokenizer import CharTokenizer
from data.verse.meter import LEVEL, OBLIQUE, tones
from data.verse.plan import PlanIds
from data.verse.poetry import is_hanzi
from data.verse.templates import Book, Template
from data.verse.tunes import EITHER


@lru_cache(maxsize=8)
def vocabulary_tables(tok: CharTokenizer, script: str) -> tuple:
    """(hanzi (V,) bool, character → its tones, tone → (V,) bool) of a vocabulary read in `script`:
    built once per tokenizer (shared tensors: do not modify)."""
    hanzi = torch.tensor([is_hanzi(c) for c in tok.itos])  # (V,) bool
    char_tones = tones([c for c in tok.itos if is_hanzi(c)], script)
    tone_masks = {t: torch.tensor([t in char_tones.get(c, ()) for c in tok.itos]) for t in (LEVEL, OBLIQUE)}
    return hanzi, char_tones, tone_masks


@lru_cache(maxsize=16)
def book_tables(tok: CharTokenizer, script: str, book: Book) -> tuple[dict, dict]:
    """(character → its classes, class → (V,) bool) of a rhyme book over a vocabulary (`Book.classes`;
    shared tensors: do not modify)."""
    classes = book.classes((c for c in tok.itos if is_hanzi(c)), script)
    masks: dict[Hashable, torch.Tensor] = {}
    for c, ks in classes.items():
        for k in ks:
            masks.setdefault(k, torch.zeros(tok.vocab_size, dtype=torch.bool))[tok.stoi[c]] = True
    return classes, masks


def where(t: Template, k: int) -> str:
    """Position k of a template in words: `line 2 character 3`."""
    line = t.line_of(k)
    return f"line {line + 1} character {k - t.starts[line] + 1}"


def only(tok: CharTokenizer, chars: Iterable[str]) -> torch.Tensor:
    """(V,) bool: these characters of the vocabulary only."""
    allowed = torch.zeros(tok.vocab_size, dtype=torch.bool)
    allowed[[tok.stoi[c] for c in chars]] = True
    return allowed


@dataclass
class Row:
    """Where one poem is: characters so far (marks not counted), whether the mark after them is
    written, the templates it still fits, the classes each rhyme segment still shares (None: no
    rhyme yet), the rhyme characters used; its plan slots still open; its keywords
    (`model.sampling.keywords.KeywordRow`)."""
    k: int = 0
    marked: bool = False
    live: frozenset[int] = frozenset()
    rhyme: tuple = ()
    used: frozenset[str] = frozenset()
    ended: bool = False
    plan_left: int = 0
    kw: object = None


class Rule:
    """A kind of rule (module docstring); the defaults allow everything."""

    def key(self, row: Row) -> Hashable:
        return None

    def mask(self, i: int, row: Row) -> torch.Tensor | None:
        return None

    def why_not(self, i: int, row: Row, c: str) -> str | None:
        return None

    def advance(self, row: Row, c: str, live: frozenset[int]) -> None:
        pass

    def may_close(self, row: Row, end: bool) -> bool:
        """Whether the row's line (end: the poem) may close at its position."""
        return True

    def close(self, row: Row) -> None:
        pass


class Tones(Rule):
    """`meter`: the template's 平/仄 at every position it fixes."""

    def __init__(self, templates: Sequence[Template], char_tones: dict, tone_masks: dict):
        self.templates, self.tones, self.tone_masks = templates, char_tones, tone_masks

    def fits(self, i: int, k: int, word: str) -> bool:
        """Whether `word`'s characters have template i's tones from position k on."""
        tones_ = self.templates[i].tones[k:k + len(word)]
        return len(tones_) == len(word) and all(t == EITHER or t in self.tones.get(c, ()) for t, c in zip(tones_, word))

    def mask(self, i: int, row: Row) -> torch.Tensor | None:
        tone = self.templates[i].tones[row.k]
        return None if tone == EITHER else self.tone_masks[tone]

    def why_not(self, i: int, row: Row, c: str) -> str | None:
        return None if self.fits(i, row.k, c) else \
            f"{where(self.templates[i], row.k)} must be {self.templates[i].tones[row.k]} (meter)"


class Acrostic(Rule):
    """Line j starts with the acrostic's j-th character."""

    def __init__(self, templates: Sequence[Template], acrostic: str, only):
        self.templates, self.acrostic, self.only = templates, acrostic, only

    def at(self, i: int, k: int) -> str | None:
        """The acrostic's character at position k of template i, or None (not a line's start)."""
        t = self.templates[i]
        return self.acrostic[t.starts.index(k)] if k in t.starts else None

    def mask(self, i: int, row: Row) -> torch.Tensor | None:
        c = self.at(i, row.k)
        return None if c is None else self.only(c)

    def why_not(self, i: int, row: Row, c: str) -> str | None:
        want = self.at(i, row.k)
        return None if want in (None, c) else f"line {self.templates[i].line_of(row.k) + 1} starts with {want} (acrostic)"


@dataclass
class Rhyme(Rule):
    """`rhyme`: each segment's rhyme positions in one class of the template's book (module docstring).
    open: tone → the classes a first rhyme may pick; classes: character → its classes; masks: class
    → (V,) bool; plan: class → the id of its plan token, for those a plan may name."""
    templates: Sequence[Template]
    classes: dict
    masks: dict
    open: dict[str, frozenset]
    plan: dict = field(default_factory=dict)
    _unions: dict = field(default_factory=dict)

    def allowed(self, i: int, row: Row, s: int) -> frozenset:
        """The classes segment s of template i may rhyme in, in this row: a bound pair (叶韵) in one
        部, the first of them picking only a 部 where the other has a class open too."""
        t = self.templates[i]
        have = row.rhyme[s] if row.rhyme[s] is not None else self.open[t.segments[s]]
        for a, b in enumerate(t.bound):
            other = b if a == s else a if b == s else None
            if other is not None:  # 叶韵: the 部 of the segment it is bound to, or one it can have
                there = row.rhyme[other] if row.rhyme[other] is not None else self.open[t.segments[other]]
                have = frozenset(k for k in have if (k[0], t.segments[other]) in there)
        return have

    def due(self, i: int, row: Row) -> int | None:
        """The segment template i rhymes at the row's position, or None."""
        return self.templates[i].rhyme_at.get(row.k)

    def key(self, row: Row) -> Hashable:
        return tuple((i, self.allowed(i, row, s)) for i in sorted(row.live) if (s := self.due(i, row)) is not None)

    def mask(self, i: int, row: Row) -> torch.Tensor | None:
        if (s := self.due(i, row)) is None:
            return None
        have = self.allowed(i, row, s)
        if have not in self._unions:
            self._unions[have] = torch.stack([self.masks[k] for k in have]).any(0) if have else \
                torch.zeros_like(next(iter(self.masks.values())))
        return self._unions[have]

    def why_not(self, i: int, row: Row, c: str) -> str | None:
        if (s := self.due(i, row)) is None or self.classes.get(c, frozenset()) & self.allowed(i, row, s):
            return None
        tone = self.templates[i].segments[s]
        return f"{where(self.templates[i], row.k)} rhymes: a {'level' if tone == LEVEL else 'oblique'}-tone rhyme " \
            f"({tone}韵{', in the rhyme so far' if row.rhyme[s] is not None else ''})"

    def advance(self, row: Row, c: str, live: frozenset[int]) -> None:
        for i in sorted(live):
            if (s := self.due(i, row)) is not None and (have := self.classes.get(c, frozenset()) & self.allowed(i, row, s)):
                row.rhyme = row.rhyme[:s] + (have,) + row.rhyme[s + 1:]
                row.used = row.used | {c}

    def repeats(self, row: Row) -> frozenset[str]:
        """The characters the row has rhymed with, where a rhyme is due at its position (banned while
        others are left), else none."""
        due = not row.ended and any(self.due(i, row) is not None for i in row.live)
        return row.used if due else frozenset()

    def plan_class(self, row: Row, token: int) -> None:
        """A plan's rhyme token: the class it names, where the row's first segment can rhyme in it."""
        cls = next((k for k, j in self.plan.items() if j == token), None)
        if cls is not None and row.rhyme and row.rhyme[0] is None and any(
                self.templates[i].segments and cls in self.open[self.templates[i].segments[0]] for i in row.live):
            row.rhyme = (frozenset({cls}), *row.rhyme[1:])


def rhyme_rule(tok: CharTokenizer, script: str, templates: Sequence[Template], plan: PlanIds | None) -> Rhyme:
    """The `Rhyme` of templates that share one rhyme book. raises ValueError, in one line, if no
    class of a segment's tone has a character in the vocabulary for each rhyme position."""
    book = templates[0].book
    classes, masks = book_tables(tok, script, book)
    need = max(max(t.sizes) for t in templates)
    open_ = {tone: frozenset(k for k, m in masks.items() if book.tone(k) == tone and m.sum() >= need) for tone in "平仄"}
    if not all(open_[tone] for t in templates for tone in t.segments):
        names = "、".join(dict.fromkeys(t.name for t in templates)) or "the acrostic"
        raise ValueError(f"no {book.what} has {need} characters of the tone {names} rhymes in, in this vocabulary")
    return Rhyme(templates, classes, masks, open_, dict(book.plan_rhymes(plan)))

