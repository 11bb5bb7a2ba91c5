"""Poems from a trained model: prompt normalisation, poetry controls, seeded batched sampling.

The one sampling path: `sample.py` (conf/sample.yaml's options), the studio, the `samples`
table of `model.training.callbacks.SampleLogger`, `benchmarks/sampling.py` and evaluation all
go through `poem_steps` (`stream_poems`, `sample_poems`), so every poem keeps the same rules
(`PoemBoundaries`, `PlanGrammar` for a model with plan tokens, and the controls asked for).

A model trained with plan tokens (`data.plan_tokens=true`, `data/verse/plan.py`) writes `<bos>`, a
form token, a rhyme token, then the poem. Sampled from `<bos>`, it draws its plan first (a
prompt's text follows the drawn plan), at the temperature but without `top_k` and `top_p`, which
cut the text's unlikely tail: a form the poets wrote one poem in 14 is not a tail to cut.
`control` says how `form` and `rhyme` are asked for: `soft` puts them in the plan (`form` becomes
the form token of the prompt, `rhyme` restricts the rhyme slot to real groups, not `<无韵>`) and
masks nothing in the poem; `hard` is constrained decoding (`PoemConstraint`, which rhymes within
the plan's group when there is one); `both` (the default for plan models) does both. Decoded poems never show plan tokens.
A 词 (`form=ci`) plans a token of its tune's templates on a model trained with tune tokens (`experiment=ci`), so
`control=soft` asks for a tune without masks; other models plan `<其他>` and keep a tune by masks.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

import torch
from omegaconf import OmegaConf

from data.tokenizer import CharTokenizer, Tokenizer
from data.verse.plan import PLAN_SLOTS, plan_ids
from data.verse.poetry import FORMS, LINE_END, is_hanzi
from data.verse.tunes import draw_tunes, find_tune
from model.engine import Engine, LogitsProcessor, Step
from model.sampling.conditions import condition_segments, has_conditions
from model.sampling.constraints import PoemConstraint
from model.sampling.decoding import PlanGrammar, PoemBoundaries, RepetitionPenalty, check_sampling_args, sampler
from model.sampling.keywords import MAX_FREE_LINE, KeywordConstraint, keyword_rows
from model.sampling.title_plan import with_plan
from model.sampling.tunes import TuneConstraint

RECIPE = OmegaConf.load(Path(__file__).resolve().parents[2] / "conf" / "sampling.yaml")
"""The sampling recipe (conf/sampling.yaml, the one copy): `SamplingOptions`' defaults, and the
entry configs' and training callbacks' values, which compose the same file."""

CI = "ci"
"""The form of a 词 (`tune=`)."""
CONTROLS = ("hard", "soft", "both")
"""How `form`/`rhyme` are asked for: masks (hard), plan tokens (soft, plan models only), or both."""


@dataclass
class SamplingOptions:
    """What to sample. Units: tokens (= characters for the character model).

    prompt / acrostic: in either script (converted with OpenCC); form: wujue | qijue | wulv |
    qilv | None; keywords: words every poem contains, whole, inside a line, where the model
    chooses (`model.sampling.keywords`; a list, or a string split at `,`/`，`/`、`; or one
    list per poem, `num_samples` of them); keywords_forced: false gives them as hints in the
    condition segment instead (a model trained with conditions), nothing forced; title, poet:
    what the poem is written to (a string, or one per poem), for a model trained with conditions
    (`model.sampling.conditions`); title_plan: a title without keywords plans the words the poem is
    written around, forced (True), as hints ("hints") or not at all (False) (`model.sampling.title_plan`);
    rhyme: rhyme the even lines (needs form or acrostic); meter: 格律, every
    character's 平/仄 follows one of the form's standard patterns (needs form, implies rhyme);
    form `ci` with tune: a 词 to that tune (`model.sampling.tunes`; either script; a tune alone
    implies form=ci; form=ci alone draws a tune per 词 by its share of the corpus), rhyme and
    meter then the tune's;
    repetition_penalty: CTRL penalty on characters already in the poem (1.0 = off);
    temperature 0 = greedy; control: hard | soft | both (module docstring; None: both for a
    model with plan tokens, hard otherwise). Drawn plan tokens count in max_new_tokens.
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
    title_plan: Any = True  # True | "hints" | False (`model.sampling.title_plan`)
    poet: Any = ""  # str | list[str], one per poem
    tune: str = ""
    rhyme: bool = False
    meter: bool = False
    repetition_penalty: float = RECIPE.repetition_penalty
    use_cache: bool = True
    control: str | None = None


