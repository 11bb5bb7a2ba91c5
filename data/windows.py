"""Training and validation windows over a token array of `<bos>`-framed poems.

`train_starts` places the training windows (at poems' starts, a share of them mid-poem),
`Windows` serves them, `PoemWindows` scores every held-out poem from its own `<bos>`;
`poem_bounds` finds the poems.
"""
from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset

VAL_WINDOWS = ("poems", "blocks")
IGNORE = -1
"""Target id of a position whose prediction is not scored (`F.cross_entropy(..., ignore_index=IGNORE)`)."""


def poem_bounds(tokens: np.ndarray, bos_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends): the offsets of every poem's `<bos>` in a token array and the offset just
    past its last token (`<eos>`), each `(n_poems,) int64`."""
    starts = np.flatnonzero(np.asarray(tokens) == bos_id)
    return starts, np.append(starts[1:], len(tokens))


def train_starts(tokens: np.ndarray, block_size: int, bos_id: int = 0, mid_poem: float = 0.0,
                 seed: int = 0) -> np.ndarray:
    """Start offsets of the training windows, `(N,) int64`, sorted; a window is `block_size + 1` tokens.

    Every window starts at a poem's `<bos>`, as sampling does; a poem longer than a window goes
    on in windows that start `block_size` tokens later each, so every token is a target once.
    A window runs on into the next poems (packing, no mask). With mid_poem = f > 0, windows at
    offsets drawn uniformly (numpy, `seed`) are added until they are a fraction f of all:
    windows that start mid-poem, as nanoGPT's and a refilled KV cache's do.
    raises ValueError for mid_poem outside [0, 1) or an array shorter than one window.
    """
    if not 0 <= mid_poem < 1:
        raise ValueError(f"data.mid_poem_fraction={mid_poem} is not in [0, 1)")
    last = len(tokens) - block_size - 1  # the last offset that still fills a window
    if last < 0:
        raise ValueError(f"{len(tokens)} tokens cannot fill one window of block_size={block_size}")
    starts, ends = poem_bounds(tokens, bos_id)
    offsets = np.concatenate([np.arange(b, e - 1, block_size) for b, e in zip(starts, ends)])
    offsets = offsets[offsets <= last]
    extra = round(len(offsets) * mid_poem / (1 - mid_poem))
    return np.sort(np.concatenate([offsets, np.random.default_rng(seed).integers(0, last + 1, extra)])) if extra \
        else offsets


class Windows(Dataset):
    """`(x, y)` pairs of `block_size` token ids from a 1-D token array, y = x shifted by one.

    starts: `(N,)` window offsets (`train_starts`, or every `block_size`-th offset for the
    `blocks` validation). Items are `(block_size,) int64` tensors. unscored: `(len(tokens),)` bool,
    the positions whose targets are `IGNORE` (a condition segment, `PlanIds.segment_mask`; None: none).
    raises ValueError if a start leaves less than a window.
    """

    def __init__(self, tokens: np.ndarray, block_size: int, starts: np.ndarray, unscored: np.ndarray | None = None):
        if len(starts) == 0 or starts.max() + block_size + 1 > len(tokens):
            raise ValueError(f"{len(tokens)} tokens cannot fill the windows of block_size={block_size}")
        self.tokens, self.block_size, self.starts, self.unscored = tokens, block_size, starts, unscored

    @classmethod
    def blocks(cls, tokens: np.ndarray, block_size: int, unscored: np.ndarray | None = None) -> "Windows":
        """Non-overlapping windows that cover the array: nanoGPT-style validation."""
        return cls(tokens, block_size, np.arange(0, len(tokens) - block_size, block_size), unscored)

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = int(self.starts[i])
        chunk = torch.from_numpy(self.tokens[start : start + self.block_size + 1].astype(np.int64))
        return chunk[:-1], unscore(chunk[1:], self.unscored, start + 1)  # x, y: (block_size,)


def unscore(y: torch.Tensor, unscored: np.ndarray | None, offset: int) -> torch.Tensor:
    """Targets y (n,) int64 taken from offset `offset` of the array, `IGNORE` where `unscored` says."""
    if unscored is None:
        return y
    return y.masked_fill(torch.from_numpy(unscored[offset : offset + len(y)].copy()), IGNORE)


class PoemWindows(Dataset):
    """Every poem of a token array scored from its own `<bos>`: the `poems` validation.

    A poem of at most `block_size + 1` tokens is one item; a longer one goes on in items that
    start `block_size // 2` tokens before the first unscored target, so every prediction has
    at least half a block of the poem before it. Every token after a `<bos>` is a target
    exactly once. Items are `(x, y)`, each `(block_size,) int64`; y is `IGNORE` where
    nothing is scored (context, padding, and the positions `unscored` names, as in `Windows`).
    """

    def __init__(self, tokens: np.ndarray, block_size: int, bos_id: int = 0, unscored: np.ndarray | None = None):
        self.tokens, self.block_size, self.unscored = tokens, block_size, unscored
        self.items: list[tuple[int, int, int]] = []  # (window start, first scored target, end)
        for b, e in zip(*poem_bounds(tokens, bos_id)):
            start, first = int(b), int(b) + 1
            while first < e:
                end = min(start + block_size + 1, int(e))
                self.items.append((start, first, end))
                start, first = max(int(b), end - 1 - block_size // 2), end

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        start, first, end = self.items[i]
        chunk = torch.from_numpy(self.tokens[start:end].astype(np.int64))  # (≤ block_size + 1,)
        x = torch.zeros(self.block_size, dtype=torch.int64)
        y = torch.full((self.block_size,), IGNORE, dtype=torch.int64)
        x[: len(chunk) - 1] = chunk[:-1]
        y[first - start - 1 : len(chunk) - 1] = unscore(chunk[first - start :], self.unscored, first)
        return x, y  # (block_size,) each
