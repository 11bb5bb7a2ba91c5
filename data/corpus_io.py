"""Reading the shipped corpus (`data/corpus/tang.jsonl.xz`, written by `data/build_corpus.py`)
and a corpus a user brings (`read_user_corpus`): the one place that knows their formats, for the
data module, the build scripts and the metrics. Imports only the verse rules (cleaning, forms,
script conversion), so reading poems needs no torch."""
from __future__ import annotations

import hashlib
import json
import lzma
import math
from pathlib import Path
from typing import Iterable, Iterator

from data.verse.plan import clean_title
from data.verse.poetry import clean_poem, form_of
from data.verse.script import corpus_to_script

VAL_FRACTION = 0.05
SPLIT_SEED = 1337
SHIPPED_SUFFIX = ".xz"
BOM = "\ufeff"
"""The byte-order mark an editor may write at the start of a UTF-8 file (U+FEFF)."""
"""A corpus file ending so is one `data/build_corpus.py` wrote; any other is a user's (`read_user_corpus`)."""
FIELDS = ("id", "title", "author", "form", "split", "text")
"""The shipped corpus's schema, one JSON object a poem."""


def split_hash(poem_id: str, seed: int = SPLIT_SEED) -> int:
    """The seeded hash of a poem id that the split rule compares, in [0, 2**64)."""
    return int.from_bytes(hashlib.sha1(f"{seed}:{poem_id}".encode()).digest()[:8], "big")


def split_of(poem_id: str, seed: int = SPLIT_SEED, val_fraction: float = VAL_FRACTION) -> str:
    """'val' for a seeded, hash-chosen `val_fraction` of poem ids, else 'train'."""
    return "val" if split_hash(poem_id, seed) < val_fraction * 2**64 else "train"


def _user_record(line: str, jsonl: bool, where: str) -> dict:
    """One line of a user's corpus as a record with at least `text` (JSONL: an object whose `text`
    is a string, other fields strings; plain text: the line is the poem). raises ValueError naming
    `where` (file:line) for anything else."""
    if not jsonl:
        return {"text": line}
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"{where}: not a JSON object ({err.msg}); each line of a .jsonl corpus is one poem, "
                         f"fields {', '.join(FIELDS)} (text required)") from None
    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
        raise ValueError(f"{where}: not a JSON object with a string field \"text\" (the poem)")
    if bad := [k for k in FIELDS if k in record and not isinstance(record[k], str)]:
        raise ValueError(f"{where}: field {bad[0]!r} is not a string")
    if record.get("split", "train") not in ("train", "val"):
        raise ValueError(f"{where}: split {record['split']!r} is not train or val")
    return record


def read_user_corpus(path: str | Path) -> list[dict]:
    """A corpus a user brings, as the shipped corpus's records (`FIELDS`): a `.jsonl` file in the
    shipped schema (only `text` required; `title`, `author` default to ""; where a record has no
    `split`, `VAL_FRACTION` of those poems exactly, at least one, are held out: those whose
    `split_hash` of the `id`, or of the text, is lowest), or any other file as plain
    text, one poem a line (CRLF line ends, blank lines and byte-order marks, as editors write them,
    are fine: a mark U+FEFF is dropped wherever it stands). Each text passes the shipped corpus's cleaning rules
    (`data.verse.poetry.clean_poem`: notes and spaces dropped; a poem of other than CJK characters
    and line marks, or of fewer than two lines, is dropped) and gets its form (`form_of`).

    raises FileNotFoundError for a missing file; ValueError in one line for a file that is not
    UTF-8, a JSONL line that is not a poem's record (its line number), or a file with no poem the
    rules keep (the first line's reason), or with one."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data.corpus_path={path}: no such file")
    jsonl = path.suffix == ".jsonl"
    try:
        lines = path.read_text(encoding="utf-8").replace(BOM, "").splitlines()  # CRLF and CR end lines too
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text (byte {err.start}); save the corpus as UTF-8") from None
    poems, first_drop = [], None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        record = _user_record(line, jsonl, f"{path}:{number}")
        text, reason = clean_poem([record["text"]])
        if text is None:
            first_drop = first_drop or f"line {number}: {reason}"
            continue
        poems.append({"id": record.get("id") or hashlib.sha1(text.encode()).hexdigest()[:16],
                      "title": record.get("title", ""), "author": record.get("author", ""), "form": form_of(text),
                      "split": record.get("split", ""), "text": text})
    if not poems:
        raise ValueError(f"{path} holds no poem the corpus's cleaning rules keep"
                         + (f" ({first_drop}: CJK characters and line marks, two lines at least)" if first_drop else
                            " (the file is empty)"))
    if len(poems) < 2:
        raise ValueError(f"{path} holds 1 poem the cleaning rules keep; a corpus needs 2 at least (one is held out)")
    unsplit = sorted((p for p in poems if not p["split"]), key=lambda p: split_hash(p["id"]))
    held = min(max(1, math.ceil(VAL_FRACTION * len(unsplit))), len(unsplit) - 1)
    for i, p in enumerate(unsplit):
        p["split"] = "val" if i < held else "train"
    return poems


def iter_corpus(path: str | Path) -> Iterator[dict]:
    """The poems of a corpus file written by `data/build_corpus.py` (one JSON object a line),
    read lazily in file order, so a caller that needs a few stops early.

    A file not ending in `.xz` is a user's corpus, read (all at once) by `read_user_corpus`.
    raises FileNotFoundError with the command that rebuilds it if `path` is missing; ValueError
    as `read_user_corpus`.
    """
    path = Path(path)
    if path.suffix != SHIPPED_SUFFIX:
        yield from read_user_corpus(path)
        return
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
