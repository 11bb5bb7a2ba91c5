"""Plan tokens: a poem says its form and its rhyme before its first character.

With `data.plan_tokens=true` every poem is framed as `<bos>`, a form token, a rhyme token,
the poem, `<eos>`, so a model learns to choose a plan first and then write to it
(`model.sampling.poems` samples the plan, or takes it as a prompt: soft control).

- Form tokens (`FORM_LABELS`): `<五绝>` `<七绝>` `<五律>` `<七律>` `<其他>`, from the corpus's
  `form` field (`data.verse.poetry.form_of`; names `wujue`, `qijue`, `wulv`, `qilv`, `other`).
- Rhyme tokens: one per 平水韵 level-tone group, labelled with the group's name (`<上平聲一東>` …
  `<下平聲十五咸>`, the table order of `data.verse.rhyme.level_tone_table`), and `<无韵>` (`NO_RHYME`).
  A poem gets the group its even lines' last characters (at least two of them) all sit in
  (`data.verse.meter.shared_rhyme_groups`, the metric's test); if they share several (polyphonic
  finals), the first in table order; if none, or if the poem has fewer than two even lines,
  `<无韵>`.

The tokens are extra ids after a tokenizer's vocabulary (`Tokenizer.plan`); they have no text,
so `decode` drops them and `val/bpc` counts no character for them.

Conditions (`data.conditions`, docs/conditions.md): a model may also be trained with what a
poem is about between `<bos>` and its plan, a segment of its own: `<题>` and the title,
`<人>` and the poet, `<词>` and a keyword (repeated per keyword), in that order, each part
present for a share of the poems. `<bos> <题>静夜思 <人>李白 <五绝> <下平聲七陽> 床前明月光，…`.

Tunes: a model trained on 词 (`experiment=ci`) has a token per template of `data.verse.tunes` that
at least `MIN_VARIANT` training 词 have (`tune_tokens`: `<浣溪沙>` for a tune's commonest, `<念奴娇·2>`
for its second, …, `tune_label`), which stands in a 词's form slot in place of `<其他>`: a 词 plans
the token of the template whose shape it has, and one of a rarer shape or tune keeps `<其他>`
(`<bos> <浣溪沙> <无韵> 一曲新词酒一杯，…`). So the model learns each template from its token (the
structure inputs read it, `data.features.tune_tables`) and a sampler can ask for a tune without
masks (`control=soft`), drawing one of its tokens.
The segment is given, never predicted: its targets are not scored in training or validation
(`segment_mask`), so `val/bpc` stays a figure of the poem alone, and a sampler writes it into
the prompt (`PlanIds.body` strips it again).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Protocol, Sequence

from data.verse.ci import CI, closed_lines, rhyme_classes, shape_of
from data.verse.meter import poem_lines, shared_rhyme_groups
from data.verse.poetry import form_of, is_hanzi
from data.verse.rhyme import level_tone_table
from data.verse.tunes import SCRIPT as TUNES_SCRIPT
from data.verse.tunes import segment_rhyme
from data.verse.tunes import tunes as tune_table

FORM_LABELS = {"wujue": "<五绝>", "qijue": "<七绝>", "wulv": "<五律>", "qilv": "<七律>", "other": "<其他>"}
"""Form name (`data.verse.poetry.FORMS` and `other`) → its plan token's label."""
NO_RHYME = "<无韵>"
"""The rhyme token of a poem whose even lines share no level-tone group."""
PLAN_SLOTS = 2
"""Plan tokens per poem: the form's, then the rhyme's, right after `<bos>` (or the segment)."""
SEGMENTS = {"title": "<题>", "poet": "<人>", "keyword": "<词>"}
"""Condition → the label of the marker token that opens its part of the segment."""
BOS_ID, EOS_ID = 0, 1
"""`<bos>` and `<eos>`'s ids in every tokenizer (`data.tokenizer.Tokenizer`)."""
MAX_TITLE = 12
"""The longest title a segment holds, in characters (a longer one is not given)."""
MIN_VARIANT = 10
"""A tune's template (又一体) other than its commonest gets a token when at least this many
training 词 have its shape (83 tokens for the 49 tunes, holding 91 % of their training 词)."""


def rhyme_label(group: str) -> str:
    """The label of a level-tone group's rhyme token: `下平聲七陽` → `<下平聲七陽>`."""
    return f"<{group}>"


def tune_label(tune: str, variant: int = 0) -> str:
    """The label of the token of a tune's template number `variant` (its index in
    `data.verse.tunes`, commonest first): `浣溪沙`, 0 → `<浣溪沙>`; `念奴娇`, 1 → `<念奴娇·2>`."""
    return f"<{tune}>" if variant == 0 else f"<{tune}·{variant + 1}>"


