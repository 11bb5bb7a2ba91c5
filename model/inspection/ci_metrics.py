"""How close a set of 词 comes to the Song 词 of their tunes: format, rhyme, 平仄, copying, diversity.

Each 词 is plain text (marks included) with the tune it was written to; the figures read it
against that tune's templates (`data.verse.tunes`), in simplified script (the templates').

| name | what | over |
|---|---|---|
| `format` | SongNet's format score (Li et al. 2020, `eval_tpl` in its `metrics.py`): a line counts when the template's line at the same index has its length and closing mark; per 词, precision = counted ÷ its lines, recall = counted ÷ the template's lines; the F1 of the precisions' and recalls' means (macro) — against the tune's template that scores best | 词 |
| `match` | the 词's shape is one of its tune's templates | 词 |
| `rhyme` | the rhyme positions in their segment's commonest 词林正韵 class of the segment's tone (`rhyme_kept`) | rhyme positions of matching 词 |
| `tones` | the 平/仄 positions whose character has that tone (`tones_kept`) | fixed positions of matching 词 |
| `copy` | the line, marks stripped, at least four characters, is a line of a training 词 | such lines |
| `distinct_2` | distinct character bigrams ÷ all, within each 词 (as `poem_metrics`) | the first `n_distinct` 词 |
| `keywords` | every keyword the 词 was written with stands whole inside one of its lines (sets with keywords only) | 词 |
"""  # noqa: E501 (its table)
from __future__ import annotations

import unicodedata
from functools import lru_cache
from pathlib import Path

from data.corpus_io import iter_corpus
from data.paths import CORPUS_DIR
from data.verse.ci import CI_LINE_END, ci_lines
from data.verse.script import prompt_to_script
from data.verse.tunes import rhyme_kept, tones_kept, tunes, variant_of
from model.inspection.poem_metrics import distinct_n

CI_METRICS = ("n", "format", "match", "rhyme", "tones", "copy", "distinct_2", "keywords")
CI_CORPUS = CORPUS_DIR / "ci.jsonl.xz"
"""The shipped 词 corpus (package data of `data`): its training lines and held-out 词."""
MIN_COPY = 4
"""Shorter lines (三字句 such as 转朱阁) repeat across 词 by themselves: `copy` leaves them out."""


@lru_cache(maxsize=2)
def ci_training_lines(path: str = str(CI_CORPUS)) -> frozenset[str]:
    """The lines (marks stripped) of the training 词 of a 词 corpus. raises FileNotFoundError if missing."""
    return frozenset(line.rstrip(CI_LINE_END) for p in iter_corpus(path) if p["split"] == "train"
                     for line in ci_lines(p["text"]))


def heldout_ci(n: int, path: str | Path = CI_CORPUS) -> list[tuple[str, str]]:
    """(text, tune) of n held-out 词 whose tune has templates, evenly spaced over them in corpus order
    (all if fewer). raises FileNotFoundError if the corpus is missing."""
    known = tunes()
    held = [(p["text"], p["tune"]) for p in iter_corpus(path) if p["split"] == "val" and p["tune"] in known]
    return held if n >= len(held) else [held[i * len(held) // n] for i in range(n)]


def format_scores(text: str, tune: str) -> tuple[float, float]:
    """(precision, recall) of the 词's lines against the template of `tune` with the best F1
    (module docstring)."""
    lines = [(len(line.rstrip(CI_LINE_END)), line[-1]) for line in ci_lines(text)]
    best = (0.0, 0.0)
    for v in tunes()[tune]:
        target = v.lines
        counted = sum(a == b for a, b in zip(lines, target))
        p, r = counted / max(len(lines), 1), counted / len(target)
        if 2 * p * r / (p + r + 1e-16) > 2 * best[0] * best[1] / (sum(best) + 1e-16):
            best = (p, r)
    return best


def _rate(a: int, b: int) -> float | None:
    return a / b if b else None


def ci_metrics(poems: list[str], tune_names: list[str], script: str, train_lines: frozenset[str],
               n_distinct: int | None = None, keywords: list[list[str]] | None = None) -> dict:
    """The figures of the module docstring for `poems` written to `tune_names` (one per 词), in
    `script`; `keywords`: those each was written with (None: no `keywords` figure)."""
    if script != "simplified":
        poems = [prompt_to_script(p, "simplified") for p in poems]
    scores = [format_scores(p, t) for p, t in zip(poems, tune_names)]
    P = sum(p for p, _ in scores) / len(scores) if scores else 0.0
    R = sum(r for _, r in scores) / len(scores) if scores else 0.0
    variants = [variant_of(p, t) for p, t in zip(poems, tune_names)]
    rhyme = [rhyme_kept(p, v) for p, v in zip(poems, variants) if v]
    tone = [tones_kept(p, v) for p, v in zip(poems, variants) if v]
    lines = [line.rstrip(CI_LINE_END) for p in poems for line in ci_lines(p)]
    lines = [line for line in lines if len(line) >= MIN_COPY]
    return {
        "n": len(poems),
        "format": 2 * P * R / (P + R) if P + R else None,
        "match": _rate(sum(map(bool, variants)), len(poems)),
        "rhyme": _rate(sum(a for a, _ in rhyme), sum(b for _, b in rhyme)),
        "tones": _rate(sum(a for a, _ in tone), sum(b for _, b in tone)),
        "copy": _rate(sum(line in train_lines for line in lines), len(lines)),
        "distinct_2": distinct_n(poems[:n_distinct] if n_distinct else poems, 2),
        **({"keywords": _rate(sum(all(any(w in line for line in ci_lines(p)) for w in ws)
                                  for p, ws in zip(poems, keywords)), len(poems))} if keywords is not None else {}),
    }


def format_ci_table(rows: dict[str, dict]) -> str:
    """The 词 rows as a text table (percentages; `–` where undefined; `keywords` only when a set has it)."""
    shown = [m for m in CI_METRICS if m != "keywords" or any("keywords" in r for r in rows.values())]
    header = f"{'set':28} " + " ".join(f"{m:>10}" for m in shown)
    out = [header]
    for name, r in rows.items():
        cells = [f"{r['n']:>10}"] + [f"{'–':>10}" if r.get(m) is None else f"{r[m]:>10.1%}" for m in shown[1:]]
        wide = sum(unicodedata.east_asian_width(c) in "WF" for c in name)  # a CJK character takes two columns
        out.append(f"{name:{28 - wide}} " + " ".join(cells))
    return "\n".join(out)
