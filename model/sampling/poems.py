"""Poems from a trained model: the one sampling path (`sample.py`, the studio, evaluation, the
training callbacks, the benchmarks), so every poem keeps the same rules.

`decide` decides once what the options ask for (a frozen `Decision`); `poem_steps` lists its
processors: `PoemBoundaries`, `PlanGrammar` (plan models), the decided rules (a `TemplateConstraint`
or `FreeKeywords`), a title plan's `TopicLean` and `RepetitionPenalty` (these two the engine's).
`control`: `soft` asks for form and rhyme by plan tokens only, `hard` by masks only, `both` (the
default for a plan model) by both (docs/sampling.md).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator

import torch
from omegaconf import OmegaConf

from data.keywords import check_forced, keyword_rows, per_row
from data.title_plan import check_mode
from data.tokenizer import Tokenizer
from data.verse.plan import PLAN_SLOTS, plan_ids
from data.verse.poetry import VERSE_FORMS, is_hanzi
from data.verse.templates import CI, Book, Template, acrostic_templates, form_templates, row_tunes, tune_templates
from model.decoding import RepetitionPenalty, check_sampling_args, sampler
from model.engine import Engine, LogitsProcessor, Step
from model.sampling.conditions import condition_segments, has_conditions
from model.sampling.grammar import plan_grammar, poem_boundaries
from model.sampling.keywords import MAX_FREE_LINE, FreeKeywords
from model.sampling.shape import TemplateConstraint
from model.sampling.title_plan import topic_lean, with_plan

RECIPE = OmegaConf.load(Path(__file__).with_name("recipe.yaml"))
"""The sampling recipe (model/sampling/recipe.yaml, the one copy): `SamplingOptions`' defaults, and the
entry configs' and training callbacks' values, which compose the same file."""

CONTROLS = ("hard", "soft", "both")
"""How `form`/`rhyme` are asked for: masks (hard), plan tokens (soft, plan models only), or both."""


@dataclass
class SamplingOptions:
    """What to sample (docs/sampling.md has each option). Units: tokens (= characters for the
    character model); drawn plan tokens count in max_new_tokens.

    prompt, acrostic, keywords, title, poet: either script; form: one of
    `data.verse.poetry.VERSE_FORMS`, `ci` (with tune, or drawn per 词 by share) or None; keywords: a
    list, a string split at `,`/`，`/`、`, or one list per poem; keywords_forced: false gives them as
    hints (a model trained with conditions); title, poet: a string or one per poem; title_plan:
    True | "echo" | "hints" | False (`model.sampling.title_plan`); topic_lean: the weight of a
    `title_plan=true` plan's lean (`TopicLean`; 0: none); rhyme: needs a form, tune or acrostic;
    meter: needs a form or tune (a form's implies rhyme); repetition_penalty: 1.0 = off;
    temperature 0 = greedy; control: hard | soft | both | None (both with plan tokens, else hard).
    """
    prompt: str = ""
    num_samples: int = 1
    max_new_tokens: int = RECIPE.max_new_tokens
    temperature: float = RECIPE.temperature
    top_k: int | None = RECIPE.top_k
    top_p: float | None = RECIPE.top_p
    seed: int = RECIPE.seed
    form: str | None = None
    acrostic: str = ""
    keywords: Any = ""  # str | list[str] | list[list[str]] (OmegaConf's structured configs take no unions)
    keywords_forced: bool = True
    title: Any = ""  # str | list[str], one per poem
    title_plan: Any = True  # True | "echo" | "hints" | False (`model.sampling.title_plan`)
    topic_lean: float = RECIPE.topic_lean
    poet: Any = ""  # str | list[str], one per poem
    tune: str = ""
    rhyme: bool = False
    meter: bool = False
    repetition_penalty: float = RECIPE.repetition_penalty
    use_cache: bool = True
    control: str | None = None


@dataclass(frozen=True)
class Decision:
    """What `decide` made of the options, once (frozen): the processors, `sample.py`, the studio and
    evaluation read it, and none decides again. form: `CI` for a 词, None for a free poem; tunes:
    each 词's tune, resolved before the title's plan (() for a 诗); templates: each row's, or one
    tuple for every row; rhyme: kept (meter keeps it where the book says, `Book.meter_rhymes`);
    plan_rhymes: the only rhyme tokens the plan's rhyme slot takes (soft rhyme: its book's classes,
    `Book.plan_rhymes`; (): any); prompt, acrostic, keywords (one tuple for every
    row, or one per row): cleaned, in the model's script; title_plan_words: a title's planned words
    (None: no plan); plans: each row's given plan ids; to_draw: the plan tokens the model draws;
    constraint: the masks of the form, tune or acrostic (None without, or for a 诗 under soft
    control); free_keywords: a free poem's forced keywords are placed (`FreeKeywords`)."""
    form: str | None
    tunes: tuple[str, ...]
    templates: tuple[tuple[Template, ...], ...]
    control: str
    rhyme: bool
    plan_rhymes: tuple[int, ...]
    prompt: str
    acrostic: str
    keywords: tuple[tuple[str, ...], ...]
    keywords_forced: bool
    title_plan_words: tuple[tuple[str, ...], ...] | None
    plans: tuple[tuple[int, ...], ...]
    to_draw: int
    constraint: TemplateConstraint | None
    free_keywords: bool

    @property
    def book(self) -> Book | None:  # the templates' rhyme book (`Book`), None without templates
        return self.templates[0][0].book if self.templates else None


