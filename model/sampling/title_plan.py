"""The title's plan in sampling (`title_plan`): `title=` without `keywords=` becomes the words a poem
is written around, chosen by `data.title_plan.TitlePlanner` from the Tang training poems, and handed
to the keyword machinery as it is: forced (`title_plan=true`, the default: the sub-topics expansion
finds; `title_plan=echo`: the title's own words first, as before issue 60;
`model.sampling.keywords` places them where the model chooses), as hints in the
condition segment (`title_plan=hints`, a model trained with conditions), or not at all
(`title_plan=false`).

How many words (`data.title_plan.plan_size`): one a couplet of the form (a 绝句 2, a 律诗 4), four
for a free poem (`echo`: two), one per stanza of a 词's tune (浣溪沙 2, 如梦令 1). A
title the corpus never used (no character of it in a training title) plans nothing, and the poem
is written to the title alone, as with `title_plan=false`; `unplanned` is the line that says so.

`topic_lean`: the planned words also lean every step's logits toward the characters their poems use
(`TitlePlanner.leaning`, the engine's `TopicLean`), so the lines are written toward the words, not only
around them.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from data.keywords import per_row
from data.title_plan import check_mode, nothing_planned, plan_size, planner
from data.tokenizer import CharTokenizer
from model.decoding import TopicLean
from model.engine import Engine
from model.sampling.conditions import check_title


def topic_lean(engine: Engine, rows, titles, weight: float, start: int, line_len: int | None = None) -> TopicLean:
    """The engine's `TopicLean` toward each row's planned words: `weight` × the log-lift of each
    character toward them (`TitlePlanner.leaning`, the title's characters left out), bias (B or 1, V).
    rows: each row's words; titles: each row's title (either script; one for every row or one per
    row); start, line_len: as `TopicLean`'s."""
    lean, n, tok = planner(engine.script).leaning, max(len(rows), len(titles)), engine.tokenizer
    bias = torch.zeros(n, tok.vocab_size)  # (B, V), or (1, V) for every row
    for r, (words, title) in enumerate(zip(rows * n if len(rows) == 1 else rows, titles * n if len(titles) == 1
                                           else titles)):
        for c, v in lean(words, check_title(engine, title)).items():
            if (i := tok.stoi.get(c)) is not None:
                bias[r, i] = weight * v
    return TopicLean(bias, tok, start, line_len)


def plan_title(engine: Engine, title: str, size: int, echo: bool = False) -> list[str]:
    """The `size` words (`data.title_plan.plan_size`) planned for one title (either script; checked
    as `check_title`), in the model's script (echo: `title_plan=echo`'s); [] for no title. raises
    ValueError as `check_title`."""
    title = check_title(engine, title)
    return planner(engine.script).plan(title, size, echo) if title else []


def asks_for_plan(opts) -> bool:
    """Whether `opts` asks for a plan: a title, no keywords, `title_plan` not false."""
    has_keywords = opts.keywords if isinstance(opts.keywords, str) else any(opts.keywords or [])
    return not has_keywords and check_mode(opts.title_plan) is not False and any(
        per_row(opts.title, opts.num_samples, "title"))


def unplanned(opts, planned_words) -> str:
    """The line a caller prints when `with_plan` planned nothing for a title it was asked to plan
    for ("" otherwise): `planned_words` is what the plan gave (`Decision.title_plan_words`), None
    for nothing."""
    if planned_words is not None or not asks_for_plan(opts):
        return ""
    return "title_plan: " + (nothing_planned(opts.title, "control=soft forces nothing") if opts.control == "soft"
                             else nothing_planned(opts.title))


def with_plan(engine: Engine, opts, form: str | None = None, tune: str = ""):
    """`opts` (`SamplingOptions`) with its title's plan as keywords (one list per poem when the
    titles are one per poem), forced or as hints by `title_plan`; unchanged without a title, with
    keywords given, or with `title_plan=false`. form, tune: the poem's, as decided (`decide`: the
    tune resolved once, first), which size the plan (`plan_size`). The words are kept only where every
    character is in the model's vocabulary. A model with another tokenizer than characters, or
    `control=soft` (no masks), gets no forced plan: the title alone.
    raises ValueError for a bad `title_plan` or title."""
    mode = check_mode(opts.title_plan)
    if mode in (True, "echo") and (not isinstance(engine.tokenizer, CharTokenizer) or opts.control == "soft"):
        return opts  # forced keywords are masks of a character model: the title alone
    if not asks_for_plan(opts):
        return opts
    echo = mode == "echo"
    rows = [[w for w in plan_title(engine, t, plan_size(form, tune, echo), echo) if not engine.tokenizer.unknown(w)]
            for t in per_row(opts.title, opts.num_samples, "title")]
    if not any(rows):
        return opts
    return replace(opts, keywords=rows[0] if len(rows) == 1 else rows, keywords_forced=mode in (True, "echo"))
