"""Per-head statistics of causal attention maps, the lesson's random baselines, and a rule
that names what a trained head has learned.

Maps are `(..., T, T)` float tensors, row i = where query position i looks (rows sum to 1,
upper triangle 0); `tokens` are the T strings the positions hold (`<bos>` first, then the
characters). Every statistic is a mean over the rows i ≥ 1 where it is defined (row 0, the
`<bos>`, has one key and says nothing about a head):

| name | per row i | unit |
|---|---|---|
| `entropy` | −Σ_j w_ij ln w_ij | nats (uniform row: ln(i+1)) |
| `max_weight` | max_j w_ij (the lesson's section 4 statistic) | weight |
| `self` | w_ii (the diagonal) | weight |
| `prev_token` | w_i,i−1 | weight |
| `first_token` | w_i,0 (the `<bos>`) | weight |
| `punctuation` | Σ of w_ij over line-end marks j ≤ i (rows that can see one) | weight |
| `prev_line_same_pos` | w_ij, j = the same position in the previous line (rows where it exists) | weight |
| `prev_line_next_pos` | w_ij, j = the previous line's position aligned with token i + 1, the one row i predicts (rows where it exists) | weight |
| `prev_line_rhyme` | w_ij, j = the previous line's last character, its rhyme position (rows of a line after a line) | weight |

The masses overlap (row 1's previous token is the first token; a line's first character's
previous token is a mark). "Same position in the previous line": position p of line n
looks at position p of line n−1, where lines end at a mark of `data.verse.poetry.LINE_END`
(the mark itself is a line's last position). In regulated verse the lines of a couplet
are parallel (对仗) position by position. A causal model predicts at row i the token i + 1,
so the head that serves the pairing looks at the character aligned with i + 1 — one after
the same position (`prev_line_next_pos`: from `，` to 床, from 疑 to 前, …); a head that
looks at the previous line's last character from every row (`prev_line_rhyme`: 光 from
疑是地上) keeps the rhyme in view.

Baselines, the random maps of the attention lesson (docs/attention.md, "The random-q/k
baselines"): section 3's map from random q, k ~ N(0, 1) of size d = 8, and section 5's head:
x ~ N(0, 1), W_q, W_k ~ N(0, 1/d_model), d_model = 16, d_head = 8.
"""  # noqa: E501 (its tables)
from __future__ import annotations

import math

import torch

from data.verse.poetry import LINE_END
from model.attention import causal_attention_weights

STATISTICS = ("entropy", "max_weight", "self", "prev_token", "first_token", "punctuation", "prev_line_same_pos",
              "prev_line_next_pos", "prev_line_rhyme")
"""Names of the per-head statistics, in table order."""

PATTERNS = {
    "self": "self head",
    "prev_token": "previous-token head",
    "first_token": "first-token head",
    "punctuation": "punctuation head",
    "prev_line_same_pos": "same-position head",
    "prev_line_next_pos": "parallel-position head",
    "prev_line_rhyme": "previous-rhyme head",
}
"""A head flagged high on one of these masses is named after the largest of them."""


