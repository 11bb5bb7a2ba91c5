"""Build the shipped corpus from the MIT-licensed chinese-poetry data.

    python data/build_corpus.py chinese-poetry-2.0.1.tgz        # from `npm pack chinese-poetry@2.0.1`
    python data/build_corpus.py path/to/package                 # the extracted tarball
    python data/build_corpus.py path/to/chinese-poetry          # a checkout (folder 全唐诗)

Reads `poet.tang.*.json` (traditional script), applies the cleaning rules of
`data/verse/poetry.py` and the file-level ones below, tags each poem's form, assigns the seeded
5 % validation split by poem, and writes `data/corpus/tang.jsonl.xz` (one poem a line:
id, title, author, form, split, text) and `data/corpus/stats.json`. The text stays in
traditional script; the data module converts it with OpenCC when it prepares tokens.
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
from collections import Counter
from pathlib import Path
from typing import Iterator

if __package__ in (None, ""):  # run as a script: make `data` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from data.verse.poetry import clean_poem, form_of

CORPUS_DIR = Path(__file__).resolve().parent / "corpus"
FIRST_SUPPLEMENT_FILE = 50000  # poet.tang.50000.json and later: supplements, mostly notes
VAL_FRACTION = 0.05
SPLIT_SEED = 1337
_TANG_DIR = r"(?:^|/)(?:quantangshi|全唐诗)/"  # npm package / repository checkout
_TANG_FILE = re.compile(_TANG_DIR + r"poet\.tang\.(\d+)\.json$")
_ERROR_FILE = re.compile(_TANG_DIR + r"error/poet\.tang\.\d+\.json$")


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


def split_of(poem_id: str, seed: int = SPLIT_SEED, val_fraction: float = VAL_FRACTION) -> str:
    """'val' for a seeded, hash-chosen `val_fraction` of poem ids, else 'train'."""
    digest = hashlib.sha1(f"{seed}:{poem_id}".encode()).digest()
    return "val" if int.from_bytes(digest[:8], "big") < val_fraction * 2**64 else "train"


def build(source: Path) -> tuple[list[dict], dict]:
    """Read the chinese-poetry data at `source` and return (poems, stats).

    raises FileNotFoundError if `source` is missing, ValueError if it holds no
    `poet.tang.*.json` files.
    """
    tang: dict[int, list[dict]] = {}
    error_ids: set[str] = set()
    for name, raw in _read_source(source):
        if _ERROR_FILE.search(name):
            error_ids.update(p["id"] for p in json.loads(raw))
        elif m := _TANG_FILE.search(name):
            tang[int(m.group(1))] = json.loads(raw)
    if not tang:
        raise ValueError(f"no poet.tang.*.json files under {source}")

    dropped: Counter = Counter()
    poems, seen_bodies = [], set()
    for number in sorted(tang):
        for record in tang[number]:
            if number >= FIRST_SUPPLEMENT_FILE:
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
    stats = {
        "source_poems": sum(len(v) for v in tang.values()),
        "kept": len(poems),
        "dropped": dict(sorted(dropped.items())),
        "forms": dict(Counter(p["form"] for p in poems).most_common()),
        "split": dict(Counter(p["split"] for p in poems).most_common()),
        "characters": sum(len(p["text"]) for p in poems),
    }
    return poems, stats


def write(poems: list[dict], stats: dict, out_dir: Path = CORPUS_DIR) -> Path:
    """Write `tang.jsonl.xz` and `stats.json` into `out_dir` atomically; returns the corpus path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / "tang.jsonl.xz"
    tmp = target.with_suffix(".xz.tmp")
    with lzma.open(tmp, "wt", encoding="utf-8", preset=9 | lzma.PRESET_EXTREME) as f:
        for poem in poems:
            f.write(json.dumps(poem, ensure_ascii=False) + "\n")
    os.replace(tmp, target)
    (out_dir / "stats.json").write_text(json.dumps(stats, ensure_ascii=False, indent=2) + "\n")
    return target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path, help="chinese-poetry tarball, extracted folder or checkout")
    parser.add_argument("--out", type=Path, default=CORPUS_DIR, help="output folder (default: data/corpus)")
    args = parser.parse_args(argv)
    poems, stats = build(args.source)
    path = write(poems, stats, args.out)
    print(json.dumps(stats, ensure_ascii=False, indent=2))
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