@lru_cache(maxsize=None)
def tune_tokens() -> tuple[tuple[str, int], ...]:
    """(tune, template index) of every tune token, in id order: per tune of `data.verse.tunes`
    (commonest first) its commonest template and each other one with ≥ `MIN_VARIANT` training 词."""
    return tuple((t, k) for t, variants in tune_table().items() for k, v in enumerate(variants)
                 if k == 0 or v.count >= MIN_VARIANT)


def tune_variant(text: str, tune: str, complete: bool = True) -> int | None:
    """The template of `tune` with a token (`tune_tokens`) that a 词 is written to, by index: the
    one whose shape (`shape_of`) it has; for the start of a 词 (complete=False) the commonest whose
    lines it begins (a last line without its mark no longer than the template's); None if none.
    `tune_variant("明月几时有，把酒问青天。", "水调歌头", complete=False)` = 0."""
    if complete:
        shape = shape_of(text)
        return next((k for t, k in tune_tokens() if t == tune and tune_table()[t][k].shape == shape), None)
    done, rest = closed_lines(text)
    for t, k in tune_tokens():
        have = tune_table()[t][k].lines if t == tune else []
        if have[:len(done)] == done and (not rest or len(have) > len(done) and rest <= have[len(done)][0]):
            return k
    return None


@lru_cache(maxsize=None)
def ci_rhyme_classes() -> tuple[tuple[int, str], ...]:
    """The 词林正韵 classes (部 1–19, 平 or 仄; `data.verse.ci.rhyme_classes`), in order: 33."""
    return tuple(sorted({k for cls in rhyme_classes(TUNES_SCRIPT).values() for k in cls}))


def ci_rhyme_label(cls: tuple[int, str]) -> str:
    """The label of a 词林正韵 class's rhyme token: `(7, "平")` → `<7部平>`."""
    return f"<{cls[0]}部{cls[1]}>"


def ci_rhyme(text: str, tune: str, variant: int) -> tuple[int, str] | None:
    """The 词林正韵 class a 词 of template `variant` of `tune` (or the start of one) rhymes in first:
    the class its first rhyme segment's positions share most (`data.verse.tunes.segment_rhyme`),
    if two of them do (one, where only one is written); None: no rhyme yet."""
    cls, count, written = segment_rhyme(text, tune_table()[tune][variant], 0)
    return cls if count >= min(2, written) and count else None


@lru_cache(maxsize=None)
def plan_labels(segments: bool = False, tunes: bool = False) -> tuple[str, ...]:
    """Every plan token's label, in id order: the 5 forms, the 30 level-tone groups, `<无韵>`, with
    segments the 3 condition markers (`SEGMENTS`), with tunes one per tune token (`tune_tokens`)
    and one per 词林正韵 class (`ci_rhyme_classes`)."""
    return (*FORM_LABELS.values(), *map(rhyme_label, level_tone_table()), NO_RHYME,
            *(SEGMENTS.values() if segments else ()), *(tune_label(*t) for t in (tune_tokens() if tunes else ())),
            *(map(ci_rhyme_label, ci_rhyme_classes()) if tunes else ()))


def clean_title(title: str) -> str:
    """The title a segment holds: the part before the first space (a series' number after it goes),
    its CJK characters only; "" if that is longer than `MAX_TITLE`.
    `clean_title("帝京篇十首 一")` = `帝京篇十首`, `clean_title("《静夜思》")` = `静夜思`."""
    kept = "".join(c for c in (title.split() or [""])[0] if is_hanzi(c))
    return kept if len(kept) <= MAX_TITLE else ""


def poem_rhyme_groups(text: str, script: str) -> frozenset[str]:
    """The level-tone groups all the even lines' last characters of a poem sit in (empty if
    they share none or the poem has fewer than two even lines). raises ValueError for an
    unknown script."""
    finals = [line[-1] for line in poem_lines(text)[1::2] if line]
    return shared_rhyme_groups(finals, script) if len(finals) >= 2 else frozenset()


def rhyme_of(text: str, script: str) -> str | None:
    """The group a poem's rhyme token names (the first of `poem_rhyme_groups` in table order),
    or None for `<无韵>`. raises ValueError for an unknown script."""
    groups = poem_rhyme_groups(text, script)
    return next((g for g in level_tone_table() if g in groups), None)


