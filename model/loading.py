"""Which checkpoint, and loading it: the one place every entry point, the studio, resuming and
the benchmarks find and read a checkpoint, and the one builder of a GPT for a tokenizer.

- `find_checkpoint`: `ckpt_path` as every script takes it: None or `last` (the newest
  `last.ckpt` under the checkpoints folder), a run folder (its `last.ckpt`) or a file.
- `read_checkpoint`: a file → its dict, read as data only (below).
- `build_gpt`: a GPT for a tokenizer, its head decided for the vocabulary and its poem-input
  tables filled (training, loading, and the "model at initialisation" of attention_maps.py).
- `load_engine`: a checkpoint → the inference engine (model, tokenizer, script, and what the
  checkpoint records beside the weights, `model.checkpoint_meta.CheckpointMeta`) on a device
  with an attention backend, checked once before any work.

A `.ckpt` is a pickle, and unpickling can call any function a file names (`os.system`, ...).
`torch.load(..., weights_only=True)` (PyTorch's default since 2.6) rebuilds only tensors, numbers,
strings, lists, tuples and dicts and refuses anything else before calling it; the checkpoints this
project writes hold nothing else (tests/test_checkpoint_safety.py).
"""
from __future__ import annotations

import hashlib
import logging
import pickle
import re
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

import torch

from data.corpus_io import heldout_poems
from data.features import full_stops, group_count, phonology_tables, token_kinds, tune_tables
from data.tokenizer import Tokenizer, tokenizer_from_state
from model.ablation import MEAN_POEMS
from model.ablation import ablate as ablate_heads
from model.checkpoint_meta import CheckpointMeta
from model.device import check_backend, resolve_device
from model.engine import Engine
from model.gpt import GPT, GPTConfig

log = logging.getLogger(__name__)


class UnsafeCheckpointError(ValueError):
    """A checkpoint names callables or classes beyond plain tensors and containers: it was refused
    without running any of them. A ValueError, so the entry points report it in one line."""

    def __init__(self, path: Path, names: list[str]):
        super().__init__(f"{path} holds {', '.join(names)}, not only tensors, numbers, strings, lists and dicts; "
                         "refused unread, since loading it could run code. Use a checkpoint written by train.py")


EXPECTED = "expected a checkpoint written by this project's train.py, e.g. checkpoints/<run>/last.ckpt"


def read_checkpoint(path: str | Path, mmap: bool = False) -> dict:
    """The dict saved in checkpoint file `path`, its tensors on the CPU (memory-mapped with `mmap`).

    raises UnsafeCheckpointError naming what the file would import beyond plain data (e.g.
    `posix.system`), before anything in it runs; ValueError in one line if torch cannot read it
    as a checkpoint (a text file, a truncated file, a folder, ...).
    """
    path = Path(path)
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        if names := _refused_globals(path, str(err)):
            raise UnsafeCheckpointError(path, names) from None
        detail = re.search(r"WeightsUnpickler error: \s*(.+)", str(err))
        raise ValueError(f"{path} is not a checkpoint torch can read ({detail[1].strip() if detail else err}); "
                         f"{EXPECTED}") from None
    except Exception as err:  # noqa: BLE001 — whatever a foreign file makes torch raise (IndexError for text, ...)
        raise ValueError(f"{path} is not a checkpoint torch can read ({type(err).__name__}: "
                         f"{str(err).splitlines()[0] if str(err) else 'no detail'}); {EXPECTED}") from None
    if not isinstance(ckpt, dict):
        raise ValueError(f"{path} holds a {type(ckpt).__name__}, not a checkpoint dict; {EXPECTED}")
    return ckpt