@lru_cache(maxsize=8)
def poem_boundaries(tok: Tokenizer) -> PoemBoundaries:
    """The `PoemBoundaries` of a tokenizer's vocabulary (built once per tokenizer; stateless); a
    line mark never follows a plan token either."""
    texts = [tok.decode([i]) for i in range(tok.vocab_size)]
    closers = torch.tensor([t.endswith(tuple(LINE_END[1:])) for t in texts])  # (V,) bool
    marks = torch.tensor([t.startswith(tuple(LINE_END)) for t in texts])  # (V,) bool
    after_mark = torch.tensor([t.endswith(tuple(LINE_END)) or tok.is_plan(i) for i, t in enumerate(texts)])  # (V,)
    return PoemBoundaries(closers, marks, after_mark, tok.bos_id, tok.eos_id)


def plan_grammar(tok: Tokenizer, real_rhymes: bool, ci: bool = False) -> PlanGrammar:
    """The `PlanGrammar` of a tokenizer with plan tokens; real_rhymes: the rhyme slot takes a
    level-tone group only, not `<无韵>` or a 词林正韵 class (soft `rhyme` of a 诗), or with `ci` a
    词林正韵 class only (soft `rhyme` of a 词, on a model with tune tokens)."""
    ids, V = plan_ids(tok), tok.vocab_size
    forms, rhymes, plan = (torch.zeros(V, dtype=torch.bool) for _ in range(3))  # (V,) each
    forms[ids.firsts] = True
    real = list(ids.ci_rhymes.values() if ci else ids.rhymes.values())
    rhymes[real if real_rhymes else [*ids.rhymes.values(), ids.none, *ids.ci_rhymes.values()]] = True
    plan[ids.all] = True
    return PlanGrammar(forms, rhymes, plan, tok.bos_id)


def row_tunes(opts: SamplingOptions) -> list[str]:
    """The tune of each 词 `opts` asks for: `tune` (either script) for every row, or with `form=ci`
    alone one drawn per row by its share of the corpus (`draw_tunes`, seeded by `opts.seed`); []
    when no 词 is asked for. raises ValueError for an unknown tune (with the nearest names)."""
    if opts.tune:
        return [find_tune(opts.tune)] * opts.num_samples
    return draw_tunes(opts.num_samples, opts.seed) if opts.form == CI else []


def resolve_control(control: str | None, has_plan: bool) -> str:
    """The control in force: `control`, or by default both (plan model) / hard. raises ValueError
    for an unknown control, or soft/both on a model without plan tokens."""
    if control is not None and control not in CONTROLS:
        raise ValueError(f"control={control!r} is not one of {', '.join(CONTROLS)}")
    control = control or ("both" if has_plan else "hard")
    if control != "hard" and not has_plan:
        raise ValueError(f"control={control} needs a model trained with plan tokens (data.plan_tokens=true); "
                         "this one has none: use control=hard")
    return control