def poem_plan(text: str, form: str, script: str, tune: str = "", complete: bool = True) -> tuple[str, str]:
    """(form label, rhyme label) of a poem: `form` is its corpus `form` field (`form_of`); a 词's,
    `ci`, plans `<其他>`, or with `tune` (one of `data.verse.tunes`, for a tokenizer with tune
    tokens) the token of the tune's template it is written to (`tune_variant`, complete: the whole
    词), `<其他>` where it has none; such a 词's rhyme label names the 词林正韵 class it rhymes in
    first (`ci_rhyme`), or is `<无韵>`.
    `poem_plan("白日依山尽，黄河入海流。欲穷千里目，更上一层楼。", "wujue", "simplified")` =
    (`<五绝>`, `<下平聲十一尤>`). raises ValueError for an unknown form or script."""
    if form not in FORM_LABELS and form != CI:
        raise ValueError(f"unknown form {form!r}; one of {', '.join(FORM_LABELS)}, ci")
    variant = tune_variant(text, tune, complete) if form == CI and tune in tune_table() else None
    if variant is not None:
        cls = ci_rhyme(text, tune, variant)
        return tune_label(tune, variant), NO_RHYME if cls is None else ci_rhyme_label(cls)
    group = rhyme_of(text, script)
    return FORM_LABELS.get(form, FORM_LABELS["other"]), NO_RHYME if group is None else rhyme_label(group)


class HasPlanTokens(Protocol):
    """What `plan_ids` reads of a tokenizer (`data.tokenizer.Tokenizer` has both)."""
    plan: tuple[str, ...]  # the plan tokens' labels, in id order
    plan_start: int  # the id of the first


class EncodesPlans(HasPlanTokens, Protocol):
    """What `poem_ids` uses of a tokenizer (`data.tokenizer.Tokenizer` has it)."""
    def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]: ...


def segment_ids(tok: EncodesPlans, title: str = "", poet: str = "", keywords: Sequence[str] = ()) -> list[int]:
    """The condition segment's ids (module docstring): `<题>` title, `<人>` poet, `<词>` per keyword,
    each part only if given ([] for none). Texts in the tokenizer's script. raises ValueError if
    the tokenizer has no markers; as `Tokenizer.encode`."""
    parts = [(SEGMENTS["title"], title), (SEGMENTS["poet"], poet), *((SEGMENTS["keyword"], w) for w in keywords)]
    if any(text for _, text in parts) and SEGMENTS["title"] not in tok.plan:
        raise ValueError("this model was trained without titles, poets or keyword hints (data.conditions)")
    return [i for label, text in parts if text for i in (tok.plan_start + tok.plan.index(label), *tok.encode(text))]


def poem_ids(tok: EncodesPlans, text: str, script: str, form: str | None = None, eos: bool = True,
             segment: Sequence[int] = (), tune: str = "") -> list[int]:
    """A poem's ids as a model is trained on it: `<bos>`, the condition segment (`segment_ids`),
    its plan tokens (`poem_plan`) if the tokenizer has them, its text, `<eos>` if eos. form: its
    corpus `form` field (None: `form_of` the text, what the corpus field holds); tune: a 词's
    (its template's token is used when the tokenizer has tune tokens; without eos the text is the
    start of a 词). raises as `Tokenizer.encode` and `poem_plan`."""
    ids = tok.encode(text, bos=True, eos=eos)
    if not tok.plan:
        return ids
    tune = tune if tune_label(tune) in tok.plan else ""
    plan = [tok.plan_start + tok.plan.index(label)
            for label in poem_plan(text, form or form_of(text), script, tune, complete=eos)]
    return [ids[0], *segment, *plan, *ids[1:]]


