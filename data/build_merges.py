"""Write `data/verse/rhyme_merges.tsv`: every case where converting the 平水韵 table to a script
merges characters, with its decision (`data.verse.rhyme`'s module docstring), from the table,
OpenCC and the shipped corpus. Run after rebuilding the corpus; a test checks the file.

    python -m data.build_merges
"""
from __future__ import annotations

import csv
from pathlib import Path

from data.corpus_io import iter_corpus
from data.verse.rhyme import MERGE_FIELDS, MERGES_PATH, merged_cases, written_as
from data.verse.script import SCRIPTS

CORPUS = Path(__file__).resolve().parent / "corpus" / "tang.jsonl.xz"


def write_merges(corpus: str | Path = CORPUS, out: str | Path = MERGES_PATH) -> int:
    """Write every merged case of both scripts with its decision as TSV; returns the row count."""
    texts = [poem["text"] for poem in iter_corpus(corpus)]
    rows = [r for script in SCRIPTS for r in merged_cases(script, written_as(texts, script))]
    with Path(out).open("w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, MERGE_FIELDS, delimiter="\t", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return len(rows)


if __name__ == "__main__":
    print(f"wrote {write_merges()} merged cases to {MERGES_PATH}")