def read_trained(path: str | Path, mmap: bool = False) -> dict:
    """A checkpoint train.py wrote (`hyper_parameters` with the model, tokenizer and script; a
    Lightning `state_dict`), read as `read_checkpoint` reads it. raises UnsafeCheckpointError as
    `read_checkpoint`; ValueError in one line saying what else the file is: not a torch file, a
    nanoGPT checkpoint, a bare state_dict, or a checkpoint without this project's settings."""
    ckpt = read_checkpoint(path, mmap)
    if "model_args" in ckpt and "model" in ckpt:
        args = ckpt["model_args"] if isinstance(ckpt["model_args"], dict) else {}
        shape = ", ".join(f"{k}={args[k]}" for k in ("n_layer", "n_head", "n_embd", "block_size") if k in args)
        raise ValueError(f"{path} is a nanoGPT checkpoint ({shape}, iteration {ckpt.get('iter_num', '?')}), not one of "
                         f"this project's: it has no tokenizer and another network; {EXPECTED}")
    if ckpt and all(isinstance(v, torch.Tensor) for v in ckpt.values()):
        raise ValueError(f"{path} is a bare state_dict ({len(ckpt)} tensors, e.g. {next(iter(ckpt))}) without the "
                         f"model's settings and tokenizer; {EXPECTED}")
    hp = ckpt.get("hyper_parameters")
    missing = [k for k in ("model", "tokenizer") if not isinstance(hp, dict) or not isinstance(hp.get(k), dict)]
    if missing or not isinstance(ckpt.get("state_dict"), dict):
        what = f"hyper_parameters {', '.join(missing)}" if isinstance(hp, dict) and missing else \
            "hyper_parameters" if missing else "state_dict"
        raise ValueError(f"{path} is a checkpoint without {what} (its keys: {', '.join(map(str, list(ckpt)[:6]))}); "
                         f"{EXPECTED}")
    return ckpt


def load_weights(module: torch.nn.Module, state_dict: dict, path: Path) -> None:
    """Load state_dict into module (strict). raises ValueError in one line naming the first key that
    is missing, unexpected or of another shape: a checkpoint whose weights do not fit its own settings."""
    try:
        missing, unexpected = module.load_state_dict(state_dict, strict=False)
    except RuntimeError as err:  # a size mismatch
        first = next((line.strip() for line in str(err).splitlines()[1:] if line.strip()), str(err))
        raise ValueError(f"{path} is a checkpoint of another shape than its settings say ({first}); {EXPECTED}") from None
    if missing or unexpected:
        first = f"unexpected key {unexpected[0]}" if unexpected else f"missing key {missing[0]}"
        raise ValueError(f"{path} is a checkpoint of another shape than its settings say ({first}, "
                         f"{len(missing)} missing, {len(unexpected)} unexpected); {EXPECTED}")


def _refused_globals(path: Path, message: str) -> list[str]:
    """The globals weights_only refused: every one a zip checkpoint names beyond plain data, else
    the one torch's error message names; [] if it refused the file for another reason."""
    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except ValueError:  # not torch's zip format: a legacy or hand-made pickle
        names = []
    return names or re.findall(r"GLOBAL (\S+) was not an allowed", message)


def find_checkpoint(ckpt_path: str | Path | None, checkpoint_dir: str | Path) -> Path:
    """The checkpoint file `ckpt_path` names: None or `last` → the newest `*/last.ckpt` under
    checkpoint_dir; a folder → its `last.ckpt`; a file → itself. raises FileNotFoundError
    naming what is missing."""
    if ckpt_path is None or str(ckpt_path) in ("", "last"):
        found = sorted(Path(checkpoint_dir).glob("*/last.ckpt"), key=lambda p: p.stat().st_mtime)
        if not found:
            raise FileNotFoundError(f"no checkpoint under {checkpoint_dir}; train one with `python train.py` "
                                    "or pass ckpt_path=...")
        return found[-1]
    path = Path(ckpt_path)
    if path.is_dir():
        path = path / "last.ckpt"
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} not found; train one with `python train.py`, or pass ckpt_path=last "
                                "(the newest run's last.ckpt), ckpt_path=checkpoints/<run> or "
                                "ckpt_path=checkpoints/<run>/<file>.ckpt")
    return path


