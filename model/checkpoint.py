"""Reading a checkpoint file as data: every loader of the project (sampling, evaluation, attention
maps, resuming, benchmarks) goes through `read_checkpoint`.

A `.ckpt` is a pickle, and unpickling can call any function a file names (`os.system`, ...).
`torch.load(..., weights_only=True)` (PyTorch's default since 2.6) rebuilds only tensors, numbers,
strings, lists, tuples and dicts and refuses anything else before calling it; the checkpoints this
project writes hold nothing else (tests/test_checkpoint_safety.py).
"""
from __future__ import annotations

import pickle
import re
from pathlib import Path

import torch


class UnsafeCheckpointError(ValueError):
    """A checkpoint names callables or classes beyond plain tensors and containers: it was refused
    without running any of them. A ValueError, so the entry points report it in one line."""

    def __init__(self, path: Path, names: list[str]):
        super().__init__(f"{path} holds {', '.join(names)}, not only tensors, numbers, strings, lists and dicts; "
                         "refused unread, since loading it could run code. Use a checkpoint written by train.py")


def read_checkpoint(path: str | Path, mmap: bool = False) -> dict:
    """The dict saved in checkpoint file `path`, its tensors on the CPU (memory-mapped with `mmap`).

    raises UnsafeCheckpointError naming what the file would import beyond plain data (e.g.
    `posix.system`), before anything in it runs; ValueError if torch cannot read it as a checkpoint.
    """
    path = Path(path)
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        if names := _refused_globals(path, str(err)):
            raise UnsafeCheckpointError(path, names) from None
        detail = re.search(r"WeightsUnpickler error: \s*(.+)", str(err))
        raise ValueError(f"{path} is not a checkpoint torch can read ({detail[1].strip() if detail else err})") from None
    except (RuntimeError, OSError, EOFError, KeyError) as err:  # a truncated or foreign file
        raise ValueError(f"{path} is not a checkpoint torch can read ({type(err).__name__}: "
                         f"{str(err).splitlines()[0] if str(err) else 'no detail'})") from None
    if not isinstance(ckpt, dict):
        raise ValueError(f"{path} holds a {type(ckpt).__name__}, not a checkpoint dict")
    return ckpt


def _refused_globals(path: Path, message: str) -> list[str]:
    """The globals weights_only refused: every one a zip checkpoint names beyond plain data, else
    the one torch's error message names; [] if it refused the file for another reason."""
    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except ValueError:  # not torch's zip format: a legacy or hand-made pickle
        names = []
    return names or re.findall(r"GLOBAL (\S+) was not an allowed", message)