def decide(engine: Engine, opts: SamplingOptions) -> Decision:
    """Check the options and decide what they ask for (`Decision`). raises ValueError for bad
    sampling arguments (topic_lean < 0 too), control (soft: no acrostic or meter, which are masks), form or tune, a
    prompt, acrostic or keyword with invalid code points or outside the vocabulary, a prompt that
    does not fit the form, keywords no mask can place, too few tokens (max_new_tokens) for the poem;
    an unknown control, or soft/both on a model without plan tokens."""
    check_sampling_args(opts.temperature, opts.top_k, opts.top_p)
    if opts.num_samples < 1:
        raise ValueError(f"num_samples must be ≥ 1, got {opts.num_samples}")
    if isinstance(opts.topic_lean, bool) or not isinstance(opts.topic_lean, (int, float)) or not opts.topic_lean >= 0:
        raise ValueError(f"topic_lean must be ≥ 0 (0 = off), got {opts.topic_lean!r}")
    has_plan = plan_ids(engine.tokenizer) is not None
    control = opts.control or ("both" if has_plan else "hard")  # the default: both with plan tokens, else hard
    if control not in CONTROLS:
        raise ValueError(f"control={opts.control!r} is not one of {', '.join(CONTROLS)}")
    if control != "hard" and not has_plan:
        raise ValueError(f"control={control} needs a model trained with plan tokens (data.plan_tokens=true); "
                         "this one has none: use control=hard")
    if control == "soft" and (given := [n for n, on in (("acrostic", opts.acrostic), ("meter", opts.meter)) if on]):
        what = "are masks, not plan tokens" if len(given) == 2 else "is a mask, not a plan token"
        raise ValueError(f"{' and '.join(given)} {what}: use control=hard or control=both")
    form, tunes_ = decide_form(engine, opts, control)  # the tune resolved once, before the plan
    planned = with_plan(engine, opts, form, tunes_[0] if opts.tune else "")  # a title's planned words, as keywords
    acrostic = engine.to_model_text(opts.acrostic, "acrostic")
    if not_hanzi := [c for c in acrostic if not is_hanzi(c)]:
        raise ValueError(f"an acrostic is made of characters that start lines; {''.join(not_hanzi)!r} cannot")
    templates = [tune_templates(t) for t in dict.fromkeys(tunes_)] if len(set(tunes_)) == 1 else \
        [tune_templates(t) for t in tunes_] if tunes_ else [form_templates(form, opts.meter)] if form else \
        [acrostic_templates(len(acrostic))] if acrostic else []
    if opts.rhyme and not templates:
        raise ValueError("rhyme needs a form or an acrostic to know where lines end")
    keywords = tuple(tuple(engine.to_model_text(w, "keywords") for w in row)
                     for row in keyword_rows(planned.keywords, opts.num_samples))
    book = templates[0][0].book if templates else None
    rhyme = opts.rhyme or (opts.meter and book.meter_rhymes)
    real = tuple(book.plan_rhymes(plan_ids(engine.tokenizer)).values()) if control != "hard" and rhyme else ()
    draft = Decision(form, tuple(tunes_), tuple(templates), control, rhyme, real,
                     engine.to_model_text(opts.prompt, "prompt"), acrostic, keywords, planned.keywords_forced,
                     keywords if planned is not opts else None, (), 0, None, False)
    return decide_rules(engine, draft, opts)