POEM_FLAGS = ("phonology", "phon_output", "structure", "struct_recover")
ONE_VALUE = {"bias": False, "qk_norm": False, "head_div_value": 4.0, "struct_lines": 10, "struct_countdown": 10,
             "attn_dropout": None, "rhyme_loss_at": "rhyme_slots"}
"""Settings of checkpoints written before issue 37 (docs/experiments.md) that have one value now."""


def config_fields(saved: dict) -> dict:
    """GPTConfig fields (less vocab_size) of model settings (a checkpoint's `hyper_parameters["model"]`,
    or a config's). Those of a checkpoint written before issue 37 are read where they describe the
    one recipe left: the four poem-input flags all on (the rhyme loss at rhyme slots) or all off
    become `poem_inputs`, and the settings of ONE_VALUE at that value are dropped.
    raises ValueError in one line naming a setting GPTConfig does not have or a value it lost."""
    saved = dict(saved)
    flags = {saved.pop(k, False) for k in POEM_FLAGS} if any(k in saved for k in POEM_FLAGS) else set()
    if saved.get("rhyme_loss_at") == "line_ends" and not saved.get("rhyme_loss_weight"):
        del saved["rhyme_loss_at"]  # no rhyme loss: where it would be taken does not matter
    if len(flags) > 1:
        raise ValueError(f"model settings with only some of {', '.join(POEM_FLAGS)} on: a mix this version no "
                         "longer has (docs/experiments.md); train the model again with poem_inputs=true")
    if flags:
        saved["poem_inputs"] = flags.pop()
    for k, v in ONE_VALUE.items():
        if k in saved and saved.pop(k) != v:
            raise ValueError(f"model settings with {k} other than {v}: an option this version no longer has "
                             "(docs/experiments.md); train the model again without it")
    if unknown := sorted(set(saved) - {f.name for f in fields(GPTConfig)} - {"vocab_size"}):
        raise ValueError(f"model.{unknown[0]} is not a setting of this project's GPT (model/gpt.py GPTConfig)")
    return saved


def model_fields(cfg: GPTConfig) -> dict:
    """A GPTConfig as the model fields a checkpoint saves (less vocab_size and rhyme_groups, which
    come from its tokenizer)."""
    return {f.name: getattr(cfg, f.name) for f in fields(GPTConfig) if f.name not in ("vocab_size", "rhyme_groups")}


def head_for_vocabulary(model: dict, vocab_size: int) -> dict:
    """The model fields `model` (GPTConfig's, without vocab_size) with the output head decided for
    a vocabulary of vocab_size ids, said in the log when it differs from what was asked: adaptive
    cutoffs at or past the vocabulary are dropped, and a vocabulary below the first cutoff (e.g. a
    small BPE vocabulary) gets the tied head, since there is no tail to save on. Idempotent."""
    if model.get("head") != "adaptive":
        return model
    asked = tuple(model.get("head_cutoffs", GPTConfig.head_cutoffs))
    cutoffs = tuple(c for c in asked if c < vocab_size)
    if cutoffs == asked:
        return model
    if not cutoffs:
        log.info(f"model.head=tied: the vocabulary of {vocab_size} tokens is below the adaptive head's first cutoff "
                 f"{asked[0]}, so there is no tail cluster to save on")
        return {**model, "head": "tied", "head_cutoffs": []}
    log.info(f"model.head_cutoffs={list(cutoffs)}: the cutoffs {[c for c in asked if c >= vocab_size]} are not below "
             f"the vocabulary of {vocab_size} tokens")
    return {**model, "head_cutoffs": list(cutoffs)}


