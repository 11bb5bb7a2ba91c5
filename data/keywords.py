"""Keywords of a poem, as the planning-based poetry systems take them (Wang et al. 2016,
"Chinese Poetry Generation with Planning based Neural Network", §3.1: TextRank over the
segmented words): jieba's word segmentation and its TextRank (`jieba.analyse.textrank`,
Mihalcea & Tarau 2004), a co-occurrence graph of the poem's words in a window of 5, ranked
by PageRank, nouns and verbs only. Used to draw the keywords of held-out poems that
`evaluate.py` asks the model to write with (`model.inspection.evaluation`).

jieba segments modern Chinese; on Tang verse it still cuts most lines into the two- and
one-character words the poets wrote in (明月, 故乡, 黄河), which is what a keyword needs.
It is imported on first use (its dictionary loads in 1–3 s; then a few ms a poem).
"""
from __future__ import annotations

import logging
from functools import lru_cache

from data.verse.poetry import is_hanzi, split_lines

POS = ("ns", "n", "vn", "v", "nr", "t", "s")
"""The parts of speech a keyword may have (jieba's tags: place, noun, verbal noun, verb,
person, time, location)."""


@lru_cache(maxsize=1)
def _textrank():
    import jieba
    import jieba.analyse

    jieba.setLogLevel(logging.WARNING)  # no "Building prefix dict" chatter
    return jieba.analyse.textrank


def poem_keywords(poem: str, k: int = 2, min_len: int = 2) -> list[str]:
    """The k highest-ranked keywords of a poem (TextRank, module docstring), best first: words
    of at least `min_len` CJK characters, each standing inside one line of the poem."""
    lines = split_lines(poem)
    words = _textrank()(poem, topK=4 * k, allowPOS=POS)
    kept = [w for w in words if len(w) >= min_len and all(map(is_hanzi, w)) and any(w in line for line in lines)]
    return kept[:k]
