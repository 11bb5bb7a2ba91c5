"""How close a set of poems comes to Tang regulated verse: form, rhyme, 平仄, copying, diversity.

Poems are plain text (marks included, no `<bos>`/`<eos>`) in the model's script. Rates are
fractions in [0, 1] over the poems, lines or line pairs named below, None where the
denominator is empty. The tone checks are `data/verse/meter.py`'s (平水韵, a polyphonic character
fits either tone, one outside the table fits none).

| name | what | over |
|---|---|---|
| `regulated` | 4 or 8 lines of 5 or 7 characters (`data.verse.poetry.form_of`) | poems |
| `wujue` … `other` | the form mix (`wupai`, `qipai`: sets of a 排律, measured with `VERSE_FORMS`) | poems |
| `level_finals` | the even lines' last characters all have a level tone | regulated poems |
| `rhyme` | … and share one 平水韵 level-tone group | regulated poems with level finals |
| `rhyme_regulated` | the even lines' finals share one level-tone group | regulated poems |
| `alternation` | 2nd, 4th (6th) characters alternate 平/仄 (二四六分明) | lines of regulated poems |
| `nian` | 黏: a couplet's first line keeps the tones of the line before at 2nd, 4th (6th) | line pairs across couplets |
| `dui` | 对: a couplet's lines oppose at 2nd, 4th (6th) | couplets of regulated poems |
| `meter` | every character fits one of the form's standard patterns (`data.verse.meter.patterns`) | regulated poems of a form with patterns (lines of 5 or 7) |
| `meter_relaxed` | the same with 1st, 3rd (5th) characters free (一三五不论) | regulated poems |
| `copy` | the line, marks stripped, occurs verbatim in a training poem | lines |
| `distinct_1`, `distinct_2` | distinct character n-grams ÷ all n-grams, within each poem's characters (Li et al. 2016, "A Diversity-Promoting Objective Function for Neural Conversation Models") | the first `n_distinct` poems |
| `plan_form` | the poem has the form its plan tokens name (`data/verse/plan.py`) | poems with a plan |
| `plan_rhyme` | the poem's even lines rhyme in the group its plan names (`data.verse.plan.poem_rhyme_groups`), or in none for `<无韵>` | poems with a plan |
| `keywords` | every keyword the poem was asked for stands in it, whole, inside one line | poems sampled with keywords |
"""  # noqa: E501 (its tables)
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from data.corpus_io import iter_corpus
from data.verse.meter import alternates, has_patterns, matching_patterns, opposed, poem_lines, shared_rhyme_groups, sticks
from data.verse.plan import poem_rhyme_groups
from data.verse.poetry import FORMS, VERSE_FORMS, form_of, keyword_places, split_lines
from data.verse.rhyme import rhyme_groups
from data.verse.script import corpus_to_script

FORM_NAMES = (*FORMS, "other")
PAILV = tuple(f for f in VERSE_FORMS if f not in FORMS)
"""The forms the corpus counts as `other` (the 排律): a set of them is measured with `VERSE_FORMS`."""
PLAN_METRICS = ("plan_form", "plan_rhyme")
"""The figures defined only for poems sampled with plan tokens."""
OPTIONAL_METRICS = (*PLAN_METRICS, "keywords")
"""The figures defined only for some sets (plans; keywords): a table shows them where a row has them."""
METRICS = ("n", "regulated", *FORM_NAMES, "level_finals", "rhyme", "rhyme_regulated", "alternation", "nian",
           "dui",
           "meter", "meter_relaxed", "copy", "distinct_1", "distinct_2", *OPTIONAL_METRICS)
"""The figures of `poem_metrics`, in table order (`n`: the number of poems)."""

HEADERS = {"n": "n", "regulated": "reg", **{f: f for f in VERSE_FORMS},
           "other": "other", "level_finals": "lvlfin", "rhyme": "rhyme", "rhyme_regulated": "rhy/reg",
           "alternation": "alt246", "nian": "nian", "dui": "dui", "meter": "meter", "meter_relaxed": "m-135",
           "copy": "copy", "distinct_1": "dist-1", "distinct_2": "dist-2", "plan_form": "pl-form",
           "plan_rhyme": "pl-rhy", "keywords": "kw"}
