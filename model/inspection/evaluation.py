"""The model's own poems measured beside held-out human ones: what `evaluate.py` prints and
`PoemEvaluationLogger` logs at the end of training.

A sample set is a way of asking for poems: `free` (from `<bos>`, no control), a form
(`wujue` …: `form=`), a form with rhyme (`wujue+rhyme`) or with 格律 (`wujue+meter`), and for
a model with plan tokens a form with rhyme as plan tokens only (`wujue+soft`: the form token
given, the rhyme slot restricted to real groups, no masks); and with forced keywords
(`keywords`, `wujue+keywords`, `wujue+rhyme+keywords`, `wujue+meter+keywords`,
`wujue+acrostic+keywords`), each poem with the keywords of one held-out poem
(`draw_keywords`); and for a model trained with conditions (`conditions`): `title` (each poem
the title of a held-out poem), `poet` (the model's poets in turn) and `hints` (a held-out
poem's keywords as hints only, `keywords_forced=false`). Every evaluation poem is drawn by
`sample_sets` through the one sampling path (`model.sampling.poems`), then measured by
`model.inspection.poem_metrics.poem_metrics` (for a plan model with the plans drawn: how
often a poem keeps its plan).
"""
from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Iterable, Sequence

from data.corpus_io import heldout_poems, heldout_titles
from data.keywords import poem_keywords
from data.tokenizer import CharTokenizer
from data.verse.ci import CI
from data.verse.meter import has_patterns
from data.verse.plan import plan_ids
from data.verse.poetry import FORMS, VERSE_FORMS
from model.engine import Engine
from model.inspection.ci_metrics import ci_metrics, ci_training_lines, heldout_ci
from model.inspection.poem_metrics import FORM_NAMES, keyword_placement, poem_metrics, training_lines
from model.sampling.conditions import known_poets
from model.sampling.poems import SamplingOptions, decide, poem_text, read_plans, sample_ids

SET_KINDS = ("free", "form", "rhyme", "meter", "soft", "keywords", "conditions", CI)
"""Kinds of sample sets: free sampling; and per form: the form alone, with rhyme, with meter
(each with the sampler's default control), and with rhyme as plan tokens only (`soft`);
`keywords`: free and per form alone, with rhyme, meter and an acrostic, each with forced keywords;
`conditions`: free poems for held-out titles (the title alone, `title_plan=false`: what the plan adds
is `benchmarks/conditions.py`'s), for each poet in turn, with keyword hints; `ci`: 词,
each to a tune drawn by its share (`ci`), and to each of the CI_TUNES by masks: its shape alone,
with rhyme, with rhyme and meter; to drawn tunes with a held-out 词's keywords (`ci+keywords`, and
with rhyme and meter `ci+meter+keywords`: `draw_ci_keywords`); for a model trained with tune tokens (`experiment=ci`) also
without masks, the tune's token as the plan (`ci+soft`, `浣溪沙+soft`), or else for a model
trained with conditions the tune given as the title (`浣溪沙+title`) (measured by
`model.inspection.ci_metrics` against the tune, beside held-out 词)."""
CI_TUNES = ("浣溪沙", "水调歌头", "鹧鸪天", "菩萨蛮", "念奴娇")
"""The five commonest tunes of the corpus: the `ci` kind's sets."""
HELD_OUT = "held-out"
"""A request's `keywords` or `title` that stands for each poem's own: the keywords (`draw_keywords`) or
the title of a held-out poem."""
EVERY_POET = "every poet"
"""A request's `poet` that stands for the model's poets in turn."""
ACROSTIC = "春夏秋冬风花雪月琴棋书画江山万里云水千秋"
"""The acrostic of a form's `+acrostic+keywords` set: its first characters, one per line."""
"""The acrostic of the `+acrostic+keywords` sets, by the form's line count."""
REFERENCE = "human (held-out)"
"""The name of the reference row: held-out poems of the corpus's validation split."""


