"""Learn byte-level BPE ranks from the corpus and write them as a `.tiktoken` file, for
`python train.py tokenizer=tiktoken tokenizer.encoding=<file>` on a machine without the
published encodings.

    python -m data.bpe                                   # → data/cache/tang-bpe-1024.tiktoken (installed: ~/.cache/mingyue/)
    python -m data.bpe --vocab-size 2048 --poems 2000 --out my.tiktoken

Merges are learned with tiktoken's educational trainer (`tiktoken._educational.bpe_train`,
pure Python: the default's 768 merges on 1,000 poems take about 2 minutes of CPU time) from the first `--poems`
training poems in the chosen script, split with `ranks_file_pattern()`. The result is
deterministic: the same corpus and options give the same file.
"""
from __future__ import annotations

import argparse
import base64
from pathlib import Path

from data.corpus_io import load_corpus
from data.paths import CORPUS_DIR, PACKAGE_DIR, cache_dir
from data.tokenizer import ranks_file_pattern
from data.verse.script import SCRIPTS, corpus_to_script


def learn_ranks(texts: list[str], vocab_size: int) -> dict[bytes, int]:
    """BPE ranks: the 256 bytes (ranks 0–255), then `vocab_size - 256` merges, most frequent
    pair first, learned from `texts` joined by newlines. raises ValueError if vocab_size < 256."""
    from tiktoken._educational import bpe_train

    return bpe_train("\n".join(texts), vocab_size, ranks_file_pattern(), visualise=None)


def write_ranks(ranks: dict[bytes, int], path: str | Path) -> Path:
    """Write ranks in tiktoken's `.tiktoken` format (`base64(bytes) rank` a line, by rank); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = (f"{base64.b64encode(token).decode()} {rank}\n" for token, rank in sorted(ranks.items(), key=lambda x: x[1]))
    path.write_text("".join(lines))
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab-size", type=int, default=1024, help="ranks to learn, 256 bytes included")
    parser.add_argument("--poems", type=int, default=1000, help="first N training poems to learn from")
    parser.add_argument("--script", choices=SCRIPTS, default="simplified")
    parser.add_argument("--corpus", default=str(CORPUS_DIR / "tang.jsonl.xz"))
    parser.add_argument("--out", help="default: data/cache/tang-bpe-<vocab-size>.tiktoken (data.paths.cache_dir)")
    args = parser.parse_args(argv)
    if args.vocab_size < 256 or args.poems < 1:
        raise SystemExit("error: --vocab-size must be ≥ 256 and --poems ≥ 1")
    poems = [p["text"] for p in load_corpus(args.corpus) if p["split"] == "train"][: args.poems]
    out = args.out or cache_dir(PACKAGE_DIR / "cache") / f"tang-bpe-{args.vocab_size}.tiktoken"
    path = write_ranks(learn_ranks(corpus_to_script(poems, args.script), args.vocab_size), out)
    print(f"wrote {len(poems)} poems' {args.vocab_size} ranks to {path}")


if __name__ == "__main__":
    main()