"""Short ASCII column titles of `format_table` (CJK titles would break a terminal's alignment)."""


@lru_cache(maxsize=4)
def training_lines(corpus_path: str | Path, script: str) -> frozenset[str]:
    """Every line (marks stripped) of the corpus's training-split poems, in `script`: what
    `copy` compares against. Cached per (path, script). raises FileNotFoundError if the
    corpus is missing, ValueError for an unknown script."""
    texts = [p["text"] for p in iter_corpus(corpus_path) if p["split"] == "train"]
    return frozenset(line for text in corpus_to_script(texts, script) for line in poem_lines(text))


def _rate(hits: int, total: int) -> float | None:
    return hits / total if total else None


def distinct_n(poems: list[str], n: int) -> float | None:
    """Distinct n-grams ÷ all n-grams of the poems' characters (marks removed, n-grams within
    one poem, across its lines); None if there are none."""
    grams = []
    for poem in poems:
        chars = "".join(poem_lines(poem))
        grams += [chars[i : i + n] for i in range(len(chars) - n + 1)]
    return _rate(len(set(grams)), len(grams))


def plan_match(poems: list[str], plans: list[dict | None], script: str) -> dict[str, float | None]:
    """`plan_form` and `plan_rhyme` (module docstring) of poems and the plans they were sampled
    with ({"form": name, "rhyme": group or None}, as `model.sampling.poems.read_plans` gives;
    None for a poem without one)."""
    planned = [(p, plan) for p, plan in zip(poems, plans) if plan is not None]
    forms = sum(form_of(p) == plan["form"] for p, plan in planned)
    rhymes = 0
    for p, plan in planned:
        groups = poem_rhyme_groups(p, script)
        rhymes += plan["rhyme"] in groups if plan["rhyme"] else not groups
    return {"plan_form": _rate(forms, len(planned)), "plan_rhyme": _rate(rhymes, len(planned))}


def poem_metrics(poems: list[str], script: str, train_lines: frozenset[str], n_distinct: int | None = None,
                 plans: list[dict | None] | None = None, keywords: list[list[str]] | None = None,
                 forms: dict[str, tuple[int, int]] = FORMS) -> dict:
    """The `METRICS` of a set of poems (see the module docstring for each).

    script: the poems' script (for the tone tables); train_lines: `training_lines`;
    n_distinct: distinct-n over the first n_distinct poems only (default all), so that sets
    of different sizes are compared on the same count; plans: the plan each poem was sampled
    with (`plan_match`; None: no plans, the plan figures are None); keywords: the keywords each
    poem was asked for (None: the `keywords` figure is None); forms: the regulated forms
    (`VERSE_FORMS` for a set of a 排律). → {name: int | float | None}.
    """
    names, forms = (*forms, "other"), [form_of(p, forms) for p in poems]
    regulated = [poem_lines(p) for p, f in zip(poems, forms) if f != "other"]
    level = rhymed = alternating = n_lines = nian = n_joins = dui = n_couplets = strict = relaxed = metered = 0
    for lines, form in zip(regulated, (f for f in forms if f != "other")):
        finals = [line[-1] for line in lines[1::2]]
        groups = rhyme_groups(finals, script)
        level += all(c in groups for c in finals)
        rhymed += bool(shared_rhyme_groups(finals, script))
        alternating += sum(alternates(line, script) for line in lines)
        n_lines += len(lines)
        nian += sum(sticks(a, b, script) for a, b in zip(lines[1::2], lines[2::2]))
        n_joins += len(lines) // 2 - 1
        dui += sum(opposed(a, b, script) for a, b in zip(lines[0::2], lines[1::2]))
        n_couplets += len(lines) // 2
        metered += has_patterns(form)  # a form with the standard patterns
        strict += bool(matching_patterns(lines, form, script))
        relaxed += bool(matching_patterns(lines, form, script, relaxed=True))
    all_lines = [line for p in poems for line in poem_lines(p)]
    sample = poems[:n_distinct] if n_distinct else poems
    return {
        "n": len(poems),
        "regulated": _rate(len(regulated), len(poems)),
        **{f: _rate(forms.count(f), len(poems)) for f in names},
        "level_finals": _rate(level, len(regulated)),
        "rhyme": _rate(rhymed, level),
        "rhyme_regulated": _rate(rhymed, len(regulated)),
        "alternation": _rate(alternating, n_lines),
        "nian": _rate(nian, n_joins),
        "dui": _rate(dui, n_couplets),
        "meter": _rate(strict, metered),
        "meter_relaxed": _rate(relaxed, metered),
        "copy": _rate(sum(line in train_lines for line in all_lines), len(all_lines)),
        "distinct_1": distinct_n(sample, 1),
        "distinct_2": distinct_n(sample, 2),
        **plan_match(poems, plans or [None] * len(poems), script),
        "keywords": None if keywords is None else _rate(
            sum(len(keyword_places(p, ws)) == len(ws) for p, ws in zip(poems, keywords)), len(poems)),
    }


