"""A final annealing phase on poems whose even lines rhyme (`data.anneal_fraction`).

The last share f of a run's training windows is drawn only from windows that start at the
`<bos>` of a poem whose even lines' last characters share a 平水韵 level-tone group
(`data.verse.plan.poem_rhyme_groups`, the rule evaluate.py's rhyme column uses); the rest
from every window, as without it. Why and what it did: docs/rhyme.md.
"""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import Sampler

from data.tokenizer import Tokenizer
from data.verse.plan import poem_rhyme_groups


def rhymed_poem_starts(tokens: np.ndarray, tokenizer: Tokenizer, script: str) -> np.ndarray:
    """The offsets of the `<bos>` of every poem in a token array whose even lines rhyme,
    `(n,) int64` in array order. raises ValueError for an unknown script."""
    starts = np.flatnonzero(np.asarray(tokens) == tokenizer.bos_id)
    ends = np.append(starts[1:], len(tokens))
    return np.array([s for s, e in zip(starts, ends)
                     if poem_rhyme_groups(tokenizer.decode(np.asarray(tokens[s:e]).tolist()), script)], dtype=np.int64)


class AnnealSampler(Sampler[int]):
    """The window indices of a whole run, in one pass of `total`: the first `total − round(f·total)`
    from every window (a fresh random permutation of range(n) each time it runs out, as
    RandomSampler's epochs), the rest from `anneal` (window indices, permuted likewise).

    n: windows in the dataset; anneal: (m,) int, the annealing windows' indices, m > 0;
    total: indices in the run (optimizer steps × accumulated batches × batch size); fraction: f
    in (0, 1); seed: of both orders. Iterating it again gives the same order; its iterator is
    Stateful (torchdata), so a resumed run continues it exactly.
    raises ValueError for an empty `anneal`, a fraction outside (0, 1) or total < 1.
    """

    def __init__(self, n: int, anneal: np.ndarray, total: int, fraction: float, seed: int = 0):
        if len(anneal) == 0:
            raise ValueError("no annealing windows: no training poem's even lines rhyme")
        if not 0 < fraction < 1 or total < 1:
            raise ValueError(f"anneal fraction {fraction} must be in (0, 1) and total {total} positive")
        self.n, self.anneal, self.total, self.seed = n, torch.as_tensor(anneal, dtype=torch.int64), total, seed
        self.main = total - round(fraction * total)  # indices before the annealing phase

    def __len__(self) -> int:
        return self.total

    def __iter__(self) -> Iterator[int]:
        return _AnnealIterator(self)


class _AnnealIterator(Iterator[int]):
    """`AnnealSampler`'s order; state_dict: how many indices it has yielded."""

    def __init__(self, sampler: AnnealSampler):
        self.sampler = sampler
        self.generator = torch.Generator().manual_seed(sampler.seed)
        self.yielded, self.pool = 0, []

    def __next__(self) -> int:
        s = self.sampler
        if self.yielded == s.total:
            raise StopIteration
        if self.yielded == s.main:  # the annealing phase starts: drop what is left of the last permutation
            self.pool = []
        if not self.pool:
            perm = torch.randperm(s.n if self.yielded < s.main else len(s.anneal), generator=self.generator)
            self.pool = (perm if self.yielded < s.main else s.anneal[perm]).tolist()[::-1]
        self.yielded += 1
        return self.pool.pop()

    def state_dict(self) -> dict:
        return {"yielded": self.yielded}

    def load_state_dict(self, state: dict) -> None:
        self.__init__(self.sampler)
        for _ in range(state["yielded"]):
            next(self)
