"""A final annealing phase on poems whose even lines rhyme (`data.anneal_fraction`).

The last share f of a run's training windows is drawn only from windows that start at the
`<bos>` of a poem whose even lines' last characters share a 平水韵 level-tone group
(`data.verse.plan.poem_rhyme_groups`, the rule evaluate.py's rhyme column uses), or, for a 词
planned by its tune's template (`experiment=ci`), whose every rhyme position of the template
keeps its segment's 词林正韵 class (`data.verse.tunes.rhyme_kept`, the 词 sets' rhyme column);
the rest from every window, as without it. Rhymed poems are more often short and regulated than
the poets' poems are, so they are drawn so that each form (each template, for 词) keeps the
share it has among all windows that start a poem. Why and what it did: docs/rhyme.md,
docs/experiments.md.
"""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import DistributedSampler

from data.tokenizer import Tokenizer
from data.verse.plan import plan_ids, poem_rhyme_groups
from data.verse.poetry import form_of
from data.verse.tunes import rhyme_kept
from data.verse.tunes import tunes as tune_table
from data.windows import poem_bounds


def annealing_windows(window_starts: np.ndarray, tokens: np.ndarray, tokenizer: Tokenizer, script: str,
                      seed: int = 0) -> np.ndarray:
    """The windows the annealing phase draws from: `(m,) int64` indices into `window_starts`
    (the training windows' offsets in `tokens`).

    As many as there are windows that start at the `<bos>` of a rhymed poem (`_rhymed`), drawn
    from those (numpy, `seed`; a form's windows repeat when it has fewer than its share) so that
    each form (`data.verse.poetry.form_of`; a 词's template) has the share it has among all
    windows that start a poem (each form's count rounded); a form with no rhymed poem is left out.
    raises ValueError for an unknown script.
    """
    poems = _poems(tokens, tokenizer)
    windows = np.flatnonzero(np.isin(window_starts, [s for s, text, t in poems if _rhymed(text, t, script)]))
    form = {s: form_of(text) if t is None else f"ci:{t[0]}:{t[1]}" for s, text, t in poems}
    all_forms = [form[s] for s in window_starts[np.isin(window_starts, list(form))].tolist()]
    rhymed_forms = np.array([form[s] for s in window_starts[windows].tolist()])
    rng, drawn = np.random.default_rng(seed), []
    for name in sorted(set(all_forms)):
        pool = windows[rhymed_forms == name]
        if len(pool):
            drawn.append(np.resize(rng.permutation(pool), round(all_forms.count(name) / len(all_forms) * len(windows))))
    return np.concatenate(drawn) if drawn else windows


def _rhymed(text: str, template: tuple[str, int] | None, script: str) -> bool:
    """Whether a poem rhymes: a 诗's even lines share a level-tone group; a 词 of `template` (tune,
    index in `data.verse.tunes`) keeps the 词林正韵 class at every rhyme position, two at least."""
    if template is None:
        return bool(poem_rhyme_groups(text, script))
    kept, positions = rhyme_kept(text, tune_table()[template[0]][template[1]])
    return positions >= 2 and kept == positions


def _poems(tokens: np.ndarray, tokenizer: Tokenizer) -> list[tuple[int, str, tuple[str, int] | None]]:
    """(offset of its `<bos>`, text, template) of every poem in a token array (plan tokens have no
    text): template, the (tune, index) its tune token names; None for a 诗 or a 词 planned `<其他>`."""
    plan = plan_ids(tokenizer)
    templates = plan.templates if plan else {}
    out = []
    for s, e in zip(*poem_bounds(tokens, tokenizer.bos_id)):
        ids = np.asarray(tokens[s:e]).tolist()
        out.append((int(s), tokenizer.decode(ids), next((templates[i] for i in ids if i in templates), None)))
    return out


class AnnealSampler(DistributedSampler):
    """The window indices of a whole run, in one pass: of the run's `w·total` indices the first
    `w·total − round(f·w·total)` come from every window (a fresh random permutation of range(n)
    each time it runs out, as RandomSampler's epochs), the rest from `anneal` (window indices,
    permuted likewise); process r of w takes every w-th of them from the r-th, its `total`.

    n: windows in the dataset; anneal: (m,) int, the annealing windows' indices (`annealing_windows`), m > 0;
    total: indices one process serves in the run (optimizer steps × accumulated batches × batch
    size); fraction: f in (0, 1); seed: of both orders; num_replicas, rank: w processes (DDP,
    any number of devices and nodes) and this one's global rank. A DistributedSampler, so
    Lightning shards it no further. Iterating it again gives the same order; its iterator is
    Stateful (torchdata), so a resumed run continues it exactly.
    raises ValueError for an empty `anneal`, a fraction outside (0, 1), total < 1 or a rank outside [0, w).
    """

    def __init__(self, n: int, anneal: np.ndarray, total: int, fraction: float, seed: int = 0,
                 num_replicas: int = 1, rank: int = 0):  # no super().__init__(): it would ask torch.distributed
        if len(anneal) == 0:
            raise ValueError("no annealing windows: no training poem's even lines rhyme")
        if not 0 < fraction < 1 or total < 1:
            raise ValueError(f"anneal fraction {fraction} must be in (0, 1) and total {total} positive")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not one of {num_replicas} processes")
        self.n, self.anneal, self.total, self.seed = n, torch.as_tensor(anneal, dtype=torch.int64), total, seed
        self.num_replicas, self.rank, self.epoch = num_replicas, rank, 0
        run = total * num_replicas
        self.main = run - round(fraction * run)  # the run's indices before the annealing phase

    def __len__(self) -> int:
        return self.total

    def __iter__(self) -> Iterator[int]:
        return _AnnealIterator(self)


class _AnnealIterator(Iterator[int]):
    """`AnnealSampler`'s order for its rank; state_dict: how many indices it has yielded."""

    def __init__(self, sampler: AnnealSampler):
        self.sampler = sampler
        self.generator = torch.Generator().manual_seed(sampler.seed)
        self.yielded, self.drawn, self.pool = 0, 0, []  # drawn: of the whole run's order, every rank's

    def _draw(self) -> int:
        s = self.sampler
        if self.drawn == s.main:  # the annealing phase starts: drop what is left of the last permutation
            self.pool = []
        if not self.pool:
            perm = torch.randperm(s.n if self.drawn < s.main else len(s.anneal), generator=self.generator)
            self.pool = (perm if self.drawn < s.main else s.anneal[perm]).tolist()[::-1]
        self.drawn += 1
        return self.pool.pop()

    def __next__(self) -> int:
        s = self.sampler
        if self.yielded == s.total:
            raise StopIteration
        i = self._draw()
        while (self.drawn - 1) % s.num_replicas != s.rank:  # another process's index
            i = self._draw()
        self.yielded += 1
        return i

    def state_dict(self) -> dict:
        return {"yielded": self.yielded}

    def load_state_dict(self, state: dict) -> None:
        self.__init__(self.sampler)
        for _ in range(state["yielded"]):
            next(self)
