"""A plan from the title: the sub-topic words a poem is written around, chosen from its title by
corpus statistics, as the planning-based poetry systems choose them (Wang et al. 2016, "Chinese
Poetry Generation with Planning based Neural Network", §3: the title's own words, then keyword
expansion from the corpus when the title gives too few; docs/conditions.md, "A plan from the title").

Built once from the training poems (`TitlePlanner.build`, cached by `load_planner`):
- each poem's words: jieba's segmentation of its lines, words of 2+ CJK characters;
- each title as TF-IDF of its character 1- and 2-grams (the idf over the training titles), rows
  of unit length.

`TitlePlanner.plan(title, k)`:
1. expansion: the `NEIGHBOURS` training titles nearest the title (cosine of the TF-IDF rows), and
   each two-character word of their poems found in at least `MIN_POEMS` poems, scored by the sum
   of the neighbours' similarities times the word's idf over all poems (common words count less),
   less the words that share a character with the title (the poem's sub-topics, not its title's
   echo, which a reader discounts; issue 60);
2. where expansion finds too few, the title's own words (jieba) of 2 or 3 characters that at least
   `MIN_POEMS` poems use, in title order, less a series' count (十首, 二首: a word with 首 or of
   numerals only); `echo=True` takes these first, the plan before issue 60 (`title_plan=echo`);
3. words taken best first, skipping a word that shares a character with one already taken, until k.
A title none of whose characters a training title has plans nothing ([]). Deterministic: the same
title gives the same words (ties go to the word seen first in the corpus).

`TitlePlanner.leaning(words)`: the characters the poems using the planned words use more than
poems at large (their log-lift), which sampling adds to the logits (`topic_lean`, weighted decoding
as Ghazvininejad et al. 2016, "Generating Topical Poetry", §5, add a topic's words' similarity), so
that the rest of a line is written toward the words, not only around them (issue 60).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from scipy import sparse

from data.corpus_io import load_corpus
from data.paths import CORPUS_DIR, PACKAGE_DIR
from data.paths import cache_dir as cache_location
from data.verse.ci import CI
from data.verse.plan import clean_title
from data.verse.poetry import VERSE_FORMS, is_hanzi, split_lines
from data.verse.script import corpus_to_script
from data.verse.tunes import tunes

log = logging.getLogger(__name__)
CORPUS = CORPUS_DIR / "tang.jsonl.xz"
"""The corpus whose training poems the plan draws from (every model's reference corpus)."""
CACHE_DIR = PACKAGE_DIR / "cache"
PLAN_MODES = (True, False, "hints", "echo")
PLAN_VERSION = 4  # bump when the index format or its words change
NEIGHBOURS = 50
"""How many nearest training titles lend their poems' words (step 2)."""
MIN_POEMS = 3
"""The fewest training poems a planned word stands in (rarer ones are mostly jieba's mis-cuts)."""
NUMERALS = set("一二三四五六七八九十百千两")
LEAN_PRIOR = 10
"""`leaning`'s pseudo-count: poems added to the observed and the expected count of a character."""
LEAN_CAP = 3.0
"""The largest log-lift `leaning` gives (nats: a character 20× likelier)."""


def _ngrams(title: str) -> list[str]:
    """A title's character 1- and 2-grams (CJK characters only)."""
    chars = "".join(c for c in title if is_hanzi(c))
    return [*chars, *(chars[i:i + 2] for i in range(len(chars) - 1))]


@lru_cache(maxsize=1)
def _cut():
    import jieba

    jieba.setLogLevel(logging.WARNING)
    return jieba.lcut


def words_of(text: str) -> list[str]:
    """The words of a text (jieba's segmentation line by line): words of 2+ CJK characters, in order,
    without repeats."""
    cut = _cut()
    return list(dict.fromkeys(w for line in split_lines(text) or [text] for w in cut(line)
                              if len(w) >= 2 and all(map(is_hanzi, w))))


MATRICES = {"titles": "titles", "poems": "poems", "chars": "char_poems"}
"""The index's sparse matrices as `save` names them: file prefix → attribute."""


class TitlePlanner:
    """The index of `build`: grams (G,) title n-grams and their idf (G,) float; titles (N, G) CSR,
    unit rows; words (W,) the poems' words and df (W,) how many poems use each; poems (N, W) CSR 0/1 (which words each
    poem uses); chars (C,) the poems' CJK characters and char_poems (N, C) CSR 0/1 (which each poem uses)."""

    def __init__(self, grams: list[str], gram_idf: np.ndarray, titles: sparse.csr_matrix, words: list[str],
                 df: np.ndarray, poems: sparse.csr_matrix, chars: list[str], char_poems: sparse.csr_matrix):
        self.grams, self.gram_idf, self.titles = grams, gram_idf, titles
        self.words, self.df, self.poems = words, df, poems
        self.chars, self.char_poems, self.by_word = chars, char_poems, poems.tocsc()
        self.char_rate = np.asarray(char_poems.sum(0)).ravel() / max(1, char_poems.shape[0])  # (C,) share of poems
        n = poems.shape[0]  # step 2's weights: idf, 0 for a word it never takes
        self.word_idf = np.log((1 + n) / (1 + df)) * (df >= MIN_POEMS) * np.array([len(w) == 2 for w in words])
        self.gram_ids = {g: i for i, g in enumerate(grams)}
        self.word_ids = {w: i for i, w in enumerate(words)}

    @classmethod
    def build(cls, titles: Sequence[str], texts: Sequence[str]) -> TitlePlanner:
        """The index of training poems: titles (cleaned, "" for none) and texts, in the model's script."""
        grams: dict[str, int] = {}
        rows, cols = [], []
        for i, t in enumerate(titles):
            for g in set(_ngrams(t)):
                rows.append(i)
                cols.append(grams.setdefault(g, len(grams)))
        n = len(titles)
        titles_m = sparse.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(n, len(grams)))
        gram_idf = np.log((1 + n) / (1 + np.bincount(cols, minlength=len(grams)))) + 1
        titles_m = sparse.csr_matrix(titles_m.multiply(gram_idf[None]))
        norms = np.sqrt(np.asarray(titles_m.multiply(titles_m).sum(1)).ravel())
        titles_m = sparse.csr_matrix(sparse.diags(1 / np.maximum(norms, 1e-12)) @ titles_m)
        words: dict[str, int] = {}
        rows, cols = [], []
        for i, text in enumerate(texts):
            for w in words_of(text):
                rows.append(i)
                cols.append(words.setdefault(w, len(words)))
        poems = sparse.csr_matrix((np.ones(len(rows), dtype=np.float32), (rows, cols)), shape=(n, len(words)))
        df = np.bincount(cols, minlength=len(words))
        chars: dict[str, int] = {}
        rows, cols = [], []
        for i, text in enumerate(texts):
            for c in dict.fromkeys(filter(is_hanzi, text)):
                rows.append(i)
                cols.append(chars.setdefault(c, len(chars)))
        char_poems = sparse.csr_matrix((np.ones(len(rows), dtype=np.float32), (rows, cols)), shape=(n, len(chars)))
        return cls(list(grams), gram_idf, titles_m, list(words), df, poems, list(chars), char_poems)

    def plan(self, title: str, k: int, echo: bool = False) -> list[str]:
        """Up to k words to write a poem on `title` around (module docstring; echo: the title's own
        words first); [] if no training title shares a character with it."""
        q = np.zeros(len(self.grams))
        for g in set(_ngrams(title)):
            if (i := self.gram_ids.get(g)) is not None:
                q[i] = self.gram_idf[i]
        if not q.any():
            return []
        sims = self.titles @ (q / np.linalg.norm(q))  # (N,) cosine with every training title
        near = np.argsort(-sims, kind="stable")[:NEIGHBOURS]
        near = near[sims[near] > 0]
        scores = np.asarray(self.poems[near].T @ sims[near]).ravel() * self.word_idf  # (W,)
        own = [w for w in words_of(title) if w in self.word_ids and len(w) <= 3 and "首" not in w
               and self.df[self.word_ids[w]] >= MIN_POEMS and not set(w) <= NUMERALS]
        expansion = [self.words[i] for i in np.argsort(-scores, kind="stable") if scores[i] > 0]
        ranked = own + expansion if echo else [w for w in expansion if not set(w) & set(title)] + own
        chosen: list[str] = []
        for w in ranked:
            if len(chosen) == k:
                break
            if not any(set(w) & set(c) for c in chosen):
                chosen.append(w)
        return chosen

    def leaning(self, words: Sequence[str], skip: str = "") -> dict[str, float]:
        """{character: its lift in (0, LEAN_CAP] nats}, the mean over `words` of each word's
        log((n_wc + LEAN_PRIOR) / (n_w·p_c + LEAN_PRIOR)): n_w training poems use the word, n_wc of
        them the character, p_c the share of all training poems that use it (observed against
        expected poems, both given LEAN_PRIOR more, so that a rare character's few poems count
        little); never the characters of `words` or `skip` (the title). {} for words no training poem uses."""
        ids = [self.word_ids[w] for w in words if w in self.word_ids]
        lift = np.zeros(len(self.chars))
        for i in ids:
            using = self.by_word[:, i].indices  # the poems using the word
            counts = np.asarray(self.char_poems[using].sum(0)).ravel()  # (C,)
            lift += np.log((counts + LEAN_PRIOR) / (len(using) * self.char_rate + LEAN_PRIOR)) / len(ids)
        never = set("".join(words)) | set(skip)
        return {self.chars[i]: round(float(min(lift[i], LEAN_CAP)), 4)
                for i in np.flatnonzero(lift > 0) if self.chars[i] not in never}

    def save(self, path: Path) -> None:
        """Write the index to `path` (.npz: arrays and the two string lists as JSON, no pickle)."""
        np.savez(path, gram_idf=self.gram_idf, df=self.df,
                 strings=np.frombuffer(json.dumps([self.grams, self.words, self.chars], ensure_ascii=False).encode(),
                                       np.uint8),
                 **{f"{name}_{a}": getattr(getattr(self, m), a) for name, m in MATRICES.items()
                    for a in ("data", "indices", "indptr")})

    @classmethod
    def load(cls, path: Path) -> TitlePlanner:
        """The index `save` wrote (read without pickle)."""
        z = np.load(path, allow_pickle=False)
        grams, words, chars = json.loads(z["strings"].tobytes().decode())

        def csr(name: str, width: int) -> sparse.csr_matrix:
            return sparse.csr_matrix((z[f"{name}_data"], z[f"{name}_indices"], z[f"{name}_indptr"]),
                                     shape=(len(z[f"{name}_indptr"]) - 1, width))
        return cls(grams, z["gram_idf"], csr("titles", len(grams)), words, z["df"], csr("poems", len(words)), chars,
                   csr("chars", len(chars)))


