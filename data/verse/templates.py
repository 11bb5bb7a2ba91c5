"""Templates: one type for the shape, tones and rhymes of every poem the sampler keeps, a regulated
诗 (`VERSE_FORMS`) or a 词 to a tune (`data.verse.tunes`), after SongNet's template language
(Li et al. 2020, "Rigid Formats Controlled Text Generation").

A template is a list of lines, each with its length and closing mark; one tone per character
position (平, 仄, or 中: either); per line, the rhyme segment its last character rhymes in (or
none); per segment, its tone and the rhyme book whose classes it rhymes in (平水韵's level-tone
groups for a 诗, 词林正韵's classes for a 词), and the segment whose 部 it must share where the
poets bind them (叶韵: 西江月 rhymes its 仄 lines in its 平 rhyme's 部); the stanza break.

- A form without meter is one template: lines of its length, marks `，。` in turn and `。` last,
  the even lines rhyming (one 平 segment), every tone 中.
- With meter, a form is four templates, its standard patterns (`data.verse.meter.patterns`):
  the same lines, every position 平 or 仄, the first line rhyming in the patterns whose first
  line ends 平 (首句入韵).
- An acrostic without a form is two templates, every line of 5 or of 7 characters.
- A tune is one template per variant (又一体) of `data.verse.tunes`.

Nothing here is written out by hand but `VERSE_FORMS`: adding a regulated form is one entry there.
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from functools import cached_property
from typing import Iterable, Sequence

from data.verse.ci import CI, parse_shape, rhyme_classes
from data.verse.meter import LEVEL, patterns
from data.verse.plan import PlanIds
from data.verse.poetry import VERSE_FORMS
from data.verse.rhyme import rhyme_groups
from data.verse.tunes import EITHER, MIN_EVIDENCE, Variant, draw_tunes, find_tune, tunes


@dataclass(frozen=True)
class Book:
    """A template's rhyme book, and with it all that the sampler does differently for a 诗 and a 词
    (the one place it does): name; what: what its classes are called; tuned: a 词's book, whose
    classes are 词林正韵's (部, tone) pairs and whose templates a tune's template tokens name (a 诗's:
    平水韵's level-tone groups, named by the form tokens); meter_rhymes: meter asks for rhyme too
    (a regulated 诗's even lines rhyme; a tune's meter is its tones alone)."""
    name: str
    what: str
    tuned: bool

    @property
    def meter_rhymes(self) -> bool:
        return not self.tuned

    @property
    def masks_draw_plan(self) -> bool:
        """The masks draw each poem's plan, under soft control too: a tune's template token, one per
        row (a 诗's plan is its form's token, given, so under soft control it needs no mask)."""
        return self.tuned

    def named_by(self, ids: PlanIds) -> bool:
        """A model's plan tokens (`ids`) can name this book's templates: a 诗's, by the form tokens
        every plan model has; a 词's, only by a tune's template tokens (an `experiment=ci` model)."""
        return not self.tuned or bool(ids.templates)

    def classes(self, chars: Iterable[str], script: str) -> dict[str, frozenset]:
        """Character → its classes in this book, for those of `chars` that it has."""
        if not self.tuned:
            return rhyme_groups(list(chars), script)
        wanted = set(chars)
        return {c: k for c, k in rhyme_classes(script).items() if c in wanted}

    def tone(self, cls) -> str:
        """A class's tone: a 词林正韵 class (部, tone) carries it, a 平水韵 level-tone group is 平."""
        return cls[1] if self.tuned else LEVEL

    def plan_rhymes(self, ids: PlanIds | None) -> dict:
        """Class → the id of the plan token that names it ({} for a model without them)."""
        return {} if ids is None else ids.ci_rhymes if self.tuned else ids.rhymes

    def first_tokens(self, ids: PlanIds, templates: Sequence[Template]) -> dict[int, int]:
        """The plan tokens that name `templates` (one form's or tune's) → the training poems each holds:
        a tune's template tokens (a model trained with them; {} without); every form token for a 诗's,
        whose plan is the model's own where masks keep the form."""
        if not self.tuned:
            return dict.fromkeys(ids.forms.values(), 1)
        kept = {t.shape: t.count for t in templates}
        return {i: kept[s] for i, (name, k) in ids.templates.items()
                if name == templates[0].name and (s := tunes()[name][k].shape) in kept}


SHI_BOOK, CI_BOOK = Book("平水韵", "平水韵 level-tone group", False), Book("词林正韵", "词林正韵 class", True)
"""The rhyme books: a 诗 rhymes in a level-tone group of 平水韵, a 词 in a class (部, tone) of 词林正韵."""
FREE_LENGTHS = (5, 7)
"""The line lengths of an acrostic without a form (the first line chooses)."""


@dataclass(frozen=True)
class Template:
    """One shape a poem may take. name: the form or tune ("" for an acrostic without a form);
    shape: lines as `7。7。7。7，7。7。` (`data.verse.ci.parse_shape`); tones: one of 平/仄/中 per
    character position, marks not counted; rhymes: per line, its rhyme segment or None;
    segments: each segment's tone; book: `SHI_BOOK` or `CI_BOOK`; bound: per segment, the
    segment whose 部 it shares (None: free), `CI_BOOK` only; stanza: the 下阕's first line (None:
    one stanza); count: the training poems of this shape (a tune's; 0 for a form)."""
    name: str
    shape: str
    tones: str
    rhymes: tuple[int | None, ...]
    segments: tuple[str, ...]
    book: Book
    bound: tuple[int | None, ...] = ()
    stanza: int | None = None
    count: int = 0

    @cached_property
    def lines(self) -> list[tuple[int, str]]:
        """[(line length, closing mark)]."""
        return parse_shape(self.shape)

    @cached_property
    def starts(self) -> tuple[int, ...]:
        """The position (characters before it, marks not counted) where each line starts."""
        at, out = 0, []
        for n, _ in self.lines:
            out.append(at)
            at += n
        return tuple(out)

    @cached_property
    def ends(self) -> tuple[int, ...]:
        """The position where each line ends (its mark's, marks not counted)."""
        return (*self.starts[1:], self.length)

    @property
    def length(self) -> int:
        """Characters of the whole poem, marks not counted."""
        return len(self.tones)

    @cached_property
    def marks(self) -> dict[int, str]:
        """Position → the mark written after that many characters (each line's end)."""
        return {s + n: m for s, (n, m) in zip(self.starts, self.lines)}

    @cached_property
    def rhyme_at(self) -> dict[int, int]:
        """Position of each rhyming line's last character → its segment."""
        return {s + n - 1: r for s, (n, _), r in zip(self.starts, self.lines, self.rhymes) if r is not None}

    @cached_property
    def sizes(self) -> tuple[int, ...]:
        """Rhyme positions per segment."""
        return tuple(sum(r == s for r in self.rhymes) for s in range(len(self.segments)))

    def line_of(self, k: int) -> int:
        """The line (0-based) position k is in."""
        return bisect_right(self.starts, k) - 1

    def span(self, k: int) -> tuple[int, int, int]:
        """(the line position k is in (0-based), its first position, its end)."""
        line = self.line_of(k)
        return line, self.starts[line], self.ends[line]

    def expects(self, k: int, marked: bool) -> tuple[str, str | None]:
        """What comes after k characters (`marked`: the mark after them written): ("mark", the mark),
        ("end", None) where the poem ends, or ("char", None): the step of every walk of a template."""
        if k in self.marks and not marked:
            return "mark", self.marks[k]
        return ("end", None) if k == self.length else ("char", None)


def _shape(n_lines: int, n_chars: int) -> str:
    marks = ["，。"[i % 2] for i in range(n_lines - 1)] + ["。"]
    return "".join(f"{n_chars}{m}" for m in marks)


def _even_rhymes(n_lines: int, first: bool = False) -> tuple[int | None, ...]:
    return tuple(0 if i % 2 == 1 or (i == 0 and first) else None for i in range(n_lines))


def form_templates(form: str, meter: bool = False) -> tuple[Template, ...]:
    """The templates of a regulated form (module docstring): one without meter, its four standard
    patterns with. raises ValueError for an unknown form."""
    if form not in VERSE_FORMS:
        raise ValueError(f"unknown form {form!r}; choose one of {', '.join(VERSE_FORMS)}")
    n_lines, n_chars = VERSE_FORMS[form]
    shape = _shape(n_lines, n_chars)
    if not meter:
        return (Template(form, shape, EITHER * n_lines * n_chars, _even_rhymes(n_lines), (LEVEL,), SHI_BOOK),)
    return tuple(Template(form, shape, "".join(lines), _even_rhymes(n_lines, lines[0][-1] == LEVEL), (LEVEL,), SHI_BOOK)
                 for lines in patterns(form).values())


def acrostic_templates(n_lines: int) -> tuple[Template, ...]:
    """The templates of an acrostic of `n_lines` without a form: every line of 5, or of 7."""
    return tuple(Template("", _shape(n_lines, n), EITHER * n_lines * n, _even_rhymes(n_lines), (LEVEL,), SHI_BOOK)
                 for n in FREE_LENGTHS)


def tune_template(tune: str, v: Variant) -> Template:
    """A variant of a tune's as a template."""
    return Template(tune, v.shape, "".join(v.tones), v.rhymes, v.segments, CI_BOOK, v.bound or (None,) * len(v.segments),
                    v.stanza, v.count)


def tune_templates(tune: str) -> tuple[Template, ...]:
    """The templates of a tune the sampler keeps: its variants seen in at least `MIN_EVIDENCE`
    training 词, and always its commonest."""
    variants = tunes()[tune]
    return tuple(tune_template(tune, v) for v in variants if v.count >= MIN_EVIDENCE or v is variants[0])


def row_tunes(tune: str, form: str | None, n: int, seed: int) -> list[str]:
    """The tune of each of n 词: `tune` (either script) for every one, or with `form=ci` alone one
    drawn per 词 by its share of the corpus (`draw_tunes`, seeded); [] when no 词 is asked for.
    raises ValueError for an unknown tune (with the nearest names)."""
    if tune:
        return [find_tune(tune)] * n
    return draw_tunes(n, seed) if form == CI else []