def poem_steps(engine: Engine, opts: SamplingOptions,
               attention_rows: bool = False) -> tuple[torch.Tensor, Iterator[Step | torch.Tensor]]:
    """Check everything, then start sampling: returns (start (B, T0) int64, iterator of each
    drawn token's `Step` (`model.engine.Step`: ids (B, 1), its probability, the tokens the
    masks allowed, with `attention_rows` every layer's attention row), and of a prompt that follows
    a drawn plan as (B, n) int64, given, not drawn).

    `PoemBoundaries`: a poem ends only right after a sentence-final mark (。？！；), and a line
    mark never follows `<bos>`, a plan token or another mark; `PlanGrammar` for plan models;
    `form` fixes where lines end (module docstring for `control`). The model must be in eval
    mode for dropout-free sampling (`model.loading.load_engine` gives one).
    Every check runs before the first token: raises ValueError for bad sampling arguments or
    control (soft: no acrostic or meter, which are masks), a prompt or acrostic with invalid
    code points, outside the vocabulary, or breaking the form; max_new_tokens too small for the
    form and the plan tokens still to draw.
    """
    check_sampling_args(opts.temperature, opts.top_k, opts.top_p)
    if opts.num_samples < 1:
        raise ValueError(f"num_samples must be ≥ 1, got {opts.num_samples}")
    opts = with_plan(engine, opts)  # a title's planned words, as keywords
    tok, device = engine.tokenizer, engine.device
    ids = plan_ids(tok)
    control = resolve_control(opts.control, ids is not None)
    if control == "soft" and (opts.acrostic or opts.meter):
        given = " and ".join(name for name, on in (("acrostic", opts.acrostic), ("meter", opts.meter)) if on)
        what = "are masks, not plan tokens" if " and " in given else "is a mask, not a plan token"
        raise ValueError(f"{given} {what}: use control=hard or control=both")
    if opts.tune and opts.form not in (None, CI):
        raise ValueError(f"tune={opts.tune} writes a 词 (form=ci), not a {opts.form}: leave form= out or set form=ci")
    form = CI if opts.tune else opts.form
    if form is not None and form not in (*FORMS, CI):
        raise ValueError(f"unknown form {form!r}; choose one of {', '.join(FORMS)} or {CI} (with tune=)")
    if form == CI and control == "soft" and not ids.tunes:
        raise ValueError("this model has no tune plan tokens (an experiment=ci model has), so it keeps a tune by masks "
                         "only: use control=hard or both")
    prompt = engine.to_model_text(opts.prompt, "prompt")
    acrostic = engine.to_model_text(opts.acrostic, "acrostic")
    processors: list[LogitsProcessor] = [poem_boundaries(tok)]
    tunes = row_tunes(opts)
    constraint = None
    rows = [tuple(engine.to_model_text(w, "keywords") for w in row)
            for row in keyword_rows(opts.keywords, opts.num_samples)]
    if form == CI:  # soft: checks only
        forced = rows if opts.keywords_forced and any(rows) else []
        if forced:
            check_forced(tok, rows, control)
        constraint = TuneConstraint(tok, tunes, acrostic, opts.rhyme, opts.meter, engine.script, forced, prompt,
                                    opts.seed)
        constraint.check_keywords()
    elif control != "soft" and (form or acrostic or opts.rhyme or opts.meter):
        constraint = PoemConstraint(tok, form, acrostic, opts.rhyme, engine.script, opts.meter)
    if control == "hard" or not form:
        plans = [[]] * opts.num_samples  # each row's plan given, here none: drawn
    elif form == CI:
        plans = constraint.plans(opts.num_samples, opts.seed)  # a template's token per row
    else:
        plans = [[ids.forms[form]]] * opts.num_samples
    to_draw = PLAN_SLOTS - len(plans[0]) if ids else 0
    real_rhymes = control != "hard" and (opts.rhyme if form == CI else opts.rhyme or opts.meter) and \
        (form != CI or bool(ids and ids.ci_rhymes))  # a 词's: a 词林正韵 class, on a model with tune tokens
    grammar = plan_grammar(tok, real_rhymes, ci=form == CI) if ids else None
    if grammar:
        processors.append(grammar)
    if constraint is not None:
        constraint.check_text(prompt)
        needed = constraint.max_tokens() - len(prompt) + to_draw
        if opts.max_new_tokens < needed:
            raise ValueError(f"max_new_tokens={opts.max_new_tokens} is too few for this poem; it needs up to {needed}")
        if control != "soft":
            processors.append(constraint)
    if to_draw and opts.max_new_tokens <= to_draw:
        raise ValueError(f"max_new_tokens={opts.max_new_tokens} leaves no token for the poem after its "
                         f"{to_draw} plan token(s)")
    hints = [w for row in rows for w in row] if not opts.keywords_forced else []  # forced: keyword_processor checks
    if bad := next((w for w in hints if not all(map(is_hanzi, w)) or len(w) > MAX_FREE_LINE), None):
        raise ValueError(f"the keyword hint {bad!r} is not made of the characters of one line (CJK characters only, "
                         f"at most {MAX_FREE_LINE})")
    segments = condition_segments(engine, opts.title, opts.poet, rows, not opts.keywords_forced, opts.num_samples)
    if not opts.keywords_forced and any(rows) and not has_conditions(engine):
        raise ValueError("keywords_forced=false gives keywords as hints, which needs a model trained with them "
                         "(data.conditions); this one was trained without: leave keywords forced")
    if opts.keywords_forced and any(rows) and form != CI:  # a 词's: its TuneConstraint
        processors += keyword_processor(tok, rows, constraint, prompt, control, opts.max_new_tokens - to_draw,
                                        opts.seed)
    text = tok.encode(prompt)
    drawn_first = bool(to_draw and text)  # the plan comes before the prompt's text: draw it first
    width = max(map(len, segments))  # shorter segments are padded with <eos> in front, where a poem ends
    start = torch.tensor([[tok.eos_id] * (width - len(g)) + [tok.bos_id, *g, *plan, *([] if drawn_first else text)]
                          for g, plan in zip(segments * opts.num_samples if len(segments) == 1 else segments, plans)],
                         device=device)  # (B, T0)
    if opts.repetition_penalty != 1.0:
        penalised = torch.tensor([any(map(is_hanzi, tok.decode([i]))) for i in range(tok.vocab_size)])
        given = torch.tensor([ids.segment_mask(r) for r in start.tolist()], device=device) \
            if width else None  # (B, T0): the segments' positions

        def outside(idx: torch.Tensor) -> torch.Tensor:  # (B, T) → (B, T) bool
            return torch.nn.functional.pad(given, (0, idx.size(1) - given.size(1)))
        processors.append(RepetitionPenalty(opts.repetition_penalty, penalised, outside if width else None))
    gen = torch.Generator(device=device).manual_seed(opts.seed)
    draw = sampler(opts.temperature, opts.top_k, opts.top_p, gen, grammar.plan if grammar else None)

    def generate(idx: torch.Tensor, n: int) -> Iterator[Step]:
        return engine.steps(idx, n, draw, tok.eos_id, opts.use_cache, processors, attention_rows)

    def steps() -> Iterator[Step | torch.Tensor]:
        drawn = list(generate(start, to_draw))  # to_draw steps: PoemBoundaries allows no <eos> here
        yield from drawn
        prompt_ids = torch.tensor([text] * opts.num_samples, device=device)  # (B, len(text))
        yield prompt_ids
        yield from generate(torch.cat([start, *(s.ids for s in drawn), prompt_ids], dim=1),
                            opts.max_new_tokens - to_draw)

    return start, steps() if drawn_first else generate(start, opts.max_new_tokens)


