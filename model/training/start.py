"""How a run starts, decided once: nanoGPT's `init_from` switch for this project's four starts.

- `scratch` (neither option): weights initialised, vocabulary built from the data, shape from conf/model;
- `resume` (`ckpt_path=<run or file>`): the checkpoint's weights, optimizer and step; its shape and
  vocabulary, checked;
- `finetune` (`experiment=finetune init_from=<run or file>`): the base's weights, optimizer and steps
  afresh; the base's shape, vocabulary and data framing (`finetune.follow_base`);
- `resume-finetune` (`experiment=finetune ckpt_path=<a fine-tuning run>`): the checkpoint's weights,
  optimizer and step; its base's vocabulary and framing, on the data it began on.

`resolve_start` reads the options and the checkpoints once and returns a frozen `Start`. Hydra's
callback `CheckStart` resolves it before the run's folder is made (a refused run writes nothing),
and `train()` takes the same record: the resolution is kept for the config and checkpoint files it
was made from (their names, sizes and times), so the second call reads nothing again.
"""
from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from hydra.experimental.callback import Callback
from hydra.utils import instantiate
from omegaconf import DictConfig

from model.checkpoint_meta import CheckpointMeta
from model.loading import find_checkpoint
from model.training.checkpoints import load_checkpoint
from model.training.finetune import NEEDS_BASE, Base, check_resume, follow_base, is_finetuning

log = logging.getLogger(__name__)
SCRATCH, RESUME, FINETUNE, RESUME_FINETUNE = "scratch", "resume", "finetune", "resume-finetune"


@dataclass(frozen=True)
class Start:
    """A run's start (module docstring). mode: one of SCRATCH, RESUME, FINETUNE, RESUME_FINETUNE;
    ckpt_path: the checkpoint resumed, saved: it read as data (memory-mapped), both only when
    resuming; base: the model fine-tuned from (FINETUNE), or the resumed fine-tuned checkpoint as
    the base of its own vocabulary and framing (RESUME_FINETUNE), else None."""
    mode: str
    ckpt_path: Path | None = None
    saved: Mapping = field(default_factory=dict)
    base: Base | None = None

    @property
    def resuming(self) -> bool:
        return self.ckpt_path is not None


_kept: tuple[tuple, Start] | None = None


def resolve_start(cfg: DictConfig, keep: bool = True) -> Start:
    """The start `cfg` asks for (`ckpt_path`, `init_from`, `experiment=finetune`), the checkpoints
    read once: a call with the same options and files as the one before returns its record; keep:
    whether a next call may still do so (`train()` takes it: the next run resolves its own, and
    Lightning's restoring never reaches a record kept).

    raises FileNotFoundError / ValueError in one line: a missing checkpoint or base;
    `experiment=finetune` without `init_from`; `init_from` beside a `ckpt_path` that is no
    fine-tuning run; a fine-tuned checkpoint resumed on other data or without `experiment=finetune`
    (`finetune.check_resume`)."""
    global _kept
    ckpt_path = find_checkpoint(cfg.ckpt_path, cfg.paths.checkpoint_dir) if cfg.get("ckpt_path") else None
    key = (_stamp(ckpt_path), cfg.get("init_from"), _stamp_of(cfg.get("init_from"), cfg.paths.checkpoint_dir),
           is_finetuning(cfg), tuple(cfg.data.get("poets") or ()), Path(cfg.data.corpus_path).name)
    start = _kept[1] if _kept is not None and _kept[0] == key else _decide(cfg, ckpt_path)
    _kept = (key, start) if keep else None
    return start


def _stamp(path: Path | None) -> tuple | None:
    return None if path is None else (str(path), path.stat().st_size, path.stat().st_mtime_ns)


def _stamp_of(spec: str | None, folder: str) -> tuple | None:
    try:
        return _stamp(find_checkpoint(spec, folder)) if spec else None
    except FileNotFoundError:
        return None


def _decide(cfg: DictConfig, ckpt_path: Path | None) -> Start:
    if ckpt_path is not None:
        saved = load_checkpoint(ckpt_path)
        if (record := CheckpointMeta.from_checkpoint(saved).finetuned) is not None:
            check_resume(record, cfg, ckpt_path)  # its own data and recipe, not the default's
            return Start(RESUME_FINETUNE, ckpt_path, saved, Base.of(ckpt_path, saved))
        if cfg.get("init_from"):
            raise ValueError(f"ckpt_path={ckpt_path} is no fine-tuning run, and init_from={cfg.init_from} starts one: "
                             "give ckpt_path to resume it, or init_from to fine-tune")
        if is_finetuning(cfg):
            raise ValueError(NEEDS_BASE)
        return Start(RESUME, ckpt_path, saved)
    if not is_finetuning(cfg):
        return Start(SCRATCH)
    if not cfg.get("init_from"):
        raise ValueError(NEEDS_BASE)
    return Start(FINETUNE, base=Base.read(cfg.init_from, cfg.paths.checkpoint_dir))


def say_start(start: Start, cfg: DictConfig, say=log.info) -> None:
    """The start in the run's log: the checkpoint resumed and its step, or the base fine-tuned."""
    if start.resuming:
        say(f"resuming from {start.ckpt_path} (step {start.saved.get('global_step')})")
        if start.mode == RESUME_FINETUNE and cfg.get("init_from"):
            say(f"init_from={cfg.init_from} is not read: resuming {start.ckpt_path}, a fine-tuning run, "
                "from its own weights")
    elif start.mode == FINETUNE:
        base = start.base
        say(f"fine-tuning {base.path} (step {base.ckpt.get('global_step')}"
            + (f", itself fine-tuned from {base.meta.finetuned.from_path}" if base.meta.finetuned else "") + ")")


def check_start(cfg: DictConfig) -> Start:
    """`resolve_start`, and for a fine-tuning run its data read and checked as the run will read it
    (nothing written). raises as `resolve_start`; ValueError in one line for a poet the corpora
    lack, a user corpus's bad line or no poem, characters outside the base's vocabulary."""
    start = resolve_start(cfg)
    if start.mode == FINETUNE:
        cfg = copy.deepcopy(cfg)
        follow_base(cfg, start.base, say=lambda line: None)  # the run says it
        instantiate(cfg.data, base_tokenizer=start.base.tokenizer).check_data()
    return start


class CheckStart(Callback):
    """Hydra callback (conf/hydra/default.yaml): the run's start resolved and a fine-tuning run's data
    checked in `on_run_start` (`check_start`), before Hydra writes the run's folder, so a refused
    run writes nothing and says why in one line (exit status 1)."""

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        try:
            check_start(config)
        except (ValueError, FileNotFoundError) as err:  # bad input: one line, as the entry points say it
            raise SystemExit(f"error: {err}") from None
