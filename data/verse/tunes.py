"""Tunes (词牌) as data: each common tune's templates, derived from the training 词 of the
shipped corpus (`data/corpus/ci.jsonl.xz`), and the checks of a 词 against them.

A tune's **template** (`Variant`, one per 又一体 kept) is a shape (`data.verse.ci.shape_of`:
lines, their lengths and closing marks) and, per line, the stanza it is in, whether its last
character rhymes and in which rhyme segment (a tune may change rhyme: 菩萨蛮 rhymes 仄, 平, 仄, 平
by couplets), each segment's tone (平韵 or 仄韵), and the 平, 仄 or 中 (either) of every position.
How each is read from the corpus (`derive`):

- **variants**: the tune's shapes, commonest first, until they hold `COVERAGE` of its training
  词 (a shape of a single 词 is kept only if needed for that), leaving out fragments (less than
  half the commonest shape's characters) and shapes whose line ends do not rhyme together;
- **tones**: 词 of one length share a tune's 体, so tones are read per character position of
  the 词, whatever its punctuation: a position is 平 (仄) when at least `TONE_SHARE` of the
  词 of that length with a single-tone character there have a 平 (仄) one, else 中; where fewer
  than `MIN_EVIDENCE` 词 have that length every position is 中;
- **rhymes**: a line end rhymes when, in at least `RHYME_SHARE` of the 词 of that length, its
  character shares a 词林正韵 class (`data.verse.ci.rhyme_classes`) with another line end's;
  line ends that rhyme with each other that often form a segment, and the segment's tone is
  the tone of the classes they share most often; the last line end always rhymes (in the
  segment of the rhyme before it);
- **bound segments** (叶韵): a segment is bound to an earlier one of the other tone when in at least
  `BIND_SHARE` of the training 词 of the shape (at least `MIN_EVIDENCE` of them) every rhyme of
  both falls in one 部 of 词林正韵 (西江月 rhymes its 仄 lines in its 平 rhyme's 部);
- **stanza break** (上阕/下阕; the source does not mark it): a template has two stanzas when,
  after some rhyming line (at a segment's end when the rhyme changes), the two halves end with a
  run of at least two equal line lengths (the 下阕 repeats the 上阕's close), else one (单调); the
  break is then the rhyming line's end (at a segment's end when the rhyme changes) that leaves
  the halves nearest in characters, ties to the longer run (水龙吟: 52 and 50 characters, though
  its halves close differently).

`python -m data.build_tunes` writes them to `tunes.json` beside this file; a test checks the
shares each template claims against the corpus.
"""
from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, replace
from difflib import get_close_matches
from functools import lru_cache
from pathlib import Path
from typing import Iterable

from data.verse.ci import (
    CI_LINE_END,
    LEVEL,
    OBLIQUE,
    ci_lines,
    closed_lines,
    parse_shape,
    rhyme_classes,
    shape_of,
    tune_name,
)
from data.verse.meter import tones as char_tones
from data.verse.script import prompt_to_script

TUNES_PATH = Path(__file__).with_name("tunes.json")
ALIASES_PATH = Path(__file__).with_name("tune_aliases.json")
MIN_TUNE = 100
"""A tune gets templates when the corpus holds at least this many of its 词 (both splits)."""
COVERAGE = 0.9
TONE_SHARE = 0.8
MIN_EVIDENCE = 5
RHYME_SHARE = 0.5
BIND_SHARE = 0.5
EITHER = "中"
SCRIPT = "simplified"  # the corpus's script (as published)


@dataclass(frozen=True)
class Variant:
    """One template of a tune. shape: `shape_of`'s string; count: training 词 of this shape;
    stanza: the index of the 下阕's first line (None: one stanza); rhymes: per line, its rhyme
    segment (index into `segments`) or None; segments: each segment's tone (平 or 仄); tones: per
    line, one of 平/仄/中 per character; bound: per segment, the earlier segment whose 部 it rhymes
    in (叶韵), or None."""
    shape: str
    count: int
    stanza: int | None
    rhymes: tuple[int | None, ...]
    segments: tuple[str, ...]
    tones: tuple[str, ...]
    bound: tuple[int | None, ...] = ()

    @property
    def lines(self) -> list[tuple[int, str]]:
        """[(line length, closing mark)]."""
        return parse_shape(self.shape)

    def layout(self, rhyming: str = "{}", stanza_break: str = " | ") -> str:
        """The shape with `stanza_break` before the 下阕 and each rhyming line's length written
        through `rhyming` (a format string): `layout()` of 浣溪沙 = "7。7。7。 | 7，7。7。"."""
        parts = [f"{n if self.rhymes[i] is None else rhyming.format(n)}{mark}" for i, (n, mark) in enumerate(self.lines)]
        if self.stanza is not None:
            parts.insert(self.stanza, stanza_break)
        return "".join(parts)


