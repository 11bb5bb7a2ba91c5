"""Reading the shipped corpus (`data/corpus/tang.jsonl.xz`, written by `data/build_corpus.py`):
the one place that knows its format, for the data module, the build scripts and the metrics.
Imports only the verse rules (script conversion), so reading poems needs no torch."""
from __future__ import annotations

import json
import lzma
from pathlib import Path
from typing import Iterable, Iterator

from data.verse.plan import clean_title
from data.verse.script import corpus_to_script


def iter_corpus(path: str | Path) -> Iterator[dict]:
    """The poems of a corpus file written by `data/build_corpus.py` (one JSON object a line),
    read lazily in file order, so a caller that needs a few stops early.

    raises FileNotFoundError with the command that rebuilds it if `path` is missing.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"corpus file {path} not found. It ships with the repository (git LFS is not used); "
            "restore it with `git checkout -- data/corpus` or rebuild it with "
            "`python data/build_corpus.py chinese-poetry-2.0.1.tgz` (from `npm pack chinese-poetry@2.0.1`)."
        )
    with lzma.open(path, "rt", encoding="utf-8") as f:
        yield from map(json.loads, f)


def load_corpus(path: str | Path) -> list[dict]:
    """All poems of a corpus file (see `iter_corpus`). raises FileNotFoundError if `path` is missing."""
    return list(iter_corpus(path))


def heldout_titles(path: str | Path, script: str, n: int) -> list[str]:
    """The titles (`data.verse.plan.clean_title`) of the first `n` held-out poems that have one, in
    corpus order, converted to `script`. raises FileNotFoundError if `path` is missing."""
    titles = []
    for poem in iter_corpus(path):
        if len(titles) == n:
            break
        if poem["split"] == "val" and (title := clean_title(poem.get("title", ""))):
            titles.append(title)
    return corpus_to_script(titles, script)


def heldout_poems(path: str | Path, script: str, n: int, forms: Iterable[str] | None, max_chars: int,
                  split: str = "val") -> list[str]:
    """The first `n` poems of a split (`val`: held out; `train`) of the given forms
    (`data.verse.poetry.FORMS` names; None: any) with at most `max_chars` characters, in corpus
    order, converted to `script`.

    The same poems the data module holds out (its `val.bin`) or trains on, read straight from the
    corpus. Fewer than `n` come back if the corpus has fewer. raises FileNotFoundError if `path`
    is missing.
    """
    forms = None if forms is None else set(forms)
    texts = []
    for poem in iter_corpus(path):
        if len(texts) == n:
            break
        if poem["split"] == split and (forms is None or poem["form"] in forms) and len(poem["text"]) <= max_chars:
            texts.append(poem["text"])
    return corpus_to_script(texts, script)