def decide_form(engine: Engine, opts: SamplingOptions, control: str) -> tuple[str | None, list[str]]:
    """(the form: `CI` with a tune, else `opts.form`; each row's tune, `row_tunes`). raises
    ValueError for a tune beside another form, an unknown form or tune, a form soft control cannot
    ask for, meter without a form."""
    if opts.tune and opts.form not in (None, CI):
        raise ValueError(f"tune={opts.tune} writes a 词 (form=ci), not a {opts.form}: leave form= out or set form=ci")
    form = CI if opts.tune else opts.form
    if form is not None and form not in (*VERSE_FORMS, CI):
        raise ValueError(f"unknown form {form!r}; choose one of {', '.join(VERSE_FORMS)} or {CI} (with tune=)")
    ids = plan_ids(engine.tokenizer)
    if control == "soft" and form in VERSE_FORMS and form not in ids.forms:
        raise ValueError(f"form={form} has no plan token (a plan names {', '.join(f for f in ids.forms if f != 'other')}): "
                         "control=soft cannot ask for it; use control=hard or both")
    if opts.meter and form is None:
        raise ValueError(f"meter needs a form to know the tone patterns; give form= one of {', '.join(VERSE_FORMS)}")
    return form, row_tunes(opts.tune, opts.form, opts.num_samples, opts.seed)


def decide_rules(engine: Engine, d: Decision, opts: SamplingOptions) -> Decision:
    """`d` with its rules decided: the masks (`constraint_of`), each row's plan (a 诗's form token, or
    a 词's template token drawn by `TemplateConstraint.plans`), the plan tokens left to draw, and
    whether a free poem's keywords are placed. raises ValueError as `constraint_of`, or for too few
    tokens (max_new_tokens) for the poem."""
    ids = plan_ids(engine.tokenizer)
    constraint = constraint_of(engine, d, opts)
    given = d.control != "hard" and d.form is not None  # the plan given: drawn by the masks, or the form's token
    plans = constraint.plans(opts.num_samples, opts.seed) if given and d.book.masks_draw_plan else \
        [[ids.forms.get(d.form, ids.forms["other"])] if given else []] * opts.num_samples
    to_draw = PLAN_SLOTS - len(plans[0]) if ids else 0
    free_keywords = constraint is None and d.keywords_forced and any(d.keywords)
    if constraint is not None:
        needed = constraint.max_tokens() - len(d.prompt) + to_draw
        if opts.max_new_tokens < needed:
            raise ValueError(f"max_new_tokens={opts.max_new_tokens} is too few for this poem; it needs up to {needed}")
    elif free_keywords:
        check_forced(engine.tokenizer, d.keywords, d.control)
        needed = max(len(row) + 1 for row in d.keywords) * (MAX_FREE_LINE + 1) + 1
        if needed > opts.max_new_tokens - to_draw:
            raise ValueError(f"max_new_tokens={opts.max_new_tokens - to_draw} is too few for these keywords without a "
                             f"form; they need up to {needed}")
    return replace(d, plans=tuple(map(tuple, plans)), to_draw=to_draw, constraint=constraint,
                   free_keywords=free_keywords)


