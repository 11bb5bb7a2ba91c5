"""Checkpoint files: written atomically, never "best" with a loss that is not a number, and
checked before a run resumes from one.

`ckpt_path` (conf/train.yaml) is found by `model.loading.find_checkpoint`, as in every script;
a checkpoint of another shape or vocabulary than the config asks for is refused in one line
before any training (docs/training.md, "Resume and interruption").
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities import rank_zero_warn

from data.tokenizer import SPECIALS
from model.gpt import GPTConfig
from model.loading import config_fields, read_checkpoint, read_trained

FREE_ON_RESUME = ("dropout", "backend")
"""GPTConfig fields a resumed run may change; every other one shapes the network."""


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's torch checkpoint writer, made atomic: each checkpoint is written to a
    temporary file beside its path, then renamed over it (`os.replace`), so a save
    interrupted at any point leaves the previous file (e.g. `last.ckpt`) whole and loadable.
    Resuming (`trainer.fit(ckpt_path=...)`) reads the file as data only (`read_checkpoint`);
    `read`: (path, checkpoint) that train.py has read and checked already, handed to Lightning as
    it is, once, instead of read again."""

    def __init__(self, read: tuple[Path, dict] | None = None):
        super().__init__()
        self.read = read

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        path = Path(path)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            super().save_checkpoint(checkpoint, tmp, storage_options)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    def load_checkpoint(self, path, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        """The checkpoint at local `path`, tensors on the CPU, whatever `weights_only` Lightning
        passes. raises UnsafeCheckpointError / ValueError as `read_checkpoint`."""
        if self.read is not None and os.path.realpath(path) == os.path.realpath(self.read[0]):
            (_, ckpt), self.read = self.read, None
            return ckpt
        return read_checkpoint(path)


class FiniteModelCheckpoint(ModelCheckpoint):
    """Lightning's ModelCheckpoint, except that
    - a non-finite monitored value (`val/loss` NaN or inf) never makes a checkpoint one of the best:
      Lightning ranks NaN as the worst value but still keeps the checkpoint while `save_top_k` has
      room, e.g. as the first best;
    - with `save_last`, `last.ckpt` is the last validation's step and, at the end, the run's last
      step, whether or not `val/loss` improved there: Lightning 2.6 writes it only beside a new best,
      so a run whose `val/loss` rose after step 100 (a fine-tuning run) kept step 100 as its "last"."""

    def on_validation_end(self, trainer, pl_module) -> None:
        super().on_validation_end(trainer, pl_module)
        self._save_last_if_behind(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        super().on_train_end(trainer, pl_module)
        self._save_last_if_behind(trainer)

    def _save_last_if_behind(self, trainer) -> None:
        """`last.ckpt` at this step, unless it is there already or the monitored value is not finite
        (a run gone NaN leaves no checkpoint of it, as before)."""
        candidates = self._monitor_candidates(trainer)
        current = candidates.get(self.monitor) if self.monitor else None
        if self.save_last and not self._should_skip_saving_checkpoint(trainer) \
                and self._last_global_step_saved != trainer.global_step \
                and (current is None or torch.isfinite(current)):
            self._save_last_checkpoint(trainer, candidates)

    def check_monitor_top_k(self, trainer, current: torch.Tensor | None = None) -> bool:
        if current is not None and not torch.isfinite(current):
            rank_zero_warn(f"{self.monitor} is {current.item()} at step {trainer.global_step}: "
                           "not kept as a best checkpoint")
            return False
        return super().check_monitor_top_k(trainer, current)


def load_checkpoint(path: Path) -> dict:
    """Checkpoint `path` as this project's train.py wrote it, memory-mapped on the CPU; read as data
    only (`model.loading.read_trained`: raises UnsafeCheckpointError, or ValueError in one line for
    a file that is not such a checkpoint)."""
    return read_trained(path, mmap=True)


def check_same_shape(ckpt: Mapping, model: Mapping, path: Path) -> None:
    """raises ValueError `model.n_layer: checkpoint 4, asked 2 ...` for the first GPTConfig
    field (n_layer, n_embd, head, ...) whose value in `model` differs from checkpoint `ckpt`'s;
    dropout and the attention backend may change on resume. A field the checkpoint predates
    (e.g. `phonology`) counts as GPTConfig's default, which it was trained with."""
    defaults = {f.name: f.default for f in fields(GPTConfig)}
    saved = {**{k: v for k, v in defaults.items() if k != "head_cutoffs"},
             **config_fields(ckpt["hyper_parameters"]["model"])}
    for key in model:
        if key in saved and key not in FREE_ON_RESUME and saved[key] != model[key]:
            raise ValueError(f"model.{key}: checkpoint {saved[key]}, asked {model[key]} "
                             f"({path} cannot resume with another shape; use the settings it was trained with)")


def check_same_workers(ckpt: Mapping, num_workers: int, path: Path) -> None:
    """raises ValueError if the checkpoint holds no training state (no `loops`: weights only), or
    `data.num_workers: checkpoint 0, asked 2 ...` if the training loader's
    saved position comes from another number of worker processes: torchdata's
    StatefulDataLoader keeps it per worker and cannot load it into another number."""
    if "loops" not in ckpt or "optimizer_states" not in ckpt:
        raise ValueError(f"{path} holds weights and settings only, not the training state a run resumes from "
                         "(optimizer, loops); resume from a run's last.ckpt, or sample from this one")
    states = ckpt["loops"]["fit_loop"]["state_dict"].get("combined_loader", [])
    for state in states:
        saved = state["_snapshot"]["_main_snapshot"]["_num_workers"] if "_snapshot" in state else 0
        if saved != num_workers:
            raise ValueError(f"data.num_workers: checkpoint {saved}, asked {num_workers} ({path} holds the "
                             "training order's position per loader worker; resume with the same number)")


def check_same_vocabulary(ckpt: Mapping, tokenizer: Mapping, script: str, path: Path) -> None:
    """raises ValueError naming the first of tokenizer.kind, data.script, tokenizer.encoding
    and the vocabulary (tokenizer `state_dict()`s) that differs between checkpoint `ckpt`
    and this run, with both values."""
    saved = ckpt["hyper_parameters"]
    theirs = {"kind": "char", **saved["tokenizer"]}  # older checkpoints' states have no kind
    fields = {"tokenizer.kind": (theirs["kind"], tokenizer["kind"]),
              "data.script": (saved.get("script", "simplified"), script),
              "tokenizer.encoding": (theirs.get("name"), tokenizer.get("name"))}
    differ = [f"{key}: checkpoint {a}, asked {b}" for key, (a, b) in fields.items() if a != b]
    (old, n_old), (new, n_new) = _vocabulary(theirs), _vocabulary(tokenizer)
    if not differ and old != new:
        differ = [f"vocabulary: checkpoint {n_old} tokens, asked {n_new}"
                  + (" other tokens" if n_old == n_new else " tokens")]
    if differ:
        raise ValueError(f"{differ[0]} ({path} cannot resume with another vocabulary; "
                         "use the data settings it was trained with)")


def _vocabulary(state: Mapping) -> tuple[list, int]:
    """A tokenizer state's tokens (characters, or the encoding's ids) and its vocab_size."""
    tokens = state["itos"] if state["kind"] == "char" else state["token_ids"]
    return tokens, len(tokens) + (0 if state["kind"] == "char" else len(SPECIALS))
