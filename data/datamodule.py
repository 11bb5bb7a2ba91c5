"""LightningDataModule: shipped corpus → cached token arrays → `(x, y)` windows.

Preparation (once, cached under `cache_dir/<key>/`, rebuilt when the corpus file or the
settings change): read `tang.jsonl.xz`, convert to the configured script with OpenCC,
build the vocabulary (characters, or the corpus's tokens of a tiktoken encoding), and write
`train.bin` / `val.bin` (ids as uint16, or uint32 for vocabularies over 65,536; each poem
framed as `<bos> text <eos>`, or with `plan_tokens` as `<bos> <form> <rhyme> text <eos>`
(`data/verse/plan.py`), poems in corpus order; with `conditions` a training poem's condition
segment goes after `<bos>`, and `val_titled.bin` holds the held-out poems with their titles,
each where the poem still fits its window with it, as training gives one: `data.conditions.fitted`)
plus `tokenizer.json` and `meta.json`.
Training and validation read those files memory-mapped.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from difflib import SequenceMatcher
from functools import cached_property
from pathlib import Path

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Timer
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from torch.utils.data import DataLoader, Dataset
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import RandomSampler

from data.anneal import AnnealSampler, annealing_windows
from data.conditions import check_shares, draw_conditions, fitted, poets, segment_positions
from data.corpus_io import load_corpus
from data.tokenizer import CharTokenizer, TiktokenTokenizer, Tokenizer, load_encoding, load_tokenizer
from data.verse.ci import CI
from data.verse.plan import clean_title, plan_ids, plan_labels, poem_ids
from data.verse.script import SCRIPTS, corpus_to_script
from data.windows import VAL_WINDOWS, PoemWindows, Windows, train_starts

log = logging.getLogger(__name__)
CI_CORPUS = "ci.jsonl.xz"
"""The 词 corpus: with plan tokens, a model trained on it gets a token per tune (`data.verse.plan`)."""
SIMPLIFIED_CORPORA = (CI_CORPUS,)
"""Corpora published in simplified script (the others are traditional, converted with OpenCC)."""

CACHE_VERSION = 4  # bump when the prepared format changes (4: val_titled gives a title only where the poem fits)
TOKENIZER_KINDS = ("char", "tiktoken")


class PoetryDataModule(L.LightningDataModule):
    """Serves windows of the shipped 全唐诗 corpus.

    corpus_path: `tang.jsonl.xz`; script: 'simplified' | 'traditional'; block_size: T;
    batch_size: B per device; cache_dir: where prepared arrays live (outside git);
    tokenizer: `{"kind": "char"}` (default) or `{"kind": "tiktoken", "encoding": <name or
    .tiktoken path>}` (the `tokenizer` config group); training windows start at a poem's `<bos>`
    (`train_starts`); val_windows: 'poems' (every held-out poem scored from its `<bos>`) |
    'blocks' (non-overlapping windows of the array, nanoGPT's).
    Both validations score every held-out character once, so `val/bpc` counts the same text.
    seed: of the training order (the run's).
    plan_tokens: frame every poem as `<bos> <form> <rhyme> text <eos>` (`data/verse/plan.py`); the
    tokenizer then carries the plan tokens.
    train_corpora: the corpus files whose training splits are trained on, in order (None: corpus_path
    alone; `data=tang+song`); corpus_path's validation split stays the reference
    (`val/loss`, `val/bpc`), whatever is trained on. also_validate: {name: corpus file} whose
    validation splits are scored beside it (`val/<name>/loss`, `val/<name>/bpc`). The vocabulary
    covers every corpus named.
    mid_poem_fraction: the share of training windows that start at a random offset (`train_starts`).
    anneal_fraction: the share of the run's last training windows drawn only from those that start
    a poem whose even lines rhyme, each form in its share (`annealing_windows`); a run without
    `trainer.max_steps` (budget mode) has none, and says so.
    conditions: {title, poet, keywords: share of the training poems given it} (`data/conditions.py`;
    None or all 0: none); needs plan_tokens. Segment targets are never scored (`PlanIds.segment_mask`).
    poets: train and validate on these poets' poems only (either script; the `author` of every
    corpus read), their training poems and their held-out ones from every training corpus (the
    validation split `val`; fine-tuning a voice, docs/finetuning.md).
    base_tokenizer: a trained model's vocabulary, kept instead of building one (fine-tuning):
    `prepare_data` refuses poems with characters outside it.
    raises ValueError for an unknown script, tokenizer kind, val_windows or condition, a share
    outside [0, 1), or a base tokenizer whose plan tokens or condition markers the options contradict.
    """

    def __init__(self, corpus_path: str, cache_dir: str, script: str = "simplified",
                 block_size: int = 64, batch_size: int = 32, num_workers: int = 0,
                 tokenizer: Mapping | None = None, val_windows: str = "poems", seed: int = 0,
                 plan_tokens: bool = False, train_corpora: Sequence[str] | None = None,
                 also_validate: Mapping[str, str] | None = None, mid_poem_fraction: float = 0.0,
                 anneal_fraction: float = 0.0, conditions: Mapping[str, float] | None = None,
                 poets: Sequence[str] = (), base_tokenizer: Tokenizer | None = None):
        super().__init__()
        if val_windows not in VAL_WINDOWS:
            raise ValueError(f"data.val_windows={val_windows!r} is not one of {VAL_WINDOWS}")
        self.val_windows = val_windows
        if script not in SCRIPTS:
            raise ValueError(f"data.script={script!r} is not one of {sorted(SCRIPTS)}")
        self.tokenizer_cfg = dict(tokenizer or {"kind": "char"})
        if self.tokenizer_cfg.get("kind") not in TOKENIZER_KINDS:
            raise ValueError(f"tokenizer.kind={self.tokenizer_cfg.get('kind')!r} is not one of {TOKENIZER_KINDS}")
        self.corpus_path, self.cache_root = Path(corpus_path), Path(cache_dir)
        self.script, self.block_size = script, block_size
        self.batch_size, self.num_workers, self.seed = batch_size, num_workers, seed
        self.plan_tokens = bool(plan_tokens)
        self.train_paths = [Path(p) for p in train_corpora] if train_corpora else [self.corpus_path]
        self.tunes = self.plan_tokens and any(p.name == CI_CORPUS for p in self.train_paths)  # tune tokens
        if script != "simplified" and (ci := [p.name for p in self.train_paths if p.name in SIMPLIFIED_CORPORA]):
            raise ValueError(f"{ci[0]} (the 词) is in simplified script only and has no traditional text: "
                             f"train it with data.script=simplified")
        self.mid_poem_fraction = float(mid_poem_fraction)
        if not 0 <= self.mid_poem_fraction < 1:
            raise ValueError(f"data.mid_poem_fraction={mid_poem_fraction} is not in [0, 1)")
        self.anneal_fraction = float(anneal_fraction)
        if not 0 <= self.anneal_fraction < 1:
            raise ValueError(f"data.anneal_fraction={anneal_fraction} is not in [0, 1)")
        self.conditions = check_shares(conditions or {})
        if not any(self.conditions.values()):
            self.conditions = {}
        if self.conditions and not self.plan_tokens:
            raise ValueError("data.conditions needs data.plan_tokens=true (the segment goes before the plan); "
                             "with data.plan_tokens=false add data.conditions=null")
        self.poets = list(dict.fromkeys(str(p).strip() for p in poets or () if str(p).strip()))
        self.base_tokenizer = base_tokenizer
        if base_tokenizer is not None:
            check_base_tokenizer(base_tokenizer, self.plan_tokens, bool(self.conditions))
        self.extra_val = {str(k): Path(v) for k, v in (also_validate or {}).items()}
        if bad := [k for k in self.extra_val if not k.isidentifier()]:
            raise ValueError(f"data.also_validate names must be plain words (val/<name>/bpc), not {bad}")

    @property
    def corpora(self) -> list[Path]:
        """Every corpus file this module reads, the reference first, without repeats."""
        return list(dict.fromkeys([self.corpus_path, *self.train_paths, *self.extra_val.values()]))

    @property
    def val_names(self) -> list[str]:
        """The validation sets in dataloader order: "" (the reference), then `also_validate`'s names."""
        return ["", *self.extra_val]

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
        (script, tokenizer kind, encoding name, which for a ranks file includes its SHA-256, and
        plan_tokens when on, the tune labels when a 词 corpus gives tune tokens, conditions and
        block_size when on: the arrays without them keep their key)."""
        for path in self.corpora:
            if not path.is_file():
                load_corpus(path)  # raises the explanatory FileNotFoundError
        tokenizer = {"kind": self.tokenizer_cfg["kind"], **({"encoding": self.encoding.name} if self.encoding else {})}
        h = hashlib.sha256(self.corpus_path.read_bytes())
        settings = {"script": self.script, "tokenizer": tokenizer, "v": CACHE_VERSION}
        if self.corpora != [self.corpus_path]:  # more corpora: their bytes and roles (Tang alone keeps its key)
            for path in self.corpora[1:]:
                h.update(path.read_bytes())
            settings["roles"] = {"train": [self.corpora.index(p) for p in self.train_paths],
                                 "val": {k: self.corpora.index(p) for k, p in self.extra_val.items()}}
        if self.poets:
            settings["poets"] = self.poets
        if self.base_tokenizer is not None:  # fine-tuning: the base's vocabulary, not one of this data
            settings["base_tokenizer"] = hashlib.sha256(json.dumps(self.base_tokenizer.state_dict()).encode()).hexdigest()
        h.update(json.dumps({**settings, **({"plan_tokens": True} if self.plan_tokens else {}),
                             **({"tunes": list(plan_labels(tunes=True))} if self.tunes else {}),
                             **({"conditions": self.conditions, "block_size": self.block_size}
                                if self.conditions else {})}).encode())
        return self.cache_root / h.hexdigest()[:16]

    def _build_tokenizer(self, texts: list[str]) -> Tokenizer:
        plan = plan_labels(segments=bool(self.conditions), tunes=self.tunes) if self.plan_tokens else ()
        if self.encoding is None:
            return CharTokenizer.from_texts(texts, plan)
        spec = str(self.tokenizer_cfg["encoding"])
        source = spec if self.encoding.name == spec else str(Path(spec).expanduser().resolve())  # a file: absolute
        return TiktokenTokenizer.from_texts(self.encoding, texts, source, plan)

    def check_data(self) -> None:
        """Read the corpora as `prepare_data` would and raise its errors (a user corpus's bad line, a
        poet the corpus lacks, characters outside a base vocabulary), writing nothing: what a
        fine-tuning run checks before Hydra writes its folder (`model.training.start.CheckStart`); the
        poets' poems are counted in the log once, by `prepare_data`."""
        self._read(say=False)

    def _read(self, say: bool = True) -> tuple[dict, dict, dict, Tokenizer]:
        """(poems by corpus, their texts in the script, their titles and authors by field when there are
        conditions, the tokenizer: the base's, or one built from them). raises as `prepare_data`.
        say: log how many poems `data.poets` found."""
        corpora = {path: load_corpus(path) for path in self.corpora}
        if self.poets:
            corpora = poets_poems(corpora, self.poets, self.script, say)
        texts = {path: corpus_to_script([p["text"] for p in poems], self.script) for path, poems in corpora.items()}
        names = {field: {path: corpus_to_script([p.get(field, "") for p in poems], self.script)
                         for path, poems in corpora.items()} for field in ("title", "author")} \
            if self.conditions else {}
        if self.base_tokenizer is not None:
            tok = self.base_tokenizer
            check_vocabulary(tok, [t for ts in texts.values() for t in ts])
            names = {f: {path: [n if not tok.unknown(n) else "" for n in ns] for path, ns in by_path.items()}
                     for f, by_path in names.items()}  # a title or name it cannot write is not given
        else:
            tok = self._build_tokenizer([t for field in (texts, *names.values()) for ts in field.values() for t in ts])
        return corpora, texts, names, tok

    def prepare_data(self) -> None:
        """Build the cached arrays if they are missing. Safe to interrupt: the folder
        appears only once complete (written to a temporary folder, then renamed)."""
        if (self.cache_dir / "meta.json").is_file():
            return
        corpora, texts, names, tok = self._read()
        val = self.train_paths if self.poets else [self.corpus_path]  # a poet's held-out poems in any corpus read
        arrays = {"train": [(path, "train") for path in self.train_paths], "val": [(path, "val") for path in val],
                  **({"val_titled": [(path, "val") for path in val]} if self.conditions else {}),
                  **{f"val_{name}": [(path, "val")] for name, path in self.extra_val.items()}}
        listed = poets([a for path in self.train_paths for p, a in zip(corpora[path], names["author"][path])
                        if p["split"] == "train"]) if self.conditions else {}
        dtype = np.uint16 if tok.vocab_size <= 1 << 16 else np.uint32
        self.cache_root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=self.cache_root))
        try:
            meta = {"script": self.script, "tokenizer": tok.state_dict()["kind"], "vocab_size": tok.vocab_size,
                    "dtype": np.dtype(dtype).name, "corpus": str(self.corpus_path.name),
                    **({"corpora": [p.name for p in self.corpora]} if len(self.corpora) > 1 else {}),
                    **({"plan_tokens": True} if self.plan_tokens else {}),
                    **({"conditions": self.conditions, "poets": listed} if self.conditions else {})}
            for split, parts in arrays.items():
                split_poems = [(p, t, *(names[f][path][k] for f in names)) for path, part in parts
                               for k, (p, t) in enumerate(zip(corpora[path], texts[path])) if p["split"] == part]
                split_texts = [t for _, t, *_ in split_poems]
                ids = [poem_ids(tok, t, self.script, p["form"], tune=p.get("tune", "")) for p, t, *_ in split_poems]
                if split == "train" and self.conditions:  # each segment fits the poem's window (`fitted`)
                    drawn = draw_conditions(split_texts, *zip(*[n for _, _, *n in split_poems]), self.conditions, listed)
                    segments = [fitted(tok, d, self.block_size + 1 - len(i)) for d, i in zip(drawn, ids)]
                    ids = [[i[0], *g, *i[1:]] for i, g in zip(ids, segments)]
                elif split == "val_titled":  # a title as training gives it: only where the poem still fits
                    ids = [[i[0], *fitted(tok, {"title": clean_title(title), "poet": "", "keywords": []},
                                          self.block_size + 1 - len(i)), *i[1:]]
                           for i, (_, _, title, _) in zip(ids, split_poems)]
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
        """About the prepared arrays: script, tokenizer kind, vocab_size, dtype, `plan_tokens: true`
        if on, and per split poems, tokens and characters (of the poems' text, `<bos>`/`<eos>` and plan tokens not
        counted)."""
        self.prepare_data()
        return json.loads((self.cache_dir / "meta.json").read_text())

    def tokens(self, split: str) -> np.ndarray:
        """The memory-mapped `(N,)` token array of 'train' or 'val' (dtype: `meta["dtype"]`)."""
        return np.memmap(self.cache_dir / f"{split}.bin", dtype=self.meta["dtype"], mode="r")

    def token_counts(self) -> np.ndarray:
        """(vocab_size,) int64: how often each id is a target in the training array (a condition
        segment's tokens never are)."""
        train = self.tokens("train")
        unscored = self.unscored(train)
        kept = train if unscored is None else train[~unscored]
        return np.bincount(kept, minlength=self.meta["vocab_size"]).astype(np.int64)

    def setup(self, stage: str | None = None) -> None:
        """Open the memory-mapped arrays and cut them into windows (`train_starts`, `val_windows`)."""
        train = self.tokens("train")
        self.train_set = Windows(train, self.block_size, train_starts(train, self.block_size, Tokenizer.bos_id,
                                                                      self.mid_poem_fraction, self.seed),
                                 self.unscored(train))
        if self.anneal_fraction:  # indices of the windows that start a rhymed poem
            self.anneal_windows = annealing_windows(self.train_set.starts, train, self.tokenizer, self.script,
                                                    self.seed)
        self.val_sets = [self._val_windows(self.tokens("val" if not name else f"val_{name}")) for name in self.val_names]
        self.val_set = self.val_sets[0]

    def unscored(self, tokens: np.ndarray) -> np.ndarray | None:
        """(N,) bool: the positions of a token array inside condition segments, whose targets are
        not scored (`PlanIds.segment_mask`); None without conditions."""
        return segment_positions(tokens, plan_ids(self.tokenizer)) if self.conditions else None

    def _val_windows(self, val: np.ndarray) -> Dataset:
        unscored = self.unscored(val)
        return PoemWindows(val, self.block_size, Tokenizer.bos_id, unscored) if self.val_windows == "poems" \
            else Windows.blocks(val, self.block_size, unscored)

    def train_dataloader(self) -> StatefulDataLoader:
        """Shuffled batches of `(x, y)`, each `(batch_size, block_size) int64`, in an order drawn
        from `seed`. Resumable: torchdata's `StatefulDataLoader` has a `state_dict` (the sampler's
        generator and how many batches it has served), which Lightning saves in every checkpoint
        and loads on resume, so a resumed run gets the batches an uninterrupted run gets, in
        this epoch and every later one. The sampler has a generator of its own: the loader's
        generator also draws each iterator's worker seed, and shared it would leave a resumed
        run's later epochs in another order. A run resumes with the same `num_workers`
        (train.py checks)."""
        sampler = self._anneal_sampler() or RandomSampler(self.train_set,
                                                          generator=torch.Generator().manual_seed(self.seed))
        with warnings.catch_warnings():  # torchdata 0.11 calls torch.set_vital, deprecated, in every loader
            warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
            return StatefulDataLoader(self.train_set, batch_size=self.batch_size, sampler=sampler, drop_last=True,
                                      num_workers=self.num_workers, persistent_workers=self.num_workers > 0)

    def _anneal_sampler(self) -> AnnealSampler | None:
        """The whole run's order with its annealing phase (`data/anneal.py`), this process's share of
        it; None without `anneal_fraction`, or, with a warning, without `trainer.max_steps` (budget
        mode: the phase is a share of the run's steps) or without a rhymed training poem (a poet's
        own 词 or free verse may have none)."""
        trainer = self.trainer
        if not self.anneal_fraction:
            return None
        why = ("it needs trainer.max_steps (the phase is a share of the run's steps)"
               if trainer is None or trainer.max_steps < 1 or any(isinstance(c, Timer) for c in trainer.callbacks)
               else "no training poem rhymes" if len(self.anneal_windows) == 0 else None)
        if why:
            rank_zero_only(log.warning)(f"data.anneal_fraction={self.anneal_fraction}: "
                                        f"no annealing phase in this run; {why}")
            return None
        total = trainer.max_steps * trainer.accumulate_grad_batches * self.batch_size
        return AnnealSampler(len(self.train_set), self.anneal_windows, total, self.anneal_fraction, self.seed,
                             trainer.world_size, trainer.global_rank)

    def val_dataloader(self) -> DataLoader | list[DataLoader]:
        """Every validation window exactly once, in order, `4 · batch_size` windows per batch.
        Under w processes (DDP, any number of devices and nodes) rank r takes windows r, r + w,
        ... and nothing more (Lightning's UnrepeatedDistributedSampler): the DistributedSampler
        Lightning would add pads every rank to as many windows, scoring some twice. With
        `also_validate`, a list: the reference's loader, then one per name (`val_names`)."""
        world, rank = (self.trainer.world_size, self.trainer.global_rank) if self.trainer else (1, 0)
        loaders = []
        for val_set in self.val_sets:
            sampler = UnrepeatedDistributedSampler(val_set, num_replicas=world, rank=rank, shuffle=False) \
                if world > 1 else None
            loaders.append(DataLoader(val_set, batch_size=self.batch_size * 4, sampler=sampler,
                                      num_workers=self.num_workers, persistent_workers=self.num_workers > 0))
        return loaders[0] if len(loaders) == 1 else loaders