PLACES = ("first_line", "last_line", "first_half", "head", "tail", "alone")
"""`keyword_placement`'s figures."""


def keyword_placement(poems: list[str], keywords: list[list[str]]) -> dict[str, float | int | None]:
    """Where keywords stand in poems (each poem's own keywords, the first place each stands):
    shares of the keywords found that stand in the first line, the last line, the first half of
    the lines, at a line's head (its first character), at its tail (its last), and alone in
    their line (no other keyword there); `n`: keywords found."""
    found = []
    for poem, words in zip(poems, keywords):
        n_lines, places = len(split_lines(poem)), keyword_places(poem, words)
        lines = [line for line, _, _ in places.values()]
        found += [(line, at, size, len(w), n_lines, lines.count(line) == 1) for w, (line, at, size) in places.items()]
    n = len(found)
    return {"n": n, "first_line": _rate(sum(f[0] == 0 for f in found), n),
            "last_line": _rate(sum(f[0] == f[4] - 1 for f in found), n),
            "first_half": _rate(sum(f[0] < f[4] / 2 for f in found), n),
            "head": _rate(sum(f[1] == 0 for f in found), n), "tail": _rate(sum(f[1] + f[3] == f[2] for f in found), n),
            "alone": _rate(sum(f[5] for f in found), n)}


def format_table(rows: dict[str, dict]) -> str:
    """{set name: `poem_metrics`} → a text table, one row per set: n, then percentages
    (distinct-n as fractions), `–` where a figure is undefined; the `OPTIONAL_METRICS` and `PAILV`
    columns only where some row has them."""
    width = max(len(name) for name in rows) + 2
    shown = (*METRICS[:2 + len(FORMS)], *PAILV, *METRICS[2 + len(FORMS):])  # a 排律 set's form after the four
    columns = [m for m in shown if m not in (*OPTIONAL_METRICS, *PAILV) or any(row.get(m) is not None
                                                                                 for row in rows.values())]
    lines = [f"{'':<{width}}" + "".join(f"{HEADERS[m]:>8}" for m in columns)]
    for name, row in rows.items():
        cells = []
        for m in columns:
            v = row.get(m)
            if v is None:
                cells.append(f"{'–':>8}")
            elif m == "n":
                cells.append(f"{v:>8d}")
            elif m.startswith("distinct"):
                cells.append(f"{v:>8.3f}")
            else:
                cells.append(f"{100 * v:>7.1f}%")
        lines.append(f"{name:<{width}}" + "".join(cells))
    return "\n".join(lines)


def format_placement(rows: dict[str, dict]) -> str:
    """{name: `keyword_placement`} → a text table: n, then the `PLACES` shares in percent."""
    width = max(len(name) for name in rows) + 2
    lines = [f"{'':<{width}}{'n':>6}" + "".join(f"{p:>11}" for p in PLACES)]
    for name, row in rows.items():
        cells = "".join(f"{'–':>11}" if row[p] is None else f"{100 * row[p]:>10.1f}%" for p in PLACES)
        lines.append(f"{name:<{width}}{row['n']:>6d}{cells}")
    return "\n".join(lines)
