"""What a run records in its checkpoint beside the weights: `CheckpointMeta`, the one definition of
those keys, written by training (`model.training.lit.LitGPT.on_save_checkpoint`), read by
`model.loading` and fine-tuning (`from_checkpoint`), and handed to the engine when it is built
(`Engine(..., meta=...)`, `engine.meta`).

A checkpoint train.py writes (a dict, read as data: `model.loading.read_trained`) holds:
- `hyper_parameters`: LitGPT's arguments, which Lightning writes and a resumed run is built from:
  "model" (GPTConfig fields), "optim", "tokenizer" (its `state_dict()`; the plan tokens, and so
  `data.verse.plan.plan_ids`, are part of its vocabulary) and "script";
- `state_dict`: the weights (and the poem inputs' tables);
- the keys of `CheckpointMeta.to_checkpoint`, each only where it says something (a checkpoint
  without one was trained without it):
  "corpora": {"train": [file names], "also_validate": {name: file name}} (`Corpora`),
  "conditions": {"shares": {condition: share}, "poets": {poet: training poems}},
  "finetuned": {"from", "from_weights_sha", "poets", "corpus", "train_poems", "val_poems"} (`FineTuned`);
- Lightning's training state (optimizer, loops, ...) and LitGPT's `tokens_seen`.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Corpora:
    """The corpora a model was trained and validated on, where not the reference corpus alone.

    train: the training corpora's file names, in order (the reference's among them where it was
    trained on); also_validate: {validation set name (`val/<name>/bpc`): file name}; the files lie
    in the reference's folder. Empty (`Corpora()`, no `train`): the reference corpus alone.
    """
    train: tuple[str, ...] = ()
    also_validate: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, reference: Path, train: Sequence[Path], also_validate: Mapping[str, Path]) -> Corpora:
        """The record of a data module's corpora (`PoetryDataModule.corpus_path`, `train_paths`,
        `extra_val`): empty where every file it reads is the reference."""
        if set(train) | set(also_validate.values()) <= {reference}:
            return cls()
        return cls(tuple(p.name for p in train), {k: p.name for k, p in also_validate.items()})

    def options(self, corpus_dir: str | Path) -> dict:
        """The record back as `PoetryDataModule`'s options, the files in corpus_dir:
        {"train_corpora": [paths], "also_validate": {name: path}}; {} for the reference alone."""
        if not self.train:
            return {}
        folder = Path(corpus_dir)
        return {"train_corpora": [str(folder / n) for n in self.train],
                "also_validate": {k: str(folder / n) for k, n in self.also_validate.items()}}


@dataclass(frozen=True)
class FineTuned:
    """What a fine-tuned model started from and read (docs/finetuning.md).

    from_path: the base's checkpoint file, as the run found it; from_weights_sha: the digest of
    the base's weights (`model.loading.weights_sha`); poets: `data.poets` (empty: a corpus of
    one's own); corpus: the corpus file's name; train_poems, val_poems: the poems of its
    training and held-out splits.
    """
    from_path: str
    from_weights_sha: str
    poets: tuple[str, ...]
    corpus: str
    train_poems: int
    val_poems: int


@dataclass(frozen=True)
class CheckpointMeta:
    """What a checkpoint records beside the weights and LitGPT's hyper-parameters.

    conditions: {condition (title | poet | keywords): share of training poems given it, in [0, 1]}
    (`data.conditions`); {} for a model trained without condition segments. poets: {poet: training
    poems}, the most prolific first: the poets it was trained to write as ({} without conditions).
    corpora: the corpora beyond the reference (`Corpora`). finetuned: what a fine-tuned model
    started from and read, None for one trained from scratch. weights_sha: the digest of the
    weights it was read with (`model.loading.weights_sha`), None for a model not read from a
    checkpoint; derived from the weights, so never written.
    """
    conditions: Mapping[str, float] = field(default_factory=dict)
    poets: Mapping[str, int] = field(default_factory=dict)
    corpora: Corpora = field(default_factory=Corpora)
    finetuned: FineTuned | None = None
    weights_sha: str | None = None

    def to_checkpoint(self) -> dict:
        """The keys this adds to a checkpoint dict (module docstring), plain lists, dicts, strings
        and numbers only (a checkpoint is read as data); one that would say nothing is left out."""
        out = {}
        if self.corpora.train:
            out["corpora"] = {"train": list(self.corpora.train), "also_validate": dict(self.corpora.also_validate)}
        if self.conditions:
            out["conditions"] = {"shares": dict(self.conditions), "poets": dict(self.poets)}
        if (f := self.finetuned) is not None:
            out["finetuned"] = {"from": f.from_path, "from_weights_sha": f.from_weights_sha, "poets": list(f.poets),
                                "corpus": f.corpus, "train_poems": f.train_poems, "val_poems": f.val_poems}
        return out

    @classmethod
    def from_checkpoint(cls, ckpt: Mapping, weights_sha: str | None = None) -> CheckpointMeta:
        """The record of a checkpoint dict (`to_checkpoint`'s keys; others ignored, a missing one
        empty), with weights_sha, the digest of its weights, where the reader took it."""
        corpora, conditions, tuned = ckpt.get("corpora"), ckpt.get("conditions") or {}, ckpt.get("finetuned")
        return cls(conditions=dict(conditions.get("shares", {})), poets=dict(conditions.get("poets", {})),
                   corpora=Corpora(tuple(corpora["train"]), dict(corpora["also_validate"])) if corpora else Corpora(),
                   finetuned=None if tuned is None else FineTuned(
                       tuned["from"], tuned["from_weights_sha"], tuple(tuned["poets"]), tuned["corpus"],
                       tuned["train_poems"], tuned["val_poems"]),
                   weights_sha=weights_sha)