def constraint_of(engine: Engine, d: Decision, opts: SamplingOptions) -> TemplateConstraint | None:
    """The `TemplateConstraint` of a decision (None without templates, or for a 诗 under soft
    control), checked: the prompt fits, forced keywords can be placed. raises ValueError as
    `TemplateConstraint`, `check_forced`."""
    if not d.templates:
        return None
    forced = d.keywords if d.keywords_forced and any(d.keywords) else []
    if forced:
        check_forced(engine.tokenizer, forced, d.control)
    if d.control == "soft" and not d.book.masks_draw_plan:
        return None  # the form is its plan token: nothing to mask, nor to check
    if d.control == "soft" and not d.book.named_by(plan_ids(engine.tokenizer)):
        raise ValueError("this model has no tune plan tokens (an experiment=ci model has), so it keeps a tune by masks "
                         "only: use control=hard or both")
    constraint = TemplateConstraint(engine.tokenizer, list(d.templates), engine.script, d.rhyme, opts.meter,
                                    d.acrostic, list(forced), d.prompt, opts.seed)
    constraint.check_text(d.prompt)
    if forced:
        rules = ["each rhyming line's last character left to the rhyme", *(["the 平仄"] * opts.meter),
                 *(["the acrostic"] * bool(d.acrostic)), *(["the prompt"] * bool(d.prompt))]
        constraint.check_keywords(rules)
    return constraint


def rule_processors(engine: Engine, d: Decision, opts: SamplingOptions) -> list[LogitsProcessor]:
    """The processors of the poem's rules, as decided: its `TemplateConstraint` (none under soft
    control: a 词's template is its plan token), or a free poem's `FreeKeywords`."""
    if d.constraint is not None:
        return [] if d.control == "soft" else [d.constraint]
    if not d.free_keywords:
        return []
    return [FreeKeywords(engine.tokenizer, list(d.keywords), d.prompt, opts.max_new_tokens - d.to_draw, opts.seed)]


def poem_steps(engine: Engine, opts: SamplingOptions,
               attention_rows: bool = False) -> tuple[torch.Tensor, Iterator[Step | torch.Tensor], Decision]:
    """Check everything, then start sampling: returns (start (B, T0) int64, an iterator of each
    drawn token's `Step` (`model.engine.Step`: ids (B, 1), its probability, the tokens the masks
    allowed, with `attention_rows` every layer's attention row) and of a prompt that follows a
    drawn plan as (B, n) int64, given, not drawn; the `Decision` it samples by).

    `PoemBoundaries`: a poem ends only right after a sentence-final mark (。？！；), and a line
    mark never follows `<bos>`, a plan token or another mark; `PlanGrammar` for plan models;
    the rules asked for (module docstring). The model must be in eval mode for dropout-free
    sampling (`model.loading.load_engine` gives one). Every check runs before the first token:
    raises ValueError as `decide`, `rule_processors`, `condition_segments`; for max_new_tokens
    too small for the plan tokens still to draw.
    """
    d, tok, device = decide(engine, opts), engine.tokenizer, engine.device
    to_draw = d.to_draw
    processors: list[LogitsProcessor] = [poem_boundaries(tok)]
    rules = rule_processors(engine, d, opts)
    grammar = plan_grammar(tok, d.plan_rhymes) if plan_ids(tok) else None
    processors += [grammar, *rules] if grammar else rules
    if to_draw and opts.max_new_tokens <= to_draw:
        raise ValueError(f"max_new_tokens={opts.max_new_tokens} leaves no token for the poem after its "
                         f"{to_draw} plan token(s)")
    hinted = [w for row in d.keywords for w in row] if not d.keywords_forced else []
    if bad := next((w for w in hinted if not all(map(is_hanzi, w)) or len(w) > MAX_FREE_LINE), None):
        raise ValueError(f"the keyword hint {bad!r} is not made of the characters of one line (CJK characters only, "
                         f"at most {MAX_FREE_LINE})")
    if hinted and not has_conditions(engine):
        raise ValueError("keywords_forced=false gives keywords as hints, which needs a model trained with them "
                         "(data.conditions); this one was trained without: leave keywords forced")
    segments = condition_segments(engine, opts.title, opts.poet, d.keywords, bool(hinted), opts.num_samples)
    drawn_first = bool(to_draw and d.prompt)  # the plan comes before the prompt's text: draw it first
    start = start_ids(tok, segments, d, opts.num_samples, drawn_first).to(device)  # (B, T0)
    if d.title_plan_words is not None and check_mode(opts.title_plan) is True and opts.topic_lean > 0:  # not echo, hints
        processors.append(topic_lean(engine, d.title_plan_words, per_row(opts.title, opts.num_samples, "title"),
                                     opts.topic_lean, start.size(1) - (0 if drawn_first else len(d.prompt)),
                                     VERSE_FORMS[d.form][1] if d.form in VERSE_FORMS else None))
    if opts.repetition_penalty != 1.0:
        processors.append(RepetitionPenalty.of_poem(tok, start, opts.repetition_penalty))
    gen = torch.Generator(device=device).manual_seed(opts.seed)
    draw = sampler(opts.temperature, opts.top_k, opts.top_p, gen, grammar.plan if grammar else None)

    def generate(idx: torch.Tensor, n: int) -> Iterator[Step]:
        return engine.steps(idx, n, draw, tok.eos_id, opts.use_cache, processors, attention_rows)

    def steps() -> Iterator[Step | torch.Tensor]:
        drawn = list(generate(start, to_draw))  # to_draw steps: PoemBoundaries allows no <eos> here
        yield from drawn
        prompt_ids = torch.tensor([tok.encode(d.prompt)] * opts.num_samples, device=device)  # (B, len(prompt))
        yield prompt_ids
        yield from generate(torch.cat([start, *(s.ids for s in drawn), prompt_ids], dim=1),
                            opts.max_new_tokens - to_draw)

    return start, steps() if drawn_first else generate(start, opts.max_new_tokens), d


