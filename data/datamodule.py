"""LightningDataModule: shipped corpus → cached token arrays → `(x, y)` windows.

Preparation (once, cached under `cache_dir/<key>/`, rebuilt when the corpus file or the
settings change): read `tang.jsonl.xz`, convert to the configured script with OpenCC,
build the vocabulary (characters, or the corpus's tokens of a tiktoken encoding), and write
`train.bin` / `val.bin` (ids as uint16, or uint32 for vocabularies over 65,536; each poem
framed as `<bos> text <eos>`, poems in corpus order) plus `tokenizer.json` and `meta.json`.
Training and validation read those files memory-mapped.
"""
from __future__ import annotations

import hashlib
import json
import lzma
import os
import shutil
import tempfile
import warnings
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Iterable, Iterator

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from torchdata.stateful_dataloader import StatefulDataLoader

from data.script import SCRIPTS, corpus_to_script
from data.tokenizer import CharTokenizer, TiktokenTokenizer, Tokenizer, load_encoding, load_tokenizer

CACHE_VERSION = 2  # bump when the prepared format changes
TOKENIZER_KINDS = ("char", "tiktoken")


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


def heldout_poems(path: str | Path, script: str, n: int, forms: Iterable[str], max_chars: int) -> list[str]:
    """The first `n` validation-split poems of the given forms (`data.poetry.FORMS` names)
    with at most `max_chars` characters, in corpus order, converted to `script`.

    The same poems the data module holds out (its `val.bin`), read straight from the corpus.
    Fewer than `n` come back if the corpus has fewer. raises FileNotFoundError if `path` is missing.
    """
    forms = set(forms)
    texts = []
    for poem in iter_corpus(path):
        if len(texts) == n:
            break
        if poem["split"] == "val" and poem["form"] in forms and len(poem["text"]) <= max_chars:
            texts.append(poem["text"])
    return corpus_to_script(texts, script)


class Windows(Dataset):
    """`(x, y)` pairs of `block_size` token ids from a 1-D token array, y = x shifted by one.

    random_offsets=True: every start offset is an item (training, shuffled by the sampler).
    random_offsets=False: non-overlapping windows that cover the array (validation).
    Items are `(block_size,) int64` tensors.
    """

    def __init__(self, tokens: np.ndarray, block_size: int, random_offsets: bool):
        if len(tokens) <= block_size:
            raise ValueError(f"{len(tokens)} tokens cannot fill one window of block_size={block_size}")
        self.tokens, self.block_size = tokens, block_size
        self.stride = 1 if random_offsets else block_size

    def __len__(self) -> int:
        return (len(self.tokens) - 1 - self.block_size) // self.stride + 1

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = i * self.stride
        chunk = torch.from_numpy(self.tokens[start : start + self.block_size + 1].astype(np.int64))
        return chunk[:-1], chunk[1:]  # x, y: (block_size,)


