"""Whether a head that looks at the rhyme is one the rhyme needs: a pattern (`attention_stats`)
tested by intervention (`head_effects`), on held-out nats and on free poems.

A head *looks at the rhyme* when its held-out `prev_line_rhyme` mass is flagged high. It is
called a **rhyme head** only if switching it off (zero ablation)
1. raises the nats at rhyme slots by more than the 95th percentile of random head sets of the
   same size (`head_effects.control`, over several seeds), and
2. lowers the rhyme rate of the regulated free poems by more than the sampling noise: the 95 %
   interval of the change lies below zero (Agresti & Caffo 2000, "Simple and effective
   confidence intervals for proportions and differences of proportions": add one success and
   one failure to each group, then the Wald interval).
Otherwise its label says what it looks at and that the rhyme does not need it. The same is
measured for the looking heads together, every head of each layer, and random sets the size of
the looking heads (the controls): redundancy shows as a set that costs rhyme when its heads
alone do not.
"""
from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from model.ablation import ablate
from model.engine import Engine
from model.inspection.evaluation import sample_sets
from model.inspection.head_effects import HeadScorer, control, head_name, random_sets
from model.inspection.poem_metrics import poem_metrics, training_lines
from model.sampling.poems import SamplingOptions

FREE = ("n", "regulated", "rhyme_regulated", "alternation", "nian", "dui", "distinct_2")
"""The free-poem figures reported per set (`poem_metrics` names)."""
Z95 = 1.959964


def looking_heads(rows: Sequence[Mapping]) -> list[str]:
    """Heads whose `prev_line_rhyme` mass is flagged high (`attention_stats.head_rows` rows) → names."""
    return [head_name(r["layer"], r["head"]) for r in rows if r["flags"].get("prev_line_rhyme") == "high"]


def difference_interval(hits: int, n: int, hits0: int, n0: int) -> tuple[float, float]:
    """95 % interval of the difference of two proportions hits/n − hits0/n0 (Agresti–Caffo:
    one success and one failure added to each group), as fractions."""
    p, p0 = (hits + 1) / (n + 2), (hits0 + 1) / (n0 + 2)
    half = Z95 * math.sqrt(p * (1 - p) / (n + 2) + p0 * (1 - p0) / (n0 + 2))
    return p - p0 - half, p - p0 + half


def free_poems(engine: Engine, sets: Mapping[str, Sequence[str]], seeds: Sequence[int], num_samples: int,
               corpus_path: str | Path) -> dict[str, dict]:
    """Free poems (sample.py's defaults, num_samples per seed, pooled over seeds) with each set of
    heads off → {name: {"heads", FREE figures…, "rhymed", "n_regulated", "change", "interval"}};
    `change` and `interval` (percentage points) against the set named "intact", which must be
    first and empty. Every head is on again at the end. raises as `sample_sets`."""
    lines = training_lines(str(corpus_path), engine.script)
    rows = {}
    try:
        for name, heads in sets.items():
            ablate(engine, heads)
            poems = [p for seed in seeds for p in sample_sets(engine, SamplingOptions(num_samples=num_samples, seed=seed),
                                                                {"free": {}})["free"]]
            m = poem_metrics(poems, engine.script, lines, num_samples)
            n_reg = round(m["regulated"] * m["n"])
            rows[name] = {"heads": list(heads), **{k: m[k] for k in FREE}, "n_regulated": n_reg,
                          "rhymed": round((m["rhyme_regulated"] or 0) * n_reg)}
    finally:
        ablate(engine, [])
    intact = rows[next(iter(sets))]
    for row in rows.values():
        row["change"] = 100 * ((row["rhyme_regulated"] or 0) - (intact["rhyme_regulated"] or 0))
        low, high = difference_interval(row["rhymed"], row["n_regulated"], intact["rhymed"], intact["n_regulated"])
        row["interval"] = [100 * low, 100 * high]
    return rows


