"""What a head is for, by intervention: how much worse the model predicts held-out poems when that
head alone is switched off (`model.ablation`), overall and at the places a poem is made of.

For each head, the change in cross-entropy (nats per predicted token, ablated − intact) over
every target of the poems, and over four kinds of target: a rhyme slot (the last character of
an even line: where 押韵 happens), a line start (the first character after `<bos>` or a mark),
a line-end mark (，。？！；), and `<eos>`. Beside it, the same figure averaged over the heads
of its layer, the control for "this layer matters" (Michel et al. 2019 ablate one head at a
time the same way). A pattern (`attention_stats`) says where a head looks; this says whether
the model needs it there.
"""
from __future__ import annotations

import random
from collections.abc import Sequence

import torch

from data.verse.plan import plan_labels
from data.verse.poetry import LINE_END
from model.ablation import ablate
from model.engine import Engine, pad

KINDS = ("all", "rhyme_slot", "line_start", "mark", "eos")
"""The kinds of target the effects are reported for; `all` is every predicted token."""


def target_kinds(labels: Sequence[str]) -> torch.Tensor:
    """The kinds of each target of a poem: labels (T,) the tokens as text (`<bos>` … `<eos>`) →
    (T − 1, len(KINDS)) bool, row i for the token at i + 1. A rhyme slot is a character whose
    next token is a mark that ends an even line (the 2nd, 4th, … line of the poem); a line start
    follows `<bos>`, a plan token or a mark."""
    T = len(labels)
    kinds = torch.zeros(T - 1, len(KINDS), dtype=torch.bool)
    kinds[:, 0] = True
    line = 0  # lines ended so far
    starts_after = {*LINE_END, *plan_labels()}
    for i in range(1, T):
        t, before = labels[i], labels[i - 1]
        is_mark = t in LINE_END
        kinds[i - 1, 3] = is_mark
        kinds[i - 1, 4] = t == "<eos>"
        kinds[i - 1, 2] = len(t) == 1 and not is_mark and (before == "<bos>" or before in starts_after)
        after = labels[i + 1] if i + 1 < T else "<cut>"  # not "": "" is in every string
        kinds[i - 1, 1] = len(t) == 1 and not is_mark and after in LINE_END and line % 2 == 1
        line += is_mark
    return kinds