def sample_requests(kinds: Iterable[str], forms: Iterable[str], char_model: bool = True,
                    plan_model: bool = False, conditions_model: bool = False, tunes_model: bool = False
                    ) -> dict[str, dict]:
    """Set name → the `SamplingOptions` fields that ask for it: `free` → {}, `wujue` →
    {form}, `wujue+rhyme` → {form, rhyme}, `wujue+meter` → {form, meter}, `wujue+soft` →
    {form, rhyme, control: soft}, `keywords` → {keywords: HELD_OUT}, `wujue+meter+keywords` →
    {form, meter, keywords: HELD_OUT} (and `+keywords`, `+rhyme+keywords`, `+acrostic+keywords`).

    char_model=False (a BPE model) drops the form, rhyme and meter sets: their masks need a
    character model; plan_model=False (no plan tokens) drops the soft sets; conditions_model=False
    the conditions sets; tunes_model=True (tune tokens) gives the 词 soft sets instead of `+title`.
    raises ValueError for an unknown kind or form.
    """
    kinds, forms = list(kinds), list(forms)
    if bad := [k for k in kinds if k not in SET_KINDS] + [f for f in forms if f not in VERSE_FORMS]:
        raise ValueError(f"unknown sample set kinds or forms {bad}; kinds: {', '.join(SET_KINDS)}; "
                         f"forms: {', '.join(VERSE_FORMS)}")
    requests = {"free": {}} if "free" in kinds else {}
    for form in forms:
        if "form" in kinds and char_model:
            requests[form] = {"form": form}
        for control in ("rhyme", "meter") if char_model else ():
            if control in kinds and (control == "rhyme" or has_patterns(form)):
                requests[f"{form}+{control}"] = {"form": form, control: True}
        if "soft" in kinds and plan_model and form in FORMS:  # a form with a plan token
            requests[f"{form}+soft"] = {"form": form, "rhyme": True, "control": "soft"}
    if "keywords" in kinds and char_model:
        requests["keywords"] = {"keywords": HELD_OUT}
        for form in forms:
            for extra in ({}, {"rhyme": True}, *([{"meter": True}] * has_patterns(form)),
                          {"acrostic": ACROSTIC[:VERSE_FORMS[form][0]]}):
                requests["+".join([form, *extra, "keywords"])] = {"form": form, **extra, "keywords": HELD_OUT}
    if "conditions" in kinds and conditions_model:
        requests.update(title={"title": HELD_OUT, "title_plan": False}, poet={"poet": EVERY_POET},
                        hints={"keywords": HELD_OUT, "keywords_forced": False})
    if CI in kinds and char_model:
        requests[CI] = {"form": CI}
        for tune in CI_TUNES:
            requests.update({tune: {"tune": tune}, f"{tune}+rhyme": {"tune": tune, "rhyme": True},
                             f"{tune}+meter": {"tune": tune, "rhyme": True, "meter": True}})
        requests.update({f"{CI}+keywords": {"form": CI, "keywords": HELD_OUT},
                         f"{CI}+meter+keywords": {"form": CI, "rhyme": True, "meter": True, "keywords": HELD_OUT}})
    if CI in kinds and tunes_model:  # no masks: the tune's plan token
        requests[f"{CI}+soft"] = {"form": CI, "control": "soft"}
        requests.update({f"{tune}+soft": {"tune": tune, "control": "soft"} for tune in CI_TUNES})
    elif CI in kinds and conditions_model:  # no masks: the tune named as the title
        requests.update({f"{tune}+title": {"title": tune, "title_plan": False, MEASURED_AS: tune} for tune in CI_TUNES})
    return requests


MEASURED_AS = "measured_as"
"""A request field (not a sampling option) naming the tune its free poems are measured against."""


def is_ci(fields: dict) -> bool:
    """Whether a request asks for 词 (measured by `ci_sets`, not `evaluation_rows`)."""
    return fields.get("form") == CI or bool(fields.get("tune")) or MEASURED_AS in fields