class PoetryDataModule(L.LightningDataModule):
    """Serves windows of the shipped 全唐诗 corpus.

    corpus_path: `tang.jsonl.xz`; script: 'simplified' | 'traditional'; block_size: T;
    batch_size: B per device; cache_dir: where prepared arrays live (outside git);
    tokenizer: `{"kind": "char"}` (default) or `{"kind": "tiktoken", "encoding": <name or
    .tiktoken path>}` (the `tokenizer` config group); seed: of the training order (the run's).
    """

    def __init__(self, corpus_path: str, cache_dir: str, script: str = "simplified",
                 block_size: int = 64, batch_size: int = 32, num_workers: int = 0,
                 tokenizer: Mapping | None = None, seed: int = 0):
        super().__init__()
        if script not in SCRIPTS:
            raise ValueError(f"data.script={script!r} is not one of {sorted(SCRIPTS)}")
        self.tokenizer_cfg = dict(tokenizer or {"kind": "char"})
        if self.tokenizer_cfg.get("kind") not in TOKENIZER_KINDS:
            raise ValueError(f"tokenizer.kind={self.tokenizer_cfg.get('kind')!r} is not one of {TOKENIZER_KINDS}")
        self.corpus_path, self.cache_root = Path(corpus_path), Path(cache_dir)
        self.script, self.block_size = script, block_size
        self.batch_size, self.num_workers, self.seed = batch_size, num_workers, seed

    @cached_property
    def encoding(self):
        """The tiktoken encoding (`load_encoding`; None for the character tokenizer). Loaded before
        any corpus work, so an unreachable encoding stops the run at once."""
        if self.tokenizer_cfg["kind"] != "tiktoken":
            return None
        return load_encoding(str(self.tokenizer_cfg.get("encoding")))

    @cached_property
    def cache_dir(self) -> Path:
        """`cache_root/<key>`: the key hashes the corpus bytes and every setting that shapes the arrays
        (script, tokenizer kind, encoding name, which for a ranks file includes its SHA-256)."""
        if not self.corpus_path.is_file():
            load_corpus(self.corpus_path)  # raises the explanatory FileNotFoundError
        tokenizer = {"kind": self.tokenizer_cfg["kind"], **({"encoding": self.encoding.name} if self.encoding else {})}
        h = hashlib.sha256(self.corpus_path.read_bytes())
        h.update(json.dumps({"script": self.script, "tokenizer": tokenizer, "v": CACHE_VERSION}).encode())
        return self.cache_root / h.hexdigest()[:16]

    def _build_tokenizer(self, texts: list[str]) -> Tokenizer:
        if self.encoding is None:
            return CharTokenizer.from_texts(texts)
        spec = str(self.tokenizer_cfg["encoding"])
        source = spec if self.encoding.name == spec else str(Path(spec).expanduser().resolve())  # a file: absolute
        return TiktokenTokenizer.from_texts(self.encoding, texts, source)

    def prepare_data(self) -> None:
        """Build the cached arrays if they are missing. Safe to interrupt: the folder
        appears only once complete (written to a temporary folder, then renamed)."""
        if (self.cache_dir / "meta.json").is_file():
            return
        poems = load_corpus(self.corpus_path)
        texts = corpus_to_script([p["text"] for p in poems], self.script)
        tok = self._build_tokenizer(texts)
        dtype = np.uint16 if tok.vocab_size <= 1 << 16 else np.uint32
        self.cache_root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=self.cache_root))
        try:
            meta = {"script": self.script, "tokenizer": tok.state_dict()["kind"], "vocab_size": tok.vocab_size,
                    "dtype": np.dtype(dtype).name, "corpus": str(self.corpus_path.name)}
            for split in ("train", "val"):
                split_texts = [t for p, t in zip(poems, texts) if p["split"] == split]
                ids = [tok.encode(t, bos=True, eos=True) for t in split_texts]
                arr = np.fromiter((i for poem in ids for i in poem), dtype=dtype)
                arr.tofile(tmp / f"{split}.bin")
                meta[split] = {"poems": len(ids), "tokens": int(arr.size),
                               "characters": sum(map(len, split_texts))}
            tok.save(tmp / "tokenizer.json")
            (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
            os.replace(tmp, self.cache_dir)
        except OSError:
            if not (self.cache_dir / "meta.json").is_file():  # not another process winning the race
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    @cached_property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer of the prepared arrays (prepares them first if needed)."""
        self.prepare_data()
        return load_tokenizer(self.cache_dir / "tokenizer.json")

    @cached_property
    def meta(self) -> dict:
        """About the prepared arrays: script, tokenizer kind, vocab_size, dtype, and per split
        poems, tokens and characters (of the poems' text, `<bos>`/`<eos>` not counted)."""
        self.prepare_data()
        return json.loads((self.cache_dir / "meta.json").read_text())

    def tokens(self, split: str) -> np.ndarray:
        """The memory-mapped `(N,)` token array of 'train' or 'val' (dtype: `meta["dtype"]`)."""
        return np.memmap(self.cache_dir / f"{split}.bin", dtype=self.meta["dtype"], mode="r")

    def setup(self, stage: str | None = None) -> None:
        """Open the memory-mapped arrays: random-offset training windows, non-overlapping validation windows."""
        self.train_set = Windows(self.tokens("train"), self.block_size, random_offsets=True)
        self.val_set = Windows(self.tokens("val"), self.block_size, random_offsets=False)

    def train_dataloader(self) -> StatefulDataLoader:
        """Shuffled batches of `(x, y)`, each `(batch_size, block_size) int64`, in an order drawn
        from `seed`. Resumable: torchdata's `StatefulDataLoader` has a `state_dict` (the sampler's
        generator and how many batches it has served), which Lightning saves in every checkpoint
        and loads on resume, so a resumed run gets the batches an uninterrupted run gets. The
        state is kept per worker process: a run resumes with the same `num_workers` (train.py
        checks), and the order with `num_workers=0` differs from the order with workers."""
        with warnings.catch_warnings():  # torchdata 0.11 calls torch.set_vital, deprecated, in every loader
            warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
            return StatefulDataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, drop_last=True,
                                      generator=torch.Generator().manual_seed(self.seed),
                                      num_workers=self.num_workers, persistent_workers=self.num_workers > 0)

    def val_dataloader(self) -> DataLoader:
        """Every validation window once, in order, `4 · batch_size` windows per batch."""
        return DataLoader(self.val_set, batch_size=self.batch_size * 4, shuffle=False,
                          num_workers=self.num_workers, persistent_workers=self.num_workers > 0)