@dataclass(frozen=True)
class PlanIds:
    """Where a tokenizer's plan tokens sit: forms (form name → id), rhymes (group → id), none
    (the id of `<无韵>`), segments (condition → its marker's id; {} for a model without them),
    templates (tune token id → (tune, index of its template in `data.verse.tunes`), `tune_tokens`;
    {} for a model without them), ci_rhymes (词林正韵 class → id; {} for a model without tune
    tokens). Built by `plan_ids`."""
    forms: dict[str, int]
    rhymes: dict[str, int]
    none: int
    segments: dict[str, int]
    templates: dict[int, tuple[str, int]]
    ci_rhymes: dict[tuple[int, str], int]

    @property
    def tunes(self) -> dict[str, tuple[int, ...]]:
        """Tune → the ids of its templates' tokens, commonest template first."""
        out: dict[str, tuple[int, ...]] = {}
        for i, (t, _) in self.templates.items():
            out[t] = (*out.get(t, ()), i)
        return out

    @property
    def tune_of(self) -> dict[int, str]:
        """Tune token id → its tune."""
        return {i: t for i, (t, _) in self.templates.items()}

    @property
    def all(self) -> list[int]:
        """Every plan id, markers and tunes included."""
        return [*self.forms.values(), *self.rhymes.values(), self.none, *self.segments.values(), *self.tune_of,
                *self.ci_rhymes.values()]

    @property
    def firsts(self) -> list[int]:
        """The ids that stand in a plan's first slot: the form tokens and the tune tokens."""
        return [*self.forms.values(), *self.tune_of]

    @property
    def segment_ends(self) -> list[int]:
        """The ids that close a condition segment: a plan's first (`firsts`), `<bos>` and `<eos>`."""
        return [*self.firsts, BOS_ID, EOS_ID]

    def segment_mask(self, ids: Iterable[int]) -> list[bool]:
        """Per id of a sequence, whether it is inside a condition segment (a marker and the
        characters after it, up to the next of `segment_ends`): targets that are not scored.
        (`data.conditions.segment_positions` is the same over a whole token array.)"""
        markers, ends, inside, out = set(self.segments.values()), set(self.segment_ends), False, []
        for i in ids:
            inside = True if i in markers else False if i in ends else inside
            out.append(inside)
        return out

    def body(self, ids: Iterable[int]) -> list[int]:
        """ids without their condition segments (`segment_mask`): what a poem shows."""
        ids = [int(i) for i in ids]
        return [i for i, inside in zip(ids, self.segment_mask(ids)) if not inside]

    def read_segment(self, tok, ids: Iterable[int]) -> dict[str, str | list[str]]:
        """The conditions a sequence's segment holds: {"title": …, "poet": …, "keywords": [...]},
        only those present (texts decoded with tok)."""
        found: dict[str, list[list[int]]] = {}
        name = {i: c for c, i in self.segments.items()}
        ids = [int(i) for i in ids]
        part: list[int] = []
        for i, inside in zip(ids, self.segment_mask(ids)):
            if i in name:
                part = []
                found.setdefault(name[i], []).append(part)
            elif inside:
                part.append(i)
        out: dict[str, str | list[str]] = {c: tok.decode(parts[0]) for c, parts in found.items() if c != "keyword"}
        if "keyword" in found:
            out["keywords"] = [tok.decode(p) for p in found["keyword"]]
        return out

    def read(self, ids: Iterable[int]) -> dict[str, str | None]:
        """The plan a sequence of ids holds: {"form": form name or None, "rhyme": group or None}
        (the first form token and the first rhyme token, a 词林正韵 class as `7部平`; None where
        there is none, or `<无韵>`), and for a model with tune tokens "tune": the tune its token
        names (form `ci`) or None, and "template": that token's template, 1 for the tune's
        commonest (`<水调歌头·2>`: 2), or None."""
        first_of_id = {**{i: (f, None) for f, i in self.forms.items()}, **{i: (CI, t) for i, t in self.tune_of.items()}}
        group_of_id = {**{i: g for g, i in self.rhymes.items()},
                       **{i: ci_rhyme_label(c)[1:-1] for c, i in self.ci_rhymes.items()}}
        ids = [int(i) for i in ids]
        first = next((i for i in ids if i in first_of_id), None)
        form, tune = first_of_id.get(first, (None, None))
        template = self.templates[first][1] + 1 if first in self.templates else None
        return {"form": form, "rhyme": next((group_of_id[i] for i in ids if i in group_of_id), None),
                **({"tune": tune, "template": template} if self.tunes else {})}


@lru_cache(maxsize=8)
def plan_ids(tok: HasPlanTokens) -> PlanIds | None:
    """The `PlanIds` of a tokenizer (None if it has no plan tokens; built once per tokenizer).
    raises ValueError if its plan tokens are not `plan_labels(…)`'s, with or without segments and tunes."""
    if not tok.plan:
        return None
    if tok.plan not in (plan_labels(s, t) for s in (False, True) for t in (False, True)):
        raise ValueError("the tokenizer's plan tokens are not this version's (data.verse.plan.plan_labels)")
    index = {label: tok.plan_start + k for k, label in enumerate(tok.plan)}
    return PlanIds({f: index[label] for f, label in FORM_LABELS.items()},
                   {g: index[rhyme_label(g)] for g in level_tone_table()}, index[NO_RHYME],
                   {c: index[label] for c, label in SEGMENTS.items() if label in index},
                   {index[tune_label(*t)]: t for t in tune_tokens() if tune_label(*t) in index},
                   {c: index[ci_rhyme_label(c)] for c in ci_rhyme_classes() if ci_rhyme_label(c) in index})