def ci_sets(engine: Engine, base: SamplingOptions, requests: dict[str, dict], n_reference: int
            ) -> tuple[dict[str, list[str]], dict[str, dict]]:
    """The 词 requests (`is_ci`) sampled with `base` (tunes drawn as the sampler draws them for
    `form=ci` alone) and measured by `ci_metrics` beside `n_reference` held-out 词 (the REFERENCE
    row) → (词 per set, rows). raises as `model.sampling.poems.poem_steps`."""
    poems, tune_names, keywords = {}, {}, {}
    for name, fields in requests.items():
        tune_names[name] = [fields[MEASURED_AS]] * base.num_samples if MEASURED_AS in fields else list(decide(
            engine, replace(base, **{k: v for k, v in fields.items() if k != "keywords"})).tunes)  # the sampler's
        fields = {k: v for k, v in fields.items() if k != MEASURED_AS}
        if fields.get("keywords") == HELD_OUT:
            keywords[name] = fields["keywords"] = draw_ci_keywords(engine, fields, tune_names[name])
        rows = sample_ids(engine, replace(base, **fields))
        poems[name] = [poem_text(engine.tokenizer, row) for row in rows]
    held = heldout_ci(n_reference)
    lines = ci_training_lines()
    n_distinct = base.num_samples
    rows = {REFERENCE: ci_metrics([t for t, _ in held], [u for _, u in held], "simplified", lines, n_distinct)}
    rows.update({name: ci_metrics(poems[name], tune_names[name], engine.script, lines, n_distinct, keywords.get(name))
                 for name in poems})
    return poems, rows


def draw_ci_keywords(engine: Engine, fields: dict, tune_names: list[str], k: int = 2) -> list[list[str]]:
    """Per 词 to write (its tune in `tune_names`), the k best keywords (`data.keywords.poem_keywords`,
    TextRank) of the next held-out 词 (`heldout_ci`, in turn) that it can hold with these
    controls, forced (`model.sampling.poems.decide`), or the first of them alone, or the next 词's (one
    with a character outside the vocabulary is passed over). raises ValueError if the held-out
    词 run out first."""
    sources, chosen, at = [t for t, _ in heldout_ci(10 ** 9)], [], 0
    for tune in tune_names:
        found = None
        while found is None:
            if at == len(sources):
                raise ValueError(f"only {len(chosen)} of {len(sources)} held-out 词 have keywords a 词 with {fields} "
                                 f"can hold; {len(tune_names)} are needed")
            try:
                words = [engine.to_model_text(w, "keywords") for w in poem_keywords(sources[at], k)]
            except ValueError:  # a character outside the vocabulary
                words = []
            at += 1
            for candidate in ([words] if len(words) > 1 else []) + [[w] for w in words]:
                try:
                    decide(engine, SamplingOptions(**{**fields, "tune": tune, "keywords": candidate,
                                                      "keywords_forced": True, "max_new_tokens": 10**4}))
                except ValueError:
                    continue
                found = candidate
                break
        chosen.append(found)
    return chosen


def draw_keywords(engine: Engine, fields: dict, sources: Sequence[str], n: int, k: int = 2
                  ) -> tuple[list[list[str]], list[int]]:
    """The keywords of n poems sampled with `fields` (SamplingOptions fields, no keywords): for
    each, the k best keywords of the next held-out poem (`data.keywords.poem_keywords`, TextRank)
    that the poem can hold with these controls, or the first of them alone, or the next poem's
    (a keyword outside the vocabulary, or one the form, tones or acrostic cannot place, is
    passed over) → (keywords per poem, the index in `sources` each came from). raises
    ValueError if the sources run out first."""
    tok, chosen, used = engine.tokenizer, [], []
    for i, source in enumerate(sources):
        words = [w for w in poem_keywords(source, k) if not tok.unknown(w)]
        for candidate in ([words] if len(words) > 1 else []) + [[w] for w in words]:
            try:
                decide(engine, SamplingOptions(**{**fields, "keywords": candidate, "keywords_forced": True,
                                                  "max_new_tokens": 10**4}))
            except ValueError:
                continue
            chosen.append(candidate)
            used.append(i)
            break
        if len(chosen) == n:
            return chosen, used
    raise ValueError(f"only {len(chosen)} of {len(sources)} held-out poems have keywords a poem with {fields} "
                     f"can hold; {n} are needed")


