"""What each training poem is conditioned on (`data.conditions`, docs/conditions.md): its title,
its poet and its keywords, each given for a share of the poems, drawn once per poem.

The parts go into the poem's condition segment (`data.verse.plan.segment_ids`):
- title: the corpus's `title` field, cleaned (`data.verse.plan.clean_title`: before the first
  space, CJK only, at most 12 characters);
- poet: the corpus's `author` field, for the poets with at least `MIN_POET_POEMS` training
  poems (`poets`; the rarer ones get no poet part);
- keywords: 1 to 3 (uniformly) of the poem's TextRank keywords (`data.keywords.poem_keywords`),
  in a shuffled order, so that a keyword's place in the segment says nothing of its place in
  the poem.

A segment never pushes a poem out of its training window (`fitted`): parts are dropped, keywords
first, until `<bos>`, segment and poem fit in `block_size + 1` tokens, so a 七律 keeps its last
line in the window that holds its start. About 6 ms a poem on this project's CPU: the keyword share of the training poems
  costs about 2 minutes once, when the arrays are prepared.

The draws use their own generator (seed 0): the arrays, cached once, are every run's.
"""
from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

from data.keywords import poem_keywords
from data.verse.plan import EncodesPlans, PlanIds, clean_title, segment_ids

log = logging.getLogger(__name__)

CONDITIONS = ("title", "poet", "keywords")
MIN_POET_POEMS = 100
"""The fewest training poems a poet needs to be a condition (`poet=`)."""
MAX_KEYWORDS = 3


def segment_positions(tokens: np.ndarray, ids: PlanIds) -> np.ndarray:
    """(N,) bool over a token array: `PlanIds.segment_mask`, vectorised (the last marker at or
    before each position is later than the last segment end)."""
    tokens = np.asarray(tokens)
    pos = np.arange(len(tokens))
    marker = np.maximum.accumulate(np.where(np.isin(tokens, list(ids.segments.values())), pos, -1))
    return marker > np.maximum.accumulate(np.where(np.isin(tokens, ids.segment_ends), pos, -1))


def check_shares(shares: Mapping[str, float]) -> dict[str, float]:
    """`data.conditions` as {condition: share}; raises ValueError for an unknown condition or a
    share outside [0, 1]."""
    if bad := sorted(set(shares) - set(CONDITIONS)):
        raise ValueError(f"data.conditions: unknown {bad}; the conditions are {', '.join(CONDITIONS)}")
    if bad := {k: v for k, v in shares.items() if not 0 <= float(v) <= 1}:
        raise ValueError(f"data.conditions: shares must lie in [0, 1], got {bad}")
    return {k: float(shares.get(k, 0.0)) for k in CONDITIONS}


def poets(authors: Sequence[str]) -> dict[str, int]:
    """{poet: training poems} of the authors with at least `MIN_POET_POEMS`, the most prolific
    first; authors: one per training poem (in the model's script; "" for none)."""
    return {a: n for a, n in Counter(authors).most_common() if a and n >= MIN_POET_POEMS}


def fitted(tok: EncodesPlans, drawn: Mapping, room: int) -> list[int]:
    """The segment ids of one poem's drawn conditions (`draw_conditions`) in at most `room` tokens:
    its keywords dropped from the last, then the poet, then the title, until it fits ([] if nothing does)."""
    title, poet, keywords = drawn["title"], drawn["poet"], list(drawn["keywords"])
    while (seg := segment_ids(tok, title, poet, keywords)) and len(seg) > room:  # room < 0: a poem longer than a window
        if keywords:
            keywords.pop()
        elif poet:
            poet = ""
        else:
            title = ""
    return seg


def draw_conditions(texts: Sequence[str], titles: Sequence[str], authors: Sequence[str],
                    shares: Mapping[str, float], listed: Mapping[str, int], seed: int = 0) -> list[dict]:
    """Per poem, the conditions its segment holds: {"title": str, "poet": str, "keywords": [str]},
    "" / [] where not given. texts, titles, authors: the poems' (model's script); shares:
    `check_shares`'s; listed: `poets`' (a poet outside it is never given)."""
    rng = np.random.default_rng(seed)
    draws = rng.random((len(texts), len(CONDITIONS)))  # one draw per poem and condition
    counts = rng.integers(1, MAX_KEYWORDS + 1, len(texts))
    chosen = [i for i in range(len(texts)) if draws[i, 2] < shares["keywords"]]
    if chosen:
        log.info(f"data.conditions: TextRank keywords of {len(chosen):,} of {len(texts):,} training poems (the share "
                 f"{shares['keywords']} given keyword hints; about 6 ms each, once)")
    keywords = {i: poem_keywords(texts[i], int(counts[i])) for i in chosen}
    out = []
    for i, (title, author) in enumerate(zip(titles, authors)):
        words = list(keywords.get(i, []))
        rng.shuffle(words)
        out.append({"title": clean_title(title) if draws[i, 0] < shares["title"] else "",
                    "poet": author if draws[i, 1] < shares["poet"] and author in listed else "",
                    "keywords": words})
    return out