def verdict(names: Sequence[str], pattern: str, slot: float, bar: float, free: Mapping | None) -> dict:
    """Whether the heads `names` (which look at the rhyme; `pattern` names how one head does) are rhyme heads:
    rhyme-slot Δ nats `slot` above the random sets' 95th percentile `bar`, and the free rhyme's
    95 % interval (`free_poems` row) below zero → {"heads", "nats_needed", "free_needed",
    "rhyme_head", "label" (what it looks at, and "the rhyme does not need it" when neither
    measure says so, or which one does), "measured"}."""
    nats_needed = slot > bar
    free_needed = free is not None and free["interval"][1] < 0
    what = f"{' + '.join(names)} off: rhyme-slot nats {slot:+.3f} (random sets' 95th percentile {bar:+.3f})"
    if free is not None:
        what += f", free rhyme {free['change']:+.1f} points (95 % interval {interval(free)})"
    if nats_needed and free_needed:
        label = "rhyme head" if len(names) == 1 else "rhyme heads together"
    else:
        it, them = ("it", "its") if len(names) == 1 else ("them together", "their")
        looks = "looks" if pattern == "previous-rhyme head" else "also looks"
        label = f"{pattern}: {looks} at the previous rhyme" if len(names) == 1 else "they look at the previous rhyme"
        if free_needed:
            label += (f"; not a rhyme head: the free rhyme drops without {it}, but {them} rhyme-slot cost is within "
                      "random heads'")
        elif nats_needed:
            label += (f"; not a rhyme head: {them} rhyme-slot cost is above random heads', but without {it} the free "
                      "rhyme moves within the sampling noise")
        else:
            label += f"; the rhyme does not need {it}"
    return {"heads": list(names), "nats_needed": nats_needed, "free_needed": free_needed,
            "rhyme_head": nats_needed and free_needed, "label": label, "measured": what}


def rhyme_study(engine: Engine, scorer: HeadScorer, rows: Sequence[Mapping], seeds: Sequence[int], per_seed: int,
                free_seeds: Sequence[int], num_samples: int, corpus_path: str | Path) -> dict:
    """The verdicts for the heads that look at the rhyme (`rows`: held-out `head_rows`), with
    the sets and controls they need → {"looking", "sets": {name: {"heads", kind: Δ}},
    "controls": {size: `control`}, "free": `free_poems` rows or None (num_samples 0), "verdicts",
    "seconds": {"nats", "free"}}.
    Sets: the looking heads together (two or more), every head of each layer, and
    len(free_seeds) random sets the looking heads' size (seeds 0, 1, …) for the free poems (none
    without looking heads)."""
    cfg, start = engine.model.cfg, time.perf_counter()
    looking = looking_heads(rows)
    patterns = {head_name(r["layer"], r["head"]): r["pattern"] for r in rows}
    sets = {"looking heads together": looking} if len(looking) > 1 else {}
    sets |= {f"layer {ly}": [head_name(ly, h) for h in range(cfg.n_head)] for ly in range(cfg.n_layer)}
    sizes = sorted({1, cfg.n_head, *(len(s) for s in sets.values())})
    controls = {size: control(scorer, size, seeds, per_seed) for size in sizes}
    seconds = {"nats": time.perf_counter() - start}
    free = None
    if num_samples:  # without looking heads, every layer's set still: what the rhyme needs
        randoms = random_sets(cfg.n_layer, cfg.n_head, len(looking), range(len(free_seeds)), 1) if looking else []
        free = free_poems(engine, {"intact": [], **{n: [n] for n in looking}, **sets,
                                   **{f"random set {i + 1}": s for i, s in enumerate(randoms)}},
                          free_seeds, num_samples, corpus_path)
        seconds["free"] = time.perf_counter() - start - seconds["nats"]
    verdicts = [verdict([n], patterns[n], scorer.delta([n])["rhyme_slot"], controls[1]["p95"]["rhyme_slot"],
                        free and free[n]) for n in looking]
    if len(looking) > 1:
        verdicts.append(verdict(looking, "", scorer.delta(looking)["rhyme_slot"],
                                controls[len(looking)]["p95"]["rhyme_slot"], free and free["looking heads together"]))
    return {"looking": looking, "sets": {n: {"heads": s, **scorer.delta(s)} for n, s in sets.items()},
            "controls": {str(k): v for k, v in controls.items()},
            "free": free, "free_settings": {"seeds": list(free_seeds), "num_samples": num_samples}, "verdicts": verdicts,
            "seconds": seconds}