def _body(text: str) -> str:
    return "".join(c for c in text if c not in CI_LINE_END)


def _ends(shape: str) -> list[int]:
    """The character index (in the 词 without marks) of each line's last character."""
    ends, at = [], 0
    for n, _ in parse_shape(shape):
        at += n
        ends.append(at - 1)
    return ends


def _position_tones(bodies: list[str]) -> str:
    """One of 平/仄/中 per character position of equally long bodies (module docstring)."""
    n = len(bodies[0])
    if len(bodies) < MIN_EVIDENCE:
        return EITHER * n
    table = char_tones("".join(bodies), SCRIPT)
    out = []
    for i in range(n):
        single = [next(iter(t)) for b in bodies if len(t := table[b[i]]) == 1]
        level = sum(t == LEVEL for t in single) / len(single) if single else 0.5
        out.append(LEVEL if level >= TONE_SHARE else OBLIQUE if 1 - level >= TONE_SHARE else EITHER)
    return "".join(out)


def _rhyme_segments(bodies: list[str], ends: list[int]) -> tuple[list[int | None], list[str]]:
    """Per line end its segment (or None) and each segment's tone, from equally long bodies."""
    classes = rhyme_classes(SCRIPT)
    shared = defaultdict(Counter)  # (i, j) → Counter of the tone of a shared class, and "n"
    for b in bodies:
        cls = [classes.get(b[e], frozenset()) for e in ends]
        for i in range(len(ends)):
            for j in range(i + 1, len(ends)):
                if cls[i] and cls[j]:
                    shared[i, j]["n"] += 1
                    common = cls[i] & cls[j]
                    for tone in {t for _, t in common}:
                        shared[i, j][tone] += 1 / len({t for _, t in common})
    linked = {(i, j) for (i, j), c in shared.items()
              if c["n"] and (c[LEVEL] + c[OBLIQUE]) / c["n"] >= RHYME_SHARE}
    parent = list(range(len(ends)))

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    for i, j in sorted(linked):
        parent[root(j)] = root(i)
    members = defaultdict(list)
    for i in range(len(ends)):
        if any(i in pair for pair in linked):
            members[root(i)].append(i)
    if members and not any(len(ends) - 1 in m for m in members.values()):  # a 词 ends on a rhyme:
        last = max(i for m in members.values() for i in m)  # the nearest segment's
        members[root(last)].append(len(ends) - 1)
    order = sorted(members.values(), key=min)
    segment_of: list[int | None] = [None] * len(ends)
    tones = []
    for s, group in enumerate(order):
        tally = Counter()
        for i in group:
            segment_of[i] = s
            for j in group:
                if i < j:
                    tally.update({t: shared[i, j][t] for t in (LEVEL, OBLIQUE)})
        tones.append(LEVEL if tally[LEVEL] >= tally[OBLIQUE] else OBLIQUE)
    return segment_of, tones


def _stanza(lengths: list[int], rhymes: list[int | None]) -> int | None:
    """The 下阕's first line (module docstring), or None for one stanza."""
    changes = len({r for r in rhymes if r is not None}) > 1
    breaks = []  # (characters apart, -run, b)
    for b in range(1, len(lengths)):
        if rhymes[b - 1] is None or (changes and rhymes[b] == rhymes[b - 1]):
            continue
        first, second = lengths[:b], lengths[b:]
        run = 0
        while run < min(len(first), len(second)) and first[-1 - run] == second[-1 - run]:
            run += 1
        breaks.append((abs(sum(first) - sum(second)), -run, b))
    return min(breaks)[2] if any(-run >= 2 for _, run, _ in breaks) else None