def build_gpt(model: dict, tokenizer: Tokenizer, script: str = "simplified", tables: bool = True) -> GPT:
    """A new GPT for `tokenizer`: model, GPTConfig fields less vocab_size and rhyme_groups (both
    from the tokenizer; `config_fields` of a checkpoint's are fine), the head decided for the
    vocabulary (`head_for_vocabulary`); with `tables`, the poem inputs' tables filled from the data
    layer (`data.features`) for the tokenizer's characters read in `script` (False: a
    checkpoint's buffers will replace them).
    Its weights are drawn from torch's generator as GPT(cfg) draws them. raises ValueError as GPT."""
    gpt = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, rhyme_groups=group_count(tokenizer),
                        **head_for_vocabulary(config_fields(model), tokenizer.vocab_size)))
    if tables and gpt.poem is not None:
        groups_tones = phonology_tables(tokenizer, script)
        gpt.poem.set_phonology(torch.tensor(groups_tones.groups), torch.tensor(groups_tones.tones))
        gpt.poem.set_token_kinds(torch.tensor(token_kinds(tokenizer)))
        gpt.poem.set_full_stops(torch.tensor(full_stops(tokenizer)))
    if gpt.poem is not None:  # not in a checkpoint: always from the data
        gpt.poem.set_tunes(*map(torch.tensor, tune_tables(tokenizer)))
    return gpt


def weights_sha(state_dict: dict) -> str:
    """SHA-256 (hex) of a checkpoint's weights: every tensor's name, dtype, shape and bytes, by name.
    The same file gives the same digest on every machine: which weights a result measured."""
    h = hashlib.sha256()
    for name in sorted(state_dict):
        t = state_dict[name].detach().cpu().contiguous()
        h.update(f"{name} {t.dtype} {tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")  # a 0-dim one too
    return h.hexdigest()


def load_engine(ckpt_path: str | Path | None, checkpoint_dir: str | Path = "checkpoints", device: str = "cpu",
                backend: str | None = None, ablate: Sequence[str] = (), ablate_mode: str = "zero",
                corpus_path: str | Path | None = None) -> Engine:
    """The inference engine of a checkpoint (`find_checkpoint`), its model in eval mode on
    `device` (auto | cpu | cuda | cuda:N; `model.device.resolve_device`), `engine.path` the file,
    `engine.meta` its record beside the weights (`CheckpointMeta.from_checkpoint`, with `weights_sha`).

    backend: run with another attention backend than the checkpoint's (naive | sdpa | flash).
    ablate: heads to switch off, `L<layer>H<head>` (`model.ablation`), their outputs replaced by
    zero or (ablate_mode=mean) by their mean over training-split poems of `corpus_path`.
    raises FileNotFoundError (no such checkpoint), UnsafeCheckpointError / ValueError (not a
    checkpoint torch reads as data; device=cuda without a GPU), BackendUnavailableError (the
    backend cannot run there): all before any work.
    """
    device = resolve_device(device)
    path = find_checkpoint(ckpt_path, checkpoint_dir)
    ckpt = read_trained(path)
    hp = ckpt["hyper_parameters"]
    tokenizer = tokenizer_from_state(hp["tokenizer"])
    model = {**config_fields(hp["model"]), **({"backend": backend} if backend is not None else {})}
    script = hp.get("script", "simplified")
    gpt = build_gpt(model, tokenizer, script, tables=False)  # the checkpoint's weights and tables replace the new ones
    load_weights(gpt, {k.removeprefix("gpt."): v for k, v in ckpt["state_dict"].items() if k.startswith("gpt.")}, path)
    gpt = gpt.to(device).eval()
    cfg = gpt.cfg
    check_backend(cfg.backend, torch.device(device).type, torch.float32, 0.0, cfg.n_embd // cfg.n_head)
    engine = Engine(gpt, tokenizer, script, path, CheckpointMeta.from_checkpoint(ckpt, weights_sha(ckpt["state_dict"])))
    if ablate:
        if ablate_mode == "mean" and corpus_path is None:
            raise ValueError("ablate_mode=mean needs the training corpus (corpus_path) for the heads' mean outputs")
        poems = heldout_poems(corpus_path, script, MEAN_POEMS, None, cfg.block_size - 1, "train") \
            if ablate_mode == "mean" else ()
        ablate_heads(engine, ablate, ablate_mode, poems)
    return engine