def line_structure(tokens: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Where the line-end marks are, each position's same position in the previous line, and
    the previous line's last character.

    tokens: T strings (`<bos>` or anything that is not a character counts as no line
    position; a string in `LINE_END` closes its line) → (is_mark: (T,) bool,
    parallel: (T,) int64 index of the same position in the previous line, −1 where there is
    none: first line, `<bos>`, or a previous line too short; rhyme: (T,) int64 index of
    the previous line's last character before its mark, −1 where there is none). The
    previous line must end with a mark right before the line. Never raises.
    """
    T = len(tokens)
    is_mark = torch.tensor([t in LINE_END for t in tokens], dtype=torch.bool)
    parallel = torch.full((T,), -1, dtype=torch.long)
    rhyme = torch.full((T,), -1, dtype=torch.long)
    starts, start = [], None  # start index of each line
    for i, t in enumerate(tokens):
        if len(t) != 1:  # <bos> / <eos>: not part of a line
            start = None
            continue
        if start is None:
            start = i
            starts.append(i)
        prev_end = start - 1  # the previous line ends right before this one starts…
        if len(starts) >= 2 and tokens[prev_end] in LINE_END:  # …with a mark
            p, prev_start = i - start, starts[-2]
            if prev_start + p <= prev_end:
                parallel[i] = prev_start + p
            if prev_end - 1 >= prev_start:
                rhyme[i] = prev_end - 1
        if t in LINE_END:
            start = None
    return is_mark, parallel, rhyme


def _row_mean(values: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Mean of values (..., T) over the rows where rows (T,) is True; NaN if there are none."""
    if not rows.any():
        return torch.full(values.shape[:-1], float("nan"))
    return values[..., rows].mean(-1)


def head_statistics(maps: torch.Tensor, tokens: list[str]) -> dict[str, torch.Tensor]:
    """The `STATISTICS` of every map.

    maps: (..., T, T) float, causal, rows summing to 1; tokens: the T strings (see
    `line_structure`) → {name: (...) float32 tensor}, a mean over the rows where the
    statistic is defined (NaN where no row is, e.g. a single line has no previous line).
    Sources: `max_weight` is the lesson's section 4 statistic; previous-token and
    first-token heads as in Olsson et al. 2022 ("In-context Learning and Induction Heads")
    and Xiao et al. 2024 ("attention sinks"). raises ValueError if maps is not (..., T, T)
    with T = len(tokens).
    """
    T = len(tokens)
    if maps.dim() < 2 or maps.shape[-2:] != (T, T):
        raise ValueError(f"maps must be (..., T, T) with T = len(tokens) = {T}, got {tuple(maps.shape)}")
    w = maps.detach().float().cpu()
    rows = torch.arange(T) >= 1
    i = torch.arange(T)
    is_mark, parallel, rhyme = line_structure(tokens)
    sees_mark = is_mark.cumsum(0) > 0
    next_parallel = torch.full_like(parallel, -1)
    next_parallel[:-1] = parallel[1:]  # (T,) the previous line's position aligned with token i + 1
    entropy = -(w * torch.log(w.clamp_min(1e-30))).sum(-1)  # (..., T), 0 · ln 0 = 0
    prev = torch.zeros_like(w[..., 0])
    prev[..., 1:] = w[..., i[1:], i[1:] - 1]
    return {
        "entropy": _row_mean(entropy, rows),
        "max_weight": _row_mean(w.amax(-1), rows),
        "self": _row_mean(w.diagonal(dim1=-2, dim2=-1), rows),
        "prev_token": _row_mean(prev, rows),
        "first_token": _row_mean(w[..., 0], rows),
        "punctuation": _row_mean((w * is_mark).sum(-1), rows & sees_mark),
        "prev_line_same_pos": _row_mean(w[..., i, parallel.clamp_min(0)], rows & (parallel >= 0)),
        "prev_line_next_pos": _row_mean(w[..., i, next_parallel.clamp_min(0)], rows & (next_parallel >= 0)),
        "prev_line_rhyme": _row_mean(w[..., i, rhyme.clamp_min(0)], rows & (rhyme >= 0)),
    }


def mean_statistics(maps: list[torch.Tensor], token_lists: list[list[str]]) -> dict[str, torch.Tensor]:
    """`head_statistics` of several sequences, averaged over the sequences (NaNs skipped).

    maps: one (..., T_s, T_s) tensor per sequence, the same leading shape for all;
    token_lists: their tokens → {name: (...) tensor}. raises ValueError if the lists are
    empty or of different lengths.
    """
    if not maps or len(maps) != len(token_lists):
        raise ValueError(f"need one token list per map and at least one of each, got {len(maps)} and {len(token_lists)}")
    per_sequence = [head_statistics(m, t) for m, t in zip(maps, token_lists)]
    return {name: torch.stack([s[name] for s in per_sequence]).nanmean(0) for name in STATISTICS}


def uniform_causal_map(T: int) -> torch.Tensor:
    """The lesson's section 1 map (each row the average of itself and the rows before):
    (T, T) float, row i = 1/(i+1) on columns ≤ i. Its entropy row i is ln(i+1) nats."""
    m = torch.ones(T, T).tril()
    return m / m.sum(-1, keepdim=True)


def random_qk_maps(T: int, n: int, d: int = 8, seed: int = 0) -> torch.Tensor:
    """The lesson's section 3 maps: q, k ~ N(0, 1) of size d, scores q kᵀ/√d, causal mask, softmax.

    T: positions; n: how many independent maps; d: q/k size (the lesson's 8); seed: torch
    generator seed (same seed, same maps) → (n, T, T) float. raises ValueError for T, n or d < 1.
    """
    if min(T, n, d) < 1:
        raise ValueError(f"T, n and d must be ≥ 1, got {T}, {n}, {d}")
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(n, T, d, generator=gen)  # (n, T, d)
    k = torch.randn(n, T, d, generator=gen)  # (n, T, d)
    return causal_attention_weights(q, k)  # (n, T, T)


def random_head_maps(T: int, n: int, d_model: int = 16, d_head: int = 8, seed: int = 0) -> torch.Tensor:
    """The lesson's section 5 head: x ~ N(0, 1) of size d_model, W_q, W_k ~ N(0, 1/d_model)
    of shape (d_model, d_head), q = x W_q, k = x W_k, scores q kᵀ/√d_head, causal mask, softmax.

    n independent heads (each its own x, W_q, W_k); seed: torch generator seed →
    (n, T, T) float. raises ValueError for T, n, d_model or d_head < 1.
    """
    if min(T, n, d_model, d_head) < 1:
        raise ValueError(f"T, n, d_model and d_head must be ≥ 1, got {T}, {n}, {d_model}, {d_head}")
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, T, d_model, generator=gen)  # (n, T, d_model)
    W_q = torch.randn(n, d_model, d_head, generator=gen) / math.sqrt(d_model)  # (n, d_model, d_head)
    W_k = torch.randn(n, d_model, d_head, generator=gen) / math.sqrt(d_model)
    q, k = x @ W_q, x @ W_k  # each (n, T, d_head)
    return causal_attention_weights(q, k)  # (n, T, T)


def baseline_statistics(token_lists: list[list[str]], n_samples: int = 32, d: int = 8, d_model: int = 16,
                        d_head: int = 8, seed: int = 0) -> dict[str, dict[str, torch.Tensor]]:
    """The statistics of the uniform map and of the two random baselines on the given sequences.

    For sequence s, `n_samples` independent random maps of its length from generator seed
    `seed + s` (`random_qk_maps`, `random_head_maps`); sample k's value is the mean over
    the sequences of map k's statistic, as in `mean_statistics`. → {"uniform": {name: ()
    tensor}, "random_qk": {name: (n_samples,)}, "random_head": {name: (n_samples,)}}.
    raises ValueError if token_lists is empty.
    """
    if not token_lists:
        raise ValueError("need at least one sequence")
    qk = [random_qk_maps(len(t), n_samples, d, seed + s) for s, t in enumerate(token_lists)]  # (n_samples, T_s, T_s)
    head = [random_head_maps(len(t), n_samples, d_model, d_head, seed + s) for s, t in enumerate(token_lists)]
    return {
        "uniform": mean_statistics([uniform_causal_map(len(t)) for t in token_lists], token_lists),
        "random_qk": mean_statistics(qk, token_lists),
        "random_head": mean_statistics(head, token_lists),
    }


def far_from(value: float, samples: torch.Tensor, k: float = 3.0, min_effect: float = 0.1) -> int:
    """Whether a statistic is far from a baseline's distribution: +1 above, −1 below, 0 not.

    value: one head's statistic; samples: (n,) the baseline's values (over seeds or heads).
    Far means |value − mean| > k · std (population std) and > min_effect (in the statistic's
    unit: weight or nats), so a tiny spread does not flag a negligible difference.
    NaN values or samples give 0.
    """
    samples = samples.flatten().float()
    if math.isnan(value) or samples.isnan().any():
        return 0
    mean, std = samples.mean().item(), samples.std(correction=0).item()
    diff = value - mean
    if abs(diff) > k * std and abs(diff) > min_effect:
        return 1 if diff > 0 else -1
    return 0


def classify(stats: dict[str, float], baselines: dict[str, torch.Tensor | dict[str, torch.Tensor]],
             k: float = 3.0, min_effect: float = 0.1) -> tuple[dict[str, str], str]:
    """Flag one head's statistics against every baseline and name its pattern.

    stats: {name: value} of one head; baselines: {baseline: {name: (n,) samples}} (e.g. the
    random maps over seeds, the model at initialisation over its heads). A statistic is
    flagged "high" / "low" when `far_from` says so in the same direction for every
    baseline. The pattern is `PATTERNS[name]` of the largest mass flagged high, else
    "focused" if the entropy is flagged low, else "diffuse" if flagged high, else
    "random-like". → ({name: "high" | "low"} for flagged statistics, pattern).
    """
    flags = {}
    for name, value in stats.items():
        directions = {far_from(value, b[name], k, min_effect) for b in baselines.values()}
        if len(directions) == 1 and (d := directions.pop()):
            flags[name] = "high" if d > 0 else "low"
    masses = [n for n in PATTERNS if flags.get(n) == "high"]
    if masses:
        pattern = PATTERNS[max(masses, key=lambda n: stats[n])]
    else:
        pattern = {"low": "focused", "high": "diffuse"}.get(flags.get("entropy"), "random-like")
    return flags, pattern


def head_rows(stats: dict[str, torch.Tensor], baselines: dict[str, dict[str, torch.Tensor]],
              k: float = 3.0, min_effect: float = 0.1) -> list[dict]:
    """One row per head of a model's statistics, with flags and pattern (see `classify`).

    stats: {name: (n_layer, n_head)}; baselines as in `classify` → [{"layer", "head",
    *STATISTICS (float, None for NaN), "flags", "pattern"}] in layer-major order.
    """
    n_layer, n_head = stats[STATISTICS[0]].shape
    rows = []
    for layer in range(n_layer):
        for head in range(n_head):
            values = {n: stats[n][layer, head].item() for n in STATISTICS}
            flags, pattern = classify(values, baselines, k, min_effect)
            rows.append({"layer": layer, "head": head,
                         **{n: None if math.isnan(v) else v for n, v in values.items()},
                         "flags": flags, "pattern": pattern})
    return rows