def derive(poems: Iterable[dict], min_tune: int = MIN_TUNE) -> dict[str, list[Variant]]:
    """Tune name → its templates (module docstring), for every tune with at least `min_tune` 词
    among `poems` (corpus records with `tune`, `shape`, `split`, `text`), from their training 词."""
    poems = [p for p in poems if p.get("tune")]
    counts = Counter(p["tune"] for p in poems)
    out = {}
    for tune in sorted((t for t, n in counts.items() if n >= min_tune), key=lambda t: (-counts[t], t)):
        train = [p for p in poems if p["tune"] == tune and p["split"] == "train"]
        shapes = Counter(p["shape"] for p in train)
        by_length = defaultdict(list)
        for p in train:
            by_length[len(_body(p["text"]))].append(p)
        variants, held = [], 0
        commonest = sum(n for n, _ in parse_shape(shapes.most_common(1)[0][0]))
        for shape, count in shapes.most_common():
            if held >= COVERAGE * len(train):
                break
            lengths = [n for n, _ in parse_shape(shape)]
            if sum(lengths) < commonest / 2:
                continue  # a fragment of the tune
            same = by_length[sum(lengths)]
            bodies = [_body(p["text"]) for p in same]
            ends = _ends(shape)
            rhymes, segments = _rhyme_segments([_body(p["text"]) for p in same if p["shape"] == shape]
                                               if count >= MIN_EVIDENCE else bodies, ends)
            if not segments:
                continue  # no line end rhymes with another: not a template of this tune
            held += count
            position_tones = _position_tones(bodies)
            starts = [e - n + 1 for e, n in zip(ends, lengths)]
            v = Variant(shape, count, _stanza(lengths, rhymes), tuple(rhymes), tuple(segments),
                        tuple(position_tones[s:e + 1] for s, e in zip(starts, ends)))
            variants.append(replace(v, bound=_bound([p["text"] for p in train if p["shape"] == shape], v)))
        out[tune] = variants
    return out


def _shared_bu(text: str, v: Variant, s: int) -> frozenset[int]:
    """The 部 every rhyme position of segment s has a class of, in the segment's tone."""
    classes, body = rhyme_classes(SCRIPT), _body(text)
    chars = [body[e] for e, r in zip(_ends(v.shape), v.rhymes) if r == s and e < len(body)]
    return frozenset.intersection(*(frozenset(k[0] for k in classes.get(c, ()) if k[1] == v.segments[s]) for c in chars))


def bind_share(texts: Iterable[str], v: Variant, a: int, b: int) -> tuple[int, int]:
    """(词 all of whose rhymes of segments a and b fall in one 部, 词) among `texts` of `v`'s shape."""
    texts = list(texts)
    return sum(bool(_shared_bu(t, v, a) & _shared_bu(t, v, b)) for t in texts), len(texts)


def _bound(texts: list[str], v: Variant) -> tuple[int | None, ...]:
    """Per segment, the earlier one of the other tone it is bound to (module docstring); () for none."""
    out = [None] * len(v.segments)
    for b in range(1, len(v.segments)) if len(texts) >= MIN_EVIDENCE else ():
        out[b] = next((a for a in range(b) if v.segments[a] != v.segments[b]
                       and (share := bind_share(texts, v, a, b))[1] and share[0] / share[1] >= BIND_SHARE), None)
    return tuple(out) if any(x is not None for x in out) else ()


def write(tunes: dict[str, list[Variant]], path: Path = TUNES_PATH) -> None:
    """Write `derive`'s templates as JSON (tune → list of variants), one variant a line."""
    def dump(obj) -> str:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))

    tunes_ = [f"{dump(tune)}:[\n" + ",\n".join(dump({k: x for k, x in asdict(v).items() if x or k != "bound"})
                                               for v in variants) + "]"
              for tune, variants in tunes.items()]
    path.write_text("{\n" + ",\n".join(tunes_) + "\n}\n", encoding="utf-8")


@lru_cache(maxsize=None)
def tunes(path: Path = TUNES_PATH) -> dict[str, tuple[Variant, ...]]:
    """The shipped templates: tune name → its variants, commonest first."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return {tune: tuple(Variant(**{**v, "rhymes": tuple(v["rhymes"]), "segments": tuple(v["segments"]),
                                   "tones": tuple(v["tones"]),
                                   "bound": tuple(v.get("bound", ()))}) for v in variants)
            for tune, variants in data.items()}


def variant_of(text: str, tune: str, templates: dict[str, tuple[Variant, ...]] | None = None) -> Variant | None:
    """The template of `tune` whose shape is the 词's (`shape_of`), or None (another shape, or a
    tune without templates)."""
    shape = shape_of(text)
    return next((v for v in (templates or tunes()).get(tune, ()) if v.shape == shape), None)


def stanzas(text: str, tune: str) -> list[str]:
    """A 词 cut at its stanza break (上阕, 下阕) when it has the shape of a template of `tune` with
    two stanzas, else [text]: `stanzas(<a 浣溪沙>, "浣溪沙")` = [its first three lines, the last three]."""
    variant = variant_of(text, tune)
    if variant is None or variant.stanza is None:
        return [text]
    lines = ci_lines(text)
    return ["".join(lines[:variant.stanza]), "".join(lines[variant.stanza:])]


def stanza_ends(text: str, tune: str) -> bool:
    """Whether a 词 being written to `tune` has just closed its 上阕: `text` (so far) ends with a
    line's mark, and every template of the tune its lines still fit has its stanza break there."""
    shape, rest = closed_lines(text)
    if not shape or rest:
        return False
    fits = [v for v in tunes().get(tune, ()) if v.lines[:len(shape)] == shape]
    return bool(fits) and all(v.stanza == len(shape) for v in fits)