def start_ids(tok: Tokenizer, segments: list[list[int]], d: Decision, n: int, drawn_first: bool) -> torch.Tensor:
    """(B, T0) int64: each row's `<bos>`, condition segment, given plan, and the prompt unless the
    plan is drawn first; shorter segments are padded with `<eos>` in front, where a poem ends."""
    text, width = [] if drawn_first else tok.encode(d.prompt), max(map(len, segments))
    return torch.tensor([[tok.eos_id] * (width - len(g)) + [tok.bos_id, *g, *plan, *text]
                         for g, plan in zip(segments * n if len(segments) == 1 else segments, d.plans)])


def sample_ids(engine: Engine, opts: SamplingOptions) -> torch.Tensor:
    """`opts.num_samples` sequences sampled in one batch: (B, T) int64 ids from `<bos>` (plan
    and prompt included; rows that ended early padded with `<eos>`). raises as `poem_steps`."""
    start, steps, _ = poem_steps(engine, opts)
    return torch.cat([start, *(s.ids if isinstance(s, Step) else s for s in steps)], dim=1)  # (B, T0 + n)


def sample_poems(engine: Engine, opts: SamplingOptions) -> list[str]:
    """`opts.num_samples` poems sampled in one batch, as text (prompt included, no line breaks,
    no plan tokens, no condition segment). The same options and seed give the same poems. raises as `poem_steps`.
    """
    return [poem_text(engine.tokenizer, row) for row in sample_ids(engine, opts)]


def poem_text(tok: Tokenizer, row: torch.Tensor) -> str:
    """A sampled row (T,) int64 as the poem's text: no plan tokens, no condition segment."""
    ids = plan_ids(tok)
    return tok.decode(ids.body(row.tolist()) if ids else row.tolist())


def read_plans(tok: Tokenizer, rows: torch.Tensor) -> list[dict[str, str | None]] | None:
    """The plan of each sampled row, (B, T) int64 → [{"form": name, "rhyme": group or None}, …]
    (`data.verse.plan.PlanIds.read`); None for a model without plan tokens."""
    ids = plan_ids(tok)
    return None if ids is None else [ids.read(row.tolist()) for row in rows]