@lru_cache(maxsize=4)
def load_planner(corpus_path: str, cache_dir: str, script: str) -> TitlePlanner:
    """The planner of a corpus's training poems in `script`: read from `cache_dir` (keyed by the
    corpus's bytes, the script and `PLAN_VERSION`), or built there once (about half a minute for
    the Tang corpus; written to a temporary file, then renamed). A `cache_dir` inside the installed
    packages becomes the user's cache folder (`data.paths.cache_dir`: never written into
    site-packages). raises FileNotFoundError for a missing corpus."""
    key = hashlib.sha256(Path(corpus_path).read_bytes() if Path(corpus_path).is_file() else b"")
    key.update(json.dumps({"script": script, "v": PLAN_VERSION}).encode())
    path = cache_location(cache_dir) / f"title-plan-{key.hexdigest()[:16]}.npz"
    if path.is_file():
        return TitlePlanner.load(path)
    poems = [p for p in load_corpus(corpus_path) if p["split"] == "train"]
    log.info(f"title plan: indexing the titles and words of {len(poems):,} training poems (once)")
    planner = TitlePlanner.build(corpus_to_script([clean_title(p.get("title", "")) for p in poems], script),
                                 corpus_to_script([p["text"] for p in poems], script))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".npz", dir=path.parent)
    os.close(fd)
    try:
        planner.save(Path(tmp))
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return planner