def check_base_tokenizer(tok: Tokenizer, plan_tokens: bool, conditions: bool) -> None:
    """raises ValueError where a base model's vocabulary (fine-tuning) cannot frame poems as the
    options ask: plan tokens it lacks or has, condition markers it lacks."""
    ids = plan_ids(tok)
    if plan_tokens != (ids is not None):
        has = ids is not None
        raise ValueError(f"data.plan_tokens={str(plan_tokens).lower()}, but the base model was trained "
                         f"{'with' if has else 'without'} plan tokens: set data.plan_tokens={str(has).lower()}")
    if conditions and not (ids and ids.segments):
        raise ValueError("data.conditions: the base model was trained without conditions; add data.conditions=null")


def check_vocabulary(tok: Tokenizer, texts: Sequence[str], shown: int = 8) -> None:
    """raises ValueError in one line if `texts` hold characters the (base) vocabulary lacks: how many
    characters, how many distinct, and the commonest."""
    missing = Counter(c for t in texts for c in t if tok.unknown(c))
    if missing:
        examples = "".join(c for c, _ in missing.most_common(shown))
        raise ValueError(f"{sum(missing.values()):,} characters of the poems ({len(missing):,} distinct, e.g. "
                         f"{examples!r}) are outside the base model's vocabulary of {tok.vocab_size:,}; fine-tuning "
                         "keeps its vocabulary: remove those poems, or train a model of your own on them")


