"""Fine-tuning (`python train.py experiment=finetune init_from=<checkpoint or run folder>`): a
trained model continued on other poems, as nanoGPT's `init_from` and `finetune_shakespeare` do
(docs/finetuning.md).

The run keeps everything of the base that its weights depend on: the network's shape (conf/model
is overridden by the base's), the vocabulary (the data module frames the new poems with the
base's tokenizer and refuses characters outside it), the script, the plan tokens and the
condition markers (the data options follow the base). It starts from the base's weights; the
optimizer, schedule and step count start afresh. Its checkpoints record what it was fine-tuned
from and on (`finetune_record`), which `sample.py` and the other scripts read like any other
checkpoint's settings.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, open_dict

from data.tokenizer import Tokenizer, tokenizer_from_state
from data.verse.plan import plan_ids
from model.checkpoint_meta import CheckpointMeta, FineTuned
from model.loading import config_fields, find_checkpoint, read_trained, weights_sha
from model.training.checkpoints import FREE_ON_RESUME

log = logging.getLogger(__name__)


@dataclass
class Base:
    """The model a run is fine-tuned from: its checkpoint file, the checkpoint (read as data), its
    tokenizer, the digest of its weights (`model.loading.weights_sha`) and its record beside the
    weights (`CheckpointMeta.from_checkpoint`: the conditions and poets a fine-tuned model keeps)."""
    path: Path
    ckpt: dict
    tokenizer: Tokenizer
    sha: str
    meta: CheckpointMeta

    @classmethod
    def read(cls, init_from: str, checkpoint_dir: str | Path) -> Base:
        """The checkpoint `init_from` names (`model.loading.find_checkpoint`: a file, a run folder,
        or `last`), read as data. raises FileNotFoundError / ValueError in one line."""
        try:
            path = find_checkpoint(init_from, checkpoint_dir)
        except FileNotFoundError:
            raise FileNotFoundError(f"init_from={init_from}: no such checkpoint (a .ckpt file, a run folder, or last "
                                    f"for the newest under {checkpoint_dir})") from None
        ckpt = read_trained(path)
        sha = weights_sha(ckpt["state_dict"])
        return cls(path, ckpt, tokenizer_from_state(ckpt["hyper_parameters"]["tokenizer"]), sha,
                   CheckpointMeta.from_checkpoint(ckpt, sha))

    @classmethod
    def of(cls, path: Path, ckpt: dict) -> Base:
        """A fine-tuned checkpoint being resumed, as the base of its own vocabulary and framing."""
        meta = CheckpointMeta.from_checkpoint(ckpt)
        return cls(path, ckpt, tokenizer_from_state(ckpt["hyper_parameters"]["tokenizer"]),
                   meta.finetuned.from_weights_sha, meta)


def follow_base(cfg: DictConfig, base: Base, say=log.info) -> None:
    """Set, in place, what the run must share with its base: every GPTConfig field of conf/model
    (n_layer, n_embd, block_size, ...; not `dropout` and the attention backend, free as on resume),
    `data.script`, `data.plan_tokens` and `data.conditions`' shares (none for a base without
    condition markers); with `data.poets`, the corpora the base read (`data.train_corpora`, in the
    folder of `data.corpus_path`: a 词 base's poets are found in the 全宋词 too) and no other
    validation set than the poets' own. Said (`say`, the log) where it changes a value."""
    hp = base.ckpt["hyper_parameters"]
    ids = plan_ids(base.tokenizer)
    corpora = base.meta.corpora.options(Path(cfg.data.corpus_path).parent) if cfg.data.get("poets") else {}
    wanted = {**{f"model.{k}": v for k, v in config_fields(hp["model"]).items()
                 if k in cfg.model and k not in FREE_ON_RESUME},
              "data.script": hp.get("script", "simplified"), "data.plan_tokens": ids is not None,
              "data.conditions": (dict(base.meta.conditions) or None) if ids and ids.segments else None,
              **({"data.train_corpora": corpora["train_corpora"], "data.also_validate": None} if corpora else {})}
    with open_dict(cfg):
        for key, value in wanted.items():
            group, name = key.split(".")
            if cfg[group].get(name) != value:
                say(f"{key}={value}: as the base {base.path} (fine-tuning keeps it)")
                cfg[group][name] = value


def finetune_record(base: Base, cfg: DictConfig, meta: dict) -> FineTuned:
    """What a fine-tuned checkpoint records of its start and its data (`FineTuned`: the base's
    file and weights' digest, `data.poets`, the corpus file's name, the training and held-out
    poems; meta: the data module's `meta`)."""
    return FineTuned(str(base.path), base.sha, tuple(cfg.data.get("poets") or ()), Path(cfg.data.corpus_path).name,
                     meta["train"]["poems"], meta["val"]["poems"])


def finetune_tag(poets, corpus_path: str) -> str:
    """The part of a fine-tuning run's name that says what it read (conf/experiment/finetune.yaml):
    `ft-<poets in pinyin, joined by _>` (李白 → ft-libai), else `ft-<the corpus file's name>` (my.txt → ft-my_txt),
    ASCII letters, digits, `_` and `-` only, at most 40 characters."""
    from pypinyin import lazy_pinyin

    names = [str(p) for p in poets or ()]
    what = "_".join("".join(lazy_pinyin(n)) for n in names) if names else Path(str(corpus_path)).name.replace(".", "_")
    return "ft-" + (re.sub(r"[^A-Za-z0-9_-]+", "", what)[:40] or "corpus")


NEEDS_BASE = "experiment=finetune needs init_from=<a checkpoint or run folder> (the model to fine-tune)"


def is_finetuning(cfg: DictConfig) -> bool:
    """Whether a training config is a fine-tuning run (`init_from`, or `experiment=finetune`'s run_tag)."""
    return bool(cfg.get("init_from")) or str(cfg.get("run_tag", "")).startswith("-ft-")


def check_resume(record: FineTuned, cfg: DictConfig, path: Path) -> None:
    """raises ValueError where a fine-tuned checkpoint (its `finetuned` record) is resumed on other data
    or without `experiment=finetune`: the run would go on with the default's steps or another corpus."""
    poets, corpus = tuple(cfg.data.get("poets") or ()), Path(cfg.data.corpus_path).name
    if str(cfg.get("run_tag", "")).startswith("-ft-") and poets == record.poets and corpus == record.corpus:
        return
    data = f'"data.poets=[{",".join(record.poets)}]"' if record.poets else f"data.corpus_path=<{record.corpus}>"
    raise ValueError(f"{path} is a fine-tuning run on {', '.join(record.poets) or record.corpus}: resume it as "
                     f"it was started, python train.py experiment=finetune {data} ckpt_path={path.parent}")