def sample_planned_sets(engine: Engine, base: SamplingOptions, requests: dict[str, dict],
                        sources: Sequence[str] = (), titles: Sequence[str] = ()
                        ) -> tuple[dict[str, list[str]], dict[str, list[dict] | None], dict[str, dict]]:
    """(set name → `base.num_samples` poems sampled with `base` updated by the request's fields,
    set name → the plans they were sampled with, `model.sampling.poems.read_plans`: None for a
    model without plan tokens, keyword set name → {"keywords": per poem, "sources": the index
    in `sources` of the held-out poem each came from}). A request's HELD_OUT keywords are drawn
    from `sources` (`draw_keywords`), HELD_OUT titles are `titles`' first, EVERY_POET the model's poets
    in turn. Seeded: the same model and options give the same poems.
    raises as `model.sampling.poems.poem_steps`, `draw_keywords`."""
    poems, plans, keywords = {}, {}, {}
    for name, fields in requests.items():
        if fields.get("keywords") == HELD_OUT:
            words, used = draw_keywords(engine, {k: v for k, v in fields.items() if k != "keywords"}, sources,
                                        base.num_samples)
            keywords[name] = {"keywords": words, "sources": used}
            fields = {**fields, "keywords": words}
        if fields.get("title") == HELD_OUT:
            fields = {**fields, "title": list(titles[:base.num_samples])}
        if fields.get("poet") == EVERY_POET:
            poets = list(known_poets(engine))
            fields = {**fields, "poet": [poets[i % len(poets)] for i in range(base.num_samples)]}
        rows = sample_ids(engine, replace(base, **fields))  # (B, T)
        poems[name] = [poem_text(engine.tokenizer, row) for row in rows]
        plans[name] = read_plans(engine.tokenizer, rows)
    return poems, plans, keywords


def sample_sets(engine: Engine, base: SamplingOptions, requests: dict[str, dict]) -> dict[str, list[str]]:
    """The poems of `sample_planned_sets` (requests without HELD_OUT keywords). raises as
    `model.sampling.poems.poem_steps`."""
    return sample_planned_sets(engine, base, requests)[0]


