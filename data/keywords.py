"""Keywords of a poem, as the planning-based poetry systems take them (Wang et al. 2016,
"Chinese Poetry Generation with Planning based Neural Network", §3.1: TextRank over the
segmented words): jieba's word segmentation and its TextRank (`jieba.analyse.textrank`,
Mihalcea & Tarau 2004), a co-occurrence graph of the poem's words in a window of 5, ranked
by PageRank, nouns and verbs only. Used to draw the keywords of held-out poems that
`evaluate.py` asks the model to write with (`model.inspection.evaluation`).

jieba segments modern Chinese; on Tang verse it still cuts most lines into the two- and
one-character words the poets wrote in (明月, 故乡, 黄河), which is what a keyword needs.
It is imported on first use (its dictionary loads in 1–3 s; then a few ms a poem).

Keywords a user asks the sampler for are cleaned and checked here too (`clean_keywords`, `keyword_rows`,
`check_forced`; `per_row`: any option given one per poem), and
`write_char` follows them through a line as it is written (`model.sampling.keywords`).
"""
from __future__ import annotations

import logging
import re
from functools import lru_cache
from typing import Iterable, Sequence

from data.tokenizer import CharTokenizer, Tokenizer
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


SEPARATORS = re.compile(r"[,，、;；\s]+")
"""What separates keywords written in one string: `明月,故乡`, `明月，故乡`, `明月、故乡`."""


def clean_keywords(keywords: Iterable[str]) -> tuple[str, ...]:
    """Keywords as asked → the ones to force: split at SEPARATORS, empty entries and repeats
    dropped, and a keyword inside another dropped (it is written with the longer one); order kept."""
    kept = list(dict.fromkeys(w for k in keywords for w in SEPARATORS.split(str(k)) if w))
    return tuple(k for k in kept if not any(k != other and k in other for other in kept))


def keyword_rows(keywords: str | Sequence, num_samples: int) -> list[tuple[str, ...]]:
    """`SamplingOptions.keywords` → the keywords of each row, cleaned (`clean_keywords`): one
    tuple for every row (a string, or a list of strings), or one per row (a list of
    `num_samples` lists). raises ValueError for a list of lists of another length."""
    if isinstance(keywords, str):
        return [clean_keywords([keywords])]
    keywords = list(keywords)
    if not keywords or all(isinstance(k, str) for k in keywords):
        return [clean_keywords(keywords)]
    if len(keywords) != num_samples or any(isinstance(k, str) for k in keywords):
        raise ValueError(f"keywords per poem need one list for each of the {num_samples} poems, got {len(keywords)}: "
                         f"write keywords=[[明月,故乡],[春风,杨柳]] with num_samples=2")
    return [clean_keywords(k) for k in keywords]


def per_row(value: str | Sequence[str], num_samples: int, option: str) -> list[str]:
    """A condition for every row (a string), or one per row (a list of `num_samples` strings). raises
    ValueError for a list of another length."""
    if isinstance(value, str):
        return [value]
    value = list(value)
    if len(value) != num_samples or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{option} per poem needs one string for each of the {num_samples} poems, got {len(value)}: "
                         f"write {option}=[静夜思,江雪] with num_samples=2")
    return value


def check_forced(tok: Tokenizer, rows: tuple[tuple[str, ...], ...], control: str) -> None:
    """raises ValueError for forced keywords no mask can write: a non-character tokenizer, soft
    control, a keyword with other than CJK characters."""
    if not isinstance(tok, CharTokenizer):
        raise ValueError("keywords need a character-level model (tokenizer=char)")
    if control == "soft":
        raise ValueError("forced keywords are masks, not plan tokens: use control=hard or control=both")
    if bad := next((w for row in rows for w in row if not all(map(is_hanzi, w))), None):
        raise ValueError(f"the keyword {bad!r} is not made of characters of a line (CJK characters only)")


def write_char(line_text: str, open_: tuple[str, ...], written: int, starts: Iterable[str], pending: Iterable[str],
               c: str) -> tuple[str, tuple[str, ...], int, frozenset[str]]:
    """Character c written in a line (`line_text` before it): the keywords being written (`open_`,
    `written` characters in) narrowed to those c continues, or when none is, those of `starts` c
    begins → (the line's text, the keywords still open, their characters written, the keywords of
    `pending` the line now ends with: written whole, which closes every open one)."""
    line_text += c
    if open_:
        open_, written = tuple(w for w in open_ if w[written] == c), written + 1
    else:
        open_, written = tuple(w for w in starts if w[0] == c), 1
    done = frozenset(w for w in pending if line_text.endswith(w))
    open_ = tuple(w for w in open_ if w not in done and len(w) > written)
    return (line_text, (), 0, done) if done or not open_ else (line_text, open_, written, done)