def segment_rhyme(text: str, variant: Variant, segment: int) -> tuple[tuple[int, str] | None, int, int]:
    """(the 词林正韵 class of the segment's tone that most of its rhyme positions share, or None;
    the positions that have it; the segment's positions written) in a 词 of `variant`'s shape, or
    the start of one (the positions it has written)."""
    classes, body = rhyme_classes(SCRIPT), _body(text)
    chars = [body[e] for e, r in zip(_ends(variant.shape), variant.rhymes) if r == segment and e < len(body)]
    tally = Counter(c for ch in chars for c in classes.get(ch, ()) if c[1] == variant.segments[segment])
    best = tally.most_common(1)[0] if tally else (None, 0)
    return best[0], best[1], len(chars)


def rhyme_kept(text: str, variant: Variant) -> tuple[int, int]:
    """(rhyme positions kept, rhyme positions) of a 词 of `variant`'s shape: in each segment, the
    positions whose character has the 词林正韵 class of the segment's tone that most of them share."""
    found = [segment_rhyme(text, variant, s)[1:] for s in range(len(variant.segments))]
    return sum(k for k, _ in found), sum(n for _, n in found)


def tones_kept(text: str, variant: Variant) -> tuple[int, int]:
    """(平/仄 positions whose character can have that tone, 平/仄 positions) of a 词 of
    `variant`'s shape (a polyphonic character fits either; one outside the table fits none)."""
    body, pattern = _body(text), "".join(variant.tones)
    table = char_tones(body, SCRIPT)
    fixed = [(c, t) for c, t in zip(body, pattern) if t != EITHER]
    return sum(t in table[c] for c, t in fixed), len(fixed)


NEAR = 0.5
"""How alike (difflib's ratio: twice the characters in common over both lengths) a tune name must
be to another to be named as the nearest: 浣溪 and 浣溪沙 0.8, 浣纱 and 蓦山溪 0.0."""


def derive_aliases(poems: Iterable[dict], known: Iterable[str]) -> dict[str, str]:
    """The other names of the tunes `known`, from the corpus's headings `A・B` (a 词 published as A
    and sung to the tune B: 浣溪纱・浣溪沙, 酹江月・念奴娇): A → the known B most of A's 词 go to (ties: the
    first in name order), for every A that is not itself a known tune; sorted by A."""
    known, tally = set(known), defaultdict(Counter)
    for p in poems:
        other, *_ = p.get("heading", "").split("・")
        if p.get("tune") in known and "・" in p.get("heading", "") and other.strip() not in known:
            tally[other.strip()][p["tune"]] += 1
    return {a: min(c, key=lambda t: (-c[t], t)) for a, c in sorted(tally.items())}


def write_aliases(aliases: dict[str, str], path: Path = ALIASES_PATH) -> None:
    """Write `derive_aliases`'s names as JSON, one a line."""
    path.write_text(json.dumps(aliases, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")


@lru_cache(maxsize=None)
def tune_aliases(path: Path = ALIASES_PATH) -> dict[str, str]:
    """The shipped other names of the tunes (`derive_aliases`): name → tune."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


def find_tune(name: str) -> str:
    """A user's tune name (either script; `A・B` gives B, as the corpus's headings; another name
    the corpus publishes a tune's 词 under, `tune_aliases`: 浣溪紗 and 浣溪纱 give 浣溪沙) → the
    name of its templates. raises ValueError for an unknown tune, with the nearest names (up to 3
    with a ratio of at least NEAR, the nearest first)."""
    known = tunes()
    simplified = prompt_to_script(tune_name(name) or name.strip(), "simplified")
    simplified = tune_aliases().get(simplified, simplified) if simplified not in known else simplified
    if simplified in known:
        return simplified
    near = get_close_matches(simplified, known, n=3, cutoff=NEAR)
    raise ValueError(f"tune={name} is not one of the {len(known)} tunes with templates (each with ≥ {MIN_TUNE} 词 in "
                     f"the corpus); {'nearest: ' + ', '.join(near) if near else 'no tune name is near it'}. "
                     "List them: python sample.py tunes=list")


def draw_tunes(n: int, seed: int) -> list[str]:
    """`n` tunes drawn (seeded) by their share of the corpus (the training 词 their templates hold)."""
    known = tunes()
    names = list(known)
    return random.Random(seed).choices(names, weights=[sum(v.count for v in known[t]) for t in names], k=n)