def reference_poems(corpus_path: str | Path, script: str, n: int) -> list[str]:
    """n held-out poems of the corpus (validation split, any form and length), in `script`,
    evenly spaced over the split in corpus order (all of them if it has fewer): the corpus
    opens with court and ritual songs (郊廟歌辭, 帝京篇), so its first poems are no fair sample.
    raises FileNotFoundError if the corpus is missing."""
    poems = heldout_poems(corpus_path, script, 10**9, FORM_NAMES, max_chars=10**9)
    return poems if n >= len(poems) else [poems[i * len(poems) // n] for i in range(n)]


def evaluation_rows(samples: dict[str, list[str]], reference: list[str], corpus_path: str | Path,
                    script: str, plans: dict[str, list[dict] | None] | None = None,
                    train_corpora: Sequence[str | Path] = (), keywords: dict[str, dict] | None = None,
                    pailv: Sequence[str] = ()) -> dict[str, dict]:
    """{REFERENCE: metrics of the human poems, set name: metrics of its poems, …}; distinct-n
    of every row over the same number of poems (the largest sample set's; the reference's
    first that many); plans: per set, the plans its poems were sampled with (the plan figures);
    train_corpora: the corpora whose training lines `copy` counts (default: corpus_path's);
    keywords: per keyword set, its poems' keywords (`sample_planned_sets`; the `keywords` figure);
    pailv: the sets of a 排律, measured with `VERSE_FORMS`. raises FileNotFoundError if the corpus is missing."""
    lines = frozenset().union(*(training_lines(str(p), script) for p in (train_corpora or [corpus_path])))
    n_distinct = max((len(p) for p in samples.values()), default=None)
    plans, keywords = plans or {}, keywords or {}
    return {REFERENCE: poem_metrics(reference, script, lines, n_distinct),
            **{name: poem_metrics(poems, script, lines, n_distinct, plans.get(name),
                                  keywords[name]["keywords"] if name in keywords else None,
                                  VERSE_FORMS if name in pailv else FORMS)
               for name, poems in samples.items()}}


def placement_rows(samples: dict[str, list[str]], keywords: dict[str, dict], reference: Sequence[str]
                   ) -> dict[str, dict]:
    """Where the keywords stand (`keyword_placement`): per keyword set, in its poems and, as
    `<set> (held-out)`, in the held-out poems they were drawn from."""
    rows = {}
    for name, drawn in keywords.items():
        rows[name] = keyword_placement(samples[name], drawn["keywords"])
        rows[f"{name} (held-out)"] = keyword_placement(
            [reference[i] for i in drawn["sources"]], drawn["keywords"])
    return rows


def sample_and_measure(engine: Engine, base: SamplingOptions, requests: dict[str, dict], corpus_path: str | Path,
                       n_reference: int, train_corpora: Sequence[str | Path] = ()
                       ) -> tuple[dict[str, list[str]], dict[str, list[dict] | None], dict[str, dict], dict[str, float],
                                  dict[str, dict]]:
    """`sample_planned_sets` (keywords drawn from the held-out poems), then `evaluation_rows` with
    the first n_reference held-out poems (and `copy` against the training lines of
    train_corpora, default corpus_path's), the model in eval mode meanwhile → (poems per set,
    plans per set, rows, seconds spent {"sampling", "metrics"}, keywords: per keyword set its
    poems' keywords, their sources, and `placement_rows`). raises as
    `model.sampling.poems.poem_steps`, `draw_keywords`; FileNotFoundError if the corpus is missing."""
    script, model = engine.script, engine.model
    start = time.perf_counter()
    reference = reference_poems(corpus_path, script, n_reference)
    titles = heldout_titles(corpus_path, script, base.num_samples) if any(
        r.get("title") == HELD_OUT for r in requests.values()) else []
    was_training = model.training
    model.eval()
    try:
        samples, plans, keywords = sample_planned_sets(engine, base, requests, reference, titles)
    finally:
        model.train(was_training)
    sampled = time.perf_counter()
    pailv = [name for name, fields in requests.items() if fields.get("form") in VERSE_FORMS and fields["form"] not in FORMS]
    rows = evaluation_rows(samples, reference, corpus_path, script, plans, train_corpora, keywords, pailv)
    if keywords:
        keywords = {**keywords, "placement": placement_rows(samples, keywords, reference)}
    return samples, plans, rows, {"sampling": sampled - start, "metrics": time.perf_counter() - sampled}, keywords


def is_char_model(engine: Engine) -> bool:
    """Whether the model's tokenizer is the character one (the poetry controls need it)."""
    return isinstance(engine.tokenizer, CharTokenizer)


def is_plan_model(engine: Engine) -> bool:
    """Whether the model was trained with plan tokens (`data.plan_tokens=true`)."""
    return bool(engine.tokenizer.plan)


def is_tunes_model(engine: Engine) -> bool:
    """Whether the model was trained with tune tokens (plan tokens and a 词 corpus, `experiment=ci`)."""
    return bool(is_plan_model(engine) and plan_ids(engine.tokenizer).tunes)
