"""Build the shipped corpora from the MIT-licensed chinese-poetry data.

    python data/build_corpus.py chinese-poetry-2.0.1.tgz        # from `npm pack chinese-poetry@2.0.1`
    python data/build_corpus.py path/to/package                 # the extracted tarball
    python data/build_corpus.py path/to/chinese-poetry          # a checkout (folder 全唐诗)
    python data/build_corpus.py chinese-poetry-2.0.1.tgz --dynasty song   # the 全宋诗 beside it
    python data/build_corpus.py chinese-poetry-2.0.1.tgz --dynasty ci     # the 全宋词 beside them

Reads `poet.<dynasty>.*.json` (traditional script), applies the cleaning rules of
`data/verse/poetry.py` and the file-level ones below, tags each poem's form, assigns the seeded
5 % validation split by poem, and writes `data/corpus/<dynasty>.jsonl.xz` (one poem a line:
id, title, author, form, split, text) and its counts (`stats.json` for the Tang corpus,
`song-stats.json`). The text stays in traditional script; the data module converts it with
OpenCC when it prepares tokens.

No corpus trains on a validation body (the leakage rule): bodies are compared after script
conversion and with punctuation removed (`body_keys`), and a training poem whose body equals a
validation poem's of the same corpus is dropped. The Song files also repeat Tang poems (the same
text under both dynasties), so the Song corpus is built against the shipped Tang one (`--tang`)
and a Song poem whose body equals a Tang body (either split) is dropped too.

The 全宋词 (`--dynasty ci`, `songci/ci.song.*.json`, simplified script as published, no ids) gets
the same rules through `data/verse/ci.py` (its lines also end at 、), an id from its content
(`ci_id`), its tune's name (`tune_name`) and shape (`shape_of`); it is built against both
shipped corpora, and a 词 whose body is a Tang or Song poem's is dropped.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import os
import re
import sys
import tarfile
import unicodedata
from collections import Counter
from pathlib import Path
from typing import Iterator

if __package__ in (None, ""):  # run as a script: make `data` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from data.corpus_io import load_corpus, split_of  # noqa: F401  (split_of: the rule, re-exported)
from data.verse.ci import CI, clean_ci, shape_of, tune_name
from data.verse.poetry import clean_poem, form_of
from data.verse.script import corpus_to_script

CORPUS_DIR = Path(__file__).resolve().parent / "corpus"
FIRST_SUPPLEMENT_FILE = 50000  # poet.tang.50000.json and later: supplements, mostly notes
DYNASTIES = ("tang", "song", CI)
_DIR = r"(?:^|/)(?:quantangshi|全唐诗)/"  # npm package / repository checkout


def _read_source(source: Path) -> Iterator[tuple[str, bytes]]:
    """Yield (member path, bytes) of every JSON file under `source` (a .tgz or a folder)."""
    if source.is_file():
        with tarfile.open(source) as tar:
            for member in tar:
                if member.isfile() and member.name.endswith(".json"):
                    yield member.name, tar.extractfile(member).read()
    elif source.is_dir():
        for path in sorted(source.rglob("*.json")):
            yield path.relative_to(source).as_posix(), path.read_bytes()
    else:
        raise FileNotFoundError(
            f"{source} does not exist. Give the tarball from `npm pack chinese-poetry@2.0.1`, "
            "its extracted folder, or a checkout of the chinese-poetry repository."
        )


def body_keys(texts: list[str]) -> list[str]:
    """Bodies as the leakage rule compares them: simplified script (OpenCC t2s), only the CJK
    ideographs kept (Unicode category Lo: marks and spaces removed)."""
    return ["".join(c for c in t if unicodedata.category(c) == "Lo") for t in corpus_to_script(texts, "simplified")]


def build(source: Path, dynasty: str = "tang", tang: list[dict] | None = None) -> tuple[list[dict], dict]:
    """Read the chinese-poetry data of `dynasty` at `source` and return (poems, stats).

    tang: for the Song corpus, the Tang poems (the shipped corpus) whose bodies it must not repeat.
    raises FileNotFoundError if `source` is missing, ValueError if it holds no
    `poet.<dynasty>.*.json` files or the Song corpus is built without the Tang poems.
    """
    if dynasty not in DYNASTIES:
        raise ValueError(f"dynasty {dynasty!r} is not one of {', '.join(DYNASTIES)}")
    if dynasty == "song" and tang is None:
        raise ValueError("the Song corpus is built against the Tang poems (--tang data/corpus/tang.jsonl.xz)")
    poem_file = re.compile(_DIR + rf"poet\.{dynasty}\.(\d+)\.json$")
    error_file = re.compile(_DIR + rf"error/poet\.{dynasty}\.\d+\.json$")
    files: dict[int, list[dict]] = {}
    error_ids: set[str] = set()
    for name, raw in _read_source(source):
        if error_file.search(name):
            error_ids.update(p["id"] for p in json.loads(raw))
        elif m := poem_file.search(name):
            files[int(m.group(1))] = json.loads(raw)
    if not files:
        raise ValueError(f"no poet.{dynasty}.*.json files under {source}")

    dropped: Counter = Counter()
    poems, seen_bodies = [], set()
    for number in sorted(files):
        for record in files[number]:
            if dynasty == "tang" and number >= FIRST_SUPPLEMENT_FILE:
                dropped["supplement-file"] += 1
                continue
            if record["id"] in error_ids:
                dropped["listed-in-error"] += 1
                continue
            text, reason = clean_poem(record.get("paragraphs") or [])
            if text is None:
                dropped[reason] += 1
                continue
            if text in seen_bodies:
                dropped["duplicate"] += 1
                continue
            seen_bodies.add(text)
            poems.append({
                "id": record["id"], "title": record.get("title", ""), "author": record.get("author", ""),
                "form": form_of(text), "split": split_of(record["id"]), "text": text,
            })
    poems = drop_leaks(poems, tang or [], dropped)
    stats = {
        "source_poems": sum(len(v) for v in files.values()),
        "kept": len(poems),
        "dropped": dict(sorted(dropped.items())),
        "forms": dict(Counter(p["form"] for p in poems).most_common()),
        "split": dict(Counter(p["split"] for p in poems).most_common()),
        "characters": sum(len(p["text"]) for p in poems),
    }
    return poems, stats


def drop_leaks(poems: list[dict], tang: list[dict], dropped: Counter, other: str = "tang-duplicate") -> list[dict]:
    """`poems` (in order) less those whose `body_keys` is a `tang` poem's (counted as `other`;
    the Song corpus, built against the Tang one, the 词 against both; [] for the Tang corpus
    itself) and the training poems whose `body_keys` is a kept validation poem's
    (`val-duplicate`). Counts go to `dropped`."""
    tang_keys = set(body_keys([p["text"] for p in tang]))
    keys = body_keys([p["text"] for p in poems])
    kept = [(p, k) for p, k in zip(poems, keys) if k not in tang_keys]
    val_keys = {k for p, k in kept if p["split"] == "val"}
    out = [p for p, k in kept if p["split"] == "val" or k not in val_keys]
    dropped.update({k: n for k, n in ((other, len(poems) - len(kept)), ("val-duplicate", len(kept) - len(out)))
                    if n})  # only the rules that dropped something are counted
    return out


def ci_id(record: dict) -> str:
    """A 词's id (the source has none): `ci-` and 12 hex digits of the SHA-1 of its author, tune
    heading and paragraphs as published, so the split is fixed by content."""
    key = "\x1f".join([record.get("author", ""), record.get("rhythmic", ""), *record.get("paragraphs", [])])
    return "ci-" + hashlib.sha1(key.encode()).hexdigest()[:12]


def build_ci(source: Path, shi: list[dict]) -> tuple[list[dict], dict]:
    """Read the 全宋词 at `source` and return (词, stats), built against `shi` (the Tang and Song
    poems: a 词 whose body is one of theirs is dropped). Each 词: id, title (its tune's name, "" if
    lost: what a model trained with titles reads), heading (the source's), author, form `ci`, tune
    (None: lost), shape, split, text (simplified, as published).
    raises FileNotFoundError if `source` is missing, ValueError if it holds no 词 files."""
    ci_file = re.compile(r"(?:^|/)songci/ci\.song\.[^/]+\.json$")
    records = [r for name, raw in _read_source(source) if ci_file.search(name) for r in json.loads(raw)]
    if not records:
        raise ValueError(f"no songci/ci.song.*.json files under {source}")
    dropped: Counter = Counter()
    poems, seen_bodies = [], set()
    for record in records:
        text, reason = clean_ci(record.get("paragraphs") or [])
        if text is None or text in seen_bodies:
            dropped[reason or "duplicate"] += 1
            continue
        seen_bodies.add(text)
        poem_id = ci_id(record)
        tune = tune_name(record.get("rhythmic", ""))
        poems.append({"id": poem_id, "title": tune or "", "heading": record.get("rhythmic", ""),
                      "author": record.get("author", ""), "form": CI, "tune": tune, "shape": shape_of(text),
                      "split": split_of(poem_id), "text": text})
    poems = drop_leaks(poems, shi, dropped, other="shi-duplicate")
    tunes = Counter(p["tune"] for p in poems if p["tune"])
    stats = {
        "source_poems": len(records),
        "kept": len(poems),
        "dropped": dict(sorted(dropped.items())),
        "script": "simplified",
        "tunes": len(tunes),
        "tunes_100": sum(n >= 100 for n in tunes.values()),
        "in_tunes_100": sum(n for n in tunes.values() if n >= 100),
        "tune_lost": sum(p["tune"] is None for p in poems),
        "renamed": sum("・" in p["heading"] for p in poems),
        "split": dict(Counter(p["split"] for p in poems).most_common()),
        "characters": sum(len(p["text"]) for p in poems),
    }
    return poems, stats


def leaks(poems: list[dict]) -> list[tuple[str, str]]:
    """(training id, validation id) of every training poem whose `body_keys` equals a validation
    poem's: what `drop_leaks` removes; [] for every shipped corpus."""
    keys = body_keys([p["text"] for p in poems])
    val = {k: p["id"] for p, k in zip(poems, keys) if p["split"] == "val"}
    return [(p["id"], val[k]) for p, k in zip(poems, keys) if p["split"] == "train" and k in val]


def write(poems: list[dict], stats: dict, out_dir: Path = CORPUS_DIR, dynasty: str = "tang") -> Path:
    """Write `<dynasty>.jsonl.xz` and its stats (`stats.json` for Tang, `<dynasty>-stats.json`
    otherwise) into `out_dir` atomically; returns the corpus path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{dynasty}.jsonl.xz"
    tmp = target.with_suffix(".xz.tmp")
    with lzma.open(tmp, "wt", encoding="utf-8", preset=9 | lzma.PRESET_EXTREME) as f:
        for poem in poems:
            f.write(json.dumps(poem, ensure_ascii=False) + "\n")
    os.replace(tmp, target)
    stats_name = "stats.json" if dynasty == "tang" else f"{dynasty}-stats.json"
    (out_dir / stats_name).write_text(json.dumps(stats, ensure_ascii=False, indent=2) + "\n")
    return target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path, help="chinese-poetry tarball, extracted folder or checkout")
    parser.add_argument("--out", type=Path, default=CORPUS_DIR, help="output folder (default: data/corpus)")
    parser.add_argument("--dynasty", choices=DYNASTIES, default="tang", help="which poet.<dynasty>.*.json files")
    parser.add_argument("--tang", type=Path, default=CORPUS_DIR / "tang.jsonl.xz",
                        help="for --dynasty song and ci: the Tang corpus its poems must not repeat")
    parser.add_argument("--song", type=Path, default=CORPUS_DIR / "song.jsonl.xz",
                        help="for --dynasty ci: the Song corpus its 词 must not repeat")
    args = parser.parse_args(argv)
    if args.dynasty == CI:
        poems, stats = build_ci(args.source, load_corpus(args.tang) + load_corpus(args.song))
    else:
        poems, stats = build(args.source, args.dynasty, load_corpus(args.tang) if args.dynasty == "song" else None)
    path = write(poems, stats, args.out, args.dynasty)
    print(json.dumps(stats, ensure_ascii=False, indent=2))
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