def poets_poems(corpora: Mapping[Path, list[dict]], poets: Sequence[str], script: str,
                say: bool = True) -> dict[Path, list[dict]]:
    """The poems of `poets` (either script) in each corpus, by its `author` field; `say`: log how many
    诗 (and 词, where a corpus of 词 was read or some were found). raises ValueError for a poet with no
    training poem in any corpus, naming the nearest authors, or with no held-out one."""
    authors = {path: corpus_to_script([p.get("author", "") for p in poems], script) for path, poems in corpora.items()}
    wanted = dict(zip(corpus_to_script(list(poets), script), poets))
    counts = Counter((a, p["split"]) for path, poems in corpora.items() for a, p in zip(authors[path], poems))
    for name, given in wanted.items():
        if not counts[(name, "train")]:
            known = Counter({a: n for (a, split), n in counts.items() if split == "train" and a})
            near = sorted(known, key=lambda a: (-SequenceMatcher(None, name, a).ratio(), -known[a]))[:3]
            raise ValueError(f"data.poets: {given} has no training poem in the corpus; nearest authors: {', '.join(near)}")
        if not counts[(name, "val")]:
            raise ValueError(f"data.poets: {given} has no held-out poem to validate on (the corpus's val split)")
    found = {path: [p for a, p in zip(authors[path], poems) if a in wanted] for path, poems in corpora.items()}
    ci = sum(p.get("form") == CI for poems in found.values() for p in poems)
    if say:
        kinds = f"{sum(map(len, found.values())) - ci:,} 诗" + (f" and {ci:,} 词" if ci or len(corpora) > 1 else "")
        log.info(f"data.poets={list(poets)}: {kinds} (training and held-out) in {', '.join(path.name for path in found)}")
    return found