FREE_PLAN = 4
"""Words planned for a free poem: one a line of a 绝句, the commonest length of the poems."""


def plan_size(form: str | None, tune: str = "", echo: bool = False) -> int:
    """Words planned for a poem of `form`, or a 词 to `tune` (a tune's name as `find_tune` gives it,
    resolved by the caller once): a couplet each (a 绝句 2, a 律诗 4: a word a line cost rhyme and
    distinct-2, docs/experiments.md), a stanza each for a 词, `FREE_PLAN` for a free poem (echo: the
    plan before issue 60, 2)."""
    if tune or form == CI:  # a 词 to a tune drawn per poem: two stanzas, the commonest
        return 1 if tune and tunes()[tune][0].stanza is None else 2
    if form in VERSE_FORMS:
        return VERSE_FORMS[form][0] // 2
    return 2 if echo else FREE_PLAN


def check_mode(title_plan: Any) -> bool | str:
    """`title_plan` as one of `PLAN_MODES` (strings true/false accepted). raises ValueError otherwise."""
    mode = {"true": True, "false": False}.get(str(title_plan).lower(), title_plan)
    if mode not in PLAN_MODES:
        raise ValueError(f"title_plan={title_plan!r} is not one of true (forced words), echo (forced, the title's "
                         "own words first), hints, false")
    return mode


def planner(script: str) -> TitlePlanner:
    """The planner of the Tang training poems in `script` (built once, cached under data/cache)."""
    return load_planner(str(CORPUS), str(CACHE_DIR), script)


def nothing_planned(title, why: str = "no training title shares a character with it") -> str:
    """The line that says a title planned nothing, and why."""
    return f"nothing planned for title={title} ({why}): the poem is written to the title alone"