def interval(row: Mapping) -> str:
    """A `free_poems` row's 95 % interval of the change, in points: "-10.0 to -0.6"."""
    return f"{row['interval'][0]:+.1f} to {row['interval'][1]:+.1f}"


def format_study(study: Mapping, kinds: Sequence[str]) -> str:
    """The sets, the controls, the free poems and the verdicts as text tables."""
    lines = [f"{'heads off':<26}" + "".join(f"{k:>12}" for k in kinds)]
    for name, s in study["sets"].items():
        lines.append(f"{name:<26}" + "".join(f"{s[k]:>+12.3f}" for k in kinds))
    for size, c in study["controls"].items():
        per_seed = len(c["sets"]) // len(c["seeds"])
        lines.append(f"{f'random sets of {size}: 95th pct':<26}" + "".join(f"{c['p95'][k]:>+12.3f}" for k in kinds)
                     + f"   ({per_seed} sets for each of seeds {c['seeds'][0]}–{c['seeds'][-1]})")
    if study["free"]:
        st = study["free_settings"]
        lines += ["", f"free poems, {st['num_samples']} per seed at seeds {', '.join(map(str, st['seeds']))}: "
                      "% of poems (reg), of regulated poems (rhy/reg), of lines, joins, couplets",
                  f"{'heads off':<26}{'n':>6}{'reg':>8}{'rhy/reg':>9}{'change':>9}{'95% interval':>17}"
                  f"{'alt246':>8}{'nian':>8}{'dui':>8}"]
        for name, r in study["free"].items():
            pct = [f"{100 * r[k]:>7.1f}%" if r[k] is not None else f"{'–':>8}" for k in ("alternation", "nian", "dui")]
            lines.append(f"{name:<26}{r['n']:>6}{100 * r['regulated']:>7.1f}%{100 * (r['rhyme_regulated'] or 0):>8.1f}%"
                         f"{r['change']:>+9.1f}{interval(r):>17}" + "".join(pct))
    lines += ["", "verdicts:"] + [f"  {v['label']} — {v['measured']}" for v in study["verdicts"]]
    return "\n".join(lines)


def finding(study: Mapping) -> str | None:
    """The study in two sentences: whether the heads that look at the rhyme are heads the rhyme needs, with the
    free poems' rhyme when they are switched off together, beside the largest drop outside the noise of any
    other set (not the random controls); without looking heads, that drop alone. None without the free poems."""
    if not study.get("free"):
        return None
    drops = sorted((r["change"], name) for name, r in study["free"].items()
                   if name != "intact" and not name.startswith("random") and r["interval"][1] < 0)
    if not study["looking"]:
        return ("No head looks at the previous line's rhyme more than the flag asks, so none is a candidate rhyme head. "
                + (f"Switched off, the largest drop in the share of free regulated poems that rhyme is without "
                   f"{drops[0][1]}, {-drops[0][0]:.1f} points (95 % interval {interval(study['free'][drops[0][1]])})."
                   if drops else "No layer switched off moves the share of free regulated poems that rhyme "
                   "beyond the noise."))
    off = next(r for r in study["free"].values() if sorted(r["heads"]) == sorted(study["looking"]))
    needed = off["interval"][1] < 0
    largest = f", while without {drops[0][1]} it falls by {-drops[0][0]:.1f} points" if drops else ""
    return (f"The heads that look at the previous line's rhyme, {' and '.join(study['looking'])}, are "
            f"{'' if needed else 'not '}heads the rhyme needs. Switched off together, they move the share of free "
            f"regulated poems that rhyme by {off['change']:+.1f} points, {'outside' if needed else 'within'} the noise "
            f"(95 % interval {interval(off)}){largest}.")