def check_forced(tok: Tokenizer, rows: list[tuple[str, ...]], control: str) -> None:
    """raises ValueError for forced keywords no mask can write: a non-character tokenizer, soft
    control, a keyword with other than CJK characters."""
    if not isinstance(tok, CharTokenizer):
        raise ValueError("keywords need a character-level model (tokenizer=char)")
    if control == "soft":
        raise ValueError("forced keywords are masks, not plan tokens: use control=hard or control=both")
    if bad := next((w for row in rows for w in row if not all(map(is_hanzi, w))), None):
        raise ValueError(f"the keyword {bad!r} is not made of characters of a line (CJK characters only)")


def keyword_processor(tok: Tokenizer, rows: list[tuple[str, ...]], constraint: PoemConstraint | None,
                      prompt: str, control: str, max_new_tokens: int, seed: int = 0) -> list[KeywordConstraint]:
    """The `KeywordConstraint` forcing each row's keywords (rows: in the model's script; none:
    []; seed: its slot draws), checked before sampling. raises ValueError for a non-character tokenizer, soft
    control, a keyword with other than CJK characters, too few tokens, or keywords that cannot
    be placed (`KeywordConstraint.check`)."""
    if not any(rows):
        return []
    check_forced(tok, rows, control)
    needed = max(len(row) + 1 for row in rows) * (MAX_FREE_LINE + 1) + 1 if constraint is None else 0
    if needed > max_new_tokens:
        raise ValueError(f"max_new_tokens={max_new_tokens} is too few for these keywords without a form; "
                         f"they need up to {needed}")
    keywords = KeywordConstraint(tok, rows, constraint, prompt, max_new_tokens, seed)
    keywords.check()
    return [keywords]


def stream_poems(engine: Engine, opts: SamplingOptions) -> tuple[torch.Tensor, Iterator[torch.Tensor]]:
    """`poem_steps` as ids: (start (B, T0) int64, iterator of (B, n) int64 chunks: each drawn
    token (n = 1), and a prompt that follows a drawn plan (n = its length)). raises as `poem_steps`."""
    start, steps = poem_steps(engine, opts)
    return start, (s.ids if isinstance(s, Step) else s for s in steps)


def sample_ids(engine: Engine, opts: SamplingOptions) -> torch.Tensor:
    """`opts.num_samples` sequences sampled in one batch: (B, T) int64 ids from `<bos>` (plan
    and prompt included; rows that ended early padded with `<eos>`). raises as `stream_poems`."""
    start, steps = stream_poems(engine, opts)
    return torch.cat([start, *steps], dim=1)  # (B, T0 + n)


def sample_poems(engine: Engine, opts: SamplingOptions) -> list[str]:
    """`opts.num_samples` poems sampled in one batch, as text (prompt included, no line breaks,
    no plan tokens, no condition segment). The same options and seed give the same poems. raises as `stream_poems`.
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