@torch.no_grad()
def poem_nats(engine: Engine, batch: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Per-target nats of padded poems: batch (B, T) int64 ids, lengths (B,) → (B, T − 1), 0 past a poem's end."""
    targets = batch[:, 1:].clone()
    targets[torch.arange(targets.size(1))[None] >= (lengths - 1)[:, None]] = -1
    return engine.model.nats(batch[:, :-1], targets)


class HeadScorer:
    """Held-out poems batched once, scored with any set of heads off (zero ablation).

    poems: text, each fed as the model was trained on it (`Engine.poem_ids`: `<bos>`, a plan model's
    plan tokens, the poem, `<eos>`), its first block_size tokens where it is longer
    (then a target at the cut is no rhyme slot: the mark after it is out of sight). `counts`:
    (len(KINDS),) targets of each kind; `intact`: nats per target by kind with every head on;
    `delta(names)`: the change in nats per target by kind with those heads off (memoised by
    set). Every head is on again after each call.
    """

    def __init__(self, engine: Engine, poems: Sequence[str], batch_size: int = 64):
        tok = engine.tokenizer
        block = engine.model.cfg.block_size
        seqs = [engine.poem_ids(p, "held-out poem")[:block] for p in poems]
        kinds = [target_kinds([tok.label(i) for i in s]) for s in seqs]
        self.engine, self.batches, self.memo = engine, [], {}
        for start in range(0, len(seqs), batch_size):
            ids, lengths = pad(seqs[start:start + batch_size], engine.device)  # (B, T), (B,)
            mask = torch.zeros(ids.size(0), ids.size(1) - 1, len(KINDS), dtype=torch.bool)
            for b, k in enumerate(kinds[start:start + batch_size]):
                mask[b, : len(k)] = k
            self.batches.append((ids, lengths, mask))
        self.counts = sum(m.sum((0, 1)) for _, _, m in self.batches).double()  # (len(KINDS),)
        self.intact = self.sums(()) / self.counts

    def sums(self, names: tuple[str, ...]) -> torch.Tensor:
        """(len(KINDS),) summed nats, float64, with the named heads off."""
        ablate(self.engine, names)
        try:
            total = torch.zeros(len(KINDS), dtype=torch.float64)
            for ids, lengths, mask in self.batches:
                nats = poem_nats(self.engine, ids, lengths).double().cpu()  # (B, T − 1)
                total += (nats[..., None] * mask).sum((0, 1))
        finally:
            ablate(self.engine, [])
        return total

    def delta(self, names: Sequence[str]) -> dict[str, float]:
        """{kind: Δ nats per target} with the named heads off (ablated − intact)."""
        key = tuple(sorted(names))
        if key not in self.memo:
            self.memo[key] = dict(zip(KINDS, (self.sums(key) / self.counts - self.intact).tolist()))
        return self.memo[key]


def head_name(layer: int, head: int) -> str:
    """A head's name as `ablate` takes it: (3, 1) → "L3H1"."""
    return f"L{layer}H{head}"


@torch.no_grad()
def head_effects(engine: Engine, poems: Sequence[str], batch_size: int = 64,
                 scorer: HeadScorer | None = None) -> dict:
    """The effect of switching each head off alone on `poems` (held-out poems, as `HeadScorer`),
    zero ablation → {"kinds": KINDS, "targets": {kind: count}, "intact": {kind: nats per
    target}, "heads": [{"layer", "head", kind: Δ nats per target, …}], "layer_mean": [{"layer",
    kind: Δ, …}]}. Every head is on again at the end."""
    scorer = scorer or HeadScorer(engine, poems, batch_size)
    cfg = engine.model.cfg
    heads = [{"layer": ly, "head": h, **scorer.delta([head_name(ly, h)])}
             for ly in range(cfg.n_layer) for h in range(cfg.n_head)]
    layer_mean = [{"layer": ly, **{k: sum(h[k] for h in heads if h["layer"] == ly) / cfg.n_head for k in KINDS}}
                  for ly in range(cfg.n_layer)]
    return {"kinds": list(KINDS), "targets": dict(zip(KINDS, scorer.counts.long().tolist())),
            "intact": dict(zip(KINDS, scorer.intact.tolist())), "heads": heads, "layer_mean": layer_mean}


def random_sets(n_layer: int, n_head: int, size: int, seeds: Sequence[int], per_seed: int) -> list[list[str]]:
    """Control sets: for each seed, `per_seed` sets of `size` distinct heads drawn uniformly from
    every head of the model (`random.Random(seed)`), each sorted by name. raises ValueError if
    size is not 1 to n_layer · n_head."""
    every = [head_name(ly, h) for ly in range(n_layer) for h in range(n_head)]
    if not 1 <= size <= len(every):
        raise ValueError(f"a random head set has 1 to {len(every)} heads, not {size}")
    sets = []
    for seed in seeds:
        rng = random.Random(seed)
        sets += [sorted(rng.sample(every, size)) for _ in range(per_seed)]
    return sets


def control(scorer: HeadScorer, size: int, seeds: Sequence[int], per_seed: int, quantile: float = 0.95) -> dict:
    """The rise in nats a random set of `size` heads causes: `random_sets` scored → {"size",
    "seeds", "sets", kind: [Δ per set], "p95": {kind: the `quantile` of Δ over the sets (linear
    interpolation)}}: the bar a named set must clear to count as needed for that kind."""
    cfg = scorer.engine.model.cfg
    sets = random_sets(cfg.n_layer, cfg.n_head, size, seeds, per_seed)
    deltas = [scorer.delta(s) for s in sets]
    values = {k: [d[k] for d in deltas] for k in KINDS}
    return {"size": size, "seeds": list(seeds), "sets": sets, **values,
            "p95": {k: torch.quantile(torch.tensor(v, dtype=torch.float64), quantile).item() for k, v in values.items()}}


def format_effects(effects: dict) -> str:
    """The effects as a text table: per head Δ nats per target by kind, then each layer's mean."""
    kinds = effects["kinds"]
    lines = [f"{'':<22}" + "".join(f"{k:>12}" for k in kinds),
             f"{'targets':<22}" + "".join(f"{effects['targets'][k]:>12,}" for k in kinds),
             f"{'intact (nats)':<22}" + "".join(f"{effects['intact'][k]:>12.3f}" for k in kinds)]
    means = {m["layer"]: m for m in effects["layer_mean"]}
    for h in effects["heads"]:
        lines.append(f"{'L%dH%d off' % (h['layer'], h['head']):<22}" + "".join(f"{h[k]:>+12.3f}" for k in kinds))
        if h["head"] == len([x for x in effects["heads"] if x["layer"] == h["layer"]]) - 1:
            m = means[h["layer"]]
            lines.append(f"{'L%d mean of heads' % h['layer']:<22}" + "".join(f"{m[k]:>+12.3f}" for k in kinds))
    return "\n".join(lines)
