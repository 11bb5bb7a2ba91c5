"""Choosing the next token from the model's logits, the inference engine's drawing (as nanochat's
engine samples): temperature, top-k, top-p, CTRL's repetition penalty and a topic's lean.

Each step of the engine (`model.engine.Engine.steps`) runs: logits processors (the poem's rules,
`model.sampling`; repetition penalty; topic lean) → temperature → top-k → top-p → one draw from the
softmax (or the argmax when temperature is 0): `next_token`, the engine's `draw`.
"""
from __future__ import annotations

from functools import partial
from typing import Callable

import torch
import torch.nn.functional as F

from data.tokenizer import Tokenizer
from data.verse.plan import plan_ids
from data.verse.poetry import LINE_END, is_hanzi

MAX_TEMPERATURE = 1e6
"""Far past uniform sampling already, and far below float32's range (where logits / temperature
turn -inf into NaN)."""


def check_sampling_args(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """raises ValueError for a temperature outside [0, MAX_TEMPERATURE] (NaN included), top_k < 1,
    or top_p outside (0, 1], and for any of them not a number."""
    for name, value in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(f"{name} must be a number, got {value!r}")
    if not 0 <= temperature <= MAX_TEMPERATURE:
        raise ValueError(f"temperature must be from 0 (greedy) to {MAX_TEMPERATURE:g}, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be ≥ 1 (or null for the whole vocabulary), got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] (or null), got {top_p}")


def top_k_filter(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep the `top_k` largest logits of each row, -inf elsewhere (ties at the k-th kept).

    logits: (B, V) float; top_k ≥ V is clamped to V. Fan et al. 2018, "Hierarchical Neural
    Story Generation", §5.4.
    """
    kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]  # (B, 1)
    return logits.masked_fill(logits < kth, float("-inf"))


TOP_P_TOLERANCE = 1e-6
"""Probability mass by which a set may fall short of `top_p` and still reach it: softmax and cumsum
round (in float64 the mass of 0.5 and 0.3 from their logarithms is 0.7999999999999999), and an exact
comparison would then keep one token more than the smallest set (cf. huggingface/transformers#18976)."""


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filtering: keep the smallest set of likeliest tokens whose probability reaches
    `top_p` (within TOP_P_TOLERANCE), -inf elsewhere; the likeliest token always survives, and
    top_p = 1 keeps every token of nonzero probability.

    logits: (B, V) float; top_p in (0, 1]. Holtzman et al. 2020, "The Curious Case of Neural
    Text Degeneration", §3.1.
    """
    if top_p >= 1:
        return logits
    probs, order = F.softmax(logits, dim=-1).sort(dim=-1, descending=True)  # (B, V) each
    before = probs.cumsum(dim=-1) - probs  # probability of the tokens ranked above each one
    drop_sorted = before >= top_p - TOP_P_TOLERANCE
    drop_sorted[:, 0] = False  # the likeliest token, also for a top_p below the tolerance
    drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
    return logits.masked_fill(drop, float("-inf"))


def check_logits(logits: torch.Tensor, source: str) -> None:
    """raises ValueError if logits (any shape, float) hold NaN or +inf; -inf (a forbidden token)
    is allowed. source: what produced them, for the message."""
    if torch.isnan(logits).any() or torch.isposinf(logits).any():
        raise ValueError(f"{source} produced NaN or +inf logits; refusing to sample from them")


def next_token(logits: torch.Tensor, temperature: float, top_k: int | None = None,
               top_p: float | None = None, generator: torch.Generator | None = None,
               unfiltered: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row: logits (B, V) float → (B, 1) int64.

    unfiltered: (V,) bool; a row whose allowed tokens (logit not -inf) are all among these is drawn
    without top_k and top_p (the plan slots of a plan model: the filters cut the text's tail, not the
    plan). temperature 0 is greedy (argmax; top_k and top_p change nothing). raises ValueError, at any
    temperature, if the logits hold NaN or +inf, if a row allows no token at all (every logit
    -inf), or if logits / temperature overflow or underflow to nothing (a temperature too close to
    0: use 0).
    """
    check_logits(logits, "the model or a logits processor")
    if torch.isneginf(logits).all(dim=-1).any():
        raise ValueError("no token is allowed at this step (every logit is -inf)")
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if torch.isposinf(logits).any() or torch.isnan(logits).any() or torch.isneginf(logits).all(dim=-1).any():
        raise ValueError(f"temperature={temperature} is too small: logits / temperature overflow; use 0 for greedy")
    kept = logits
    if top_k is not None:
        kept = top_k_filter(kept, top_k)
    if top_p is not None:
        kept = top_p_filter(kept, top_p)
    if unfiltered is not None:  # (B, 1): rows that may draw only these tokens keep every logit
        kept = torch.where((torch.isneginf(logits) | unfiltered.to(logits.device)).all(-1, keepdim=True), logits, kept)
    return torch.multinomial(F.softmax(kept, dim=-1), 1, generator=generator)  # (B, 1)


def sampler(temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
            generator: torch.Generator | None = None,
            unfiltered: torch.Tensor | None = None) -> Callable[[torch.Tensor], torch.Tensor]:
    """The engine's `draw` for these settings: logits (B, V) → `next_token(logits, temperature,
    top_k, top_p, generator, unfiltered)`, (B, 1) int64. raises ValueError now for bad settings
    (`check_sampling_args`), before any step."""
    check_sampling_args(temperature, top_k, top_p)
    return partial(next_token, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator,
                   unfiltered=unfiltered)


def poem_characters(tok: Tokenizer) -> torch.Tensor:
    """(V,) bool: the tokens that hold a CJK character (not marks, plan tokens or specials)."""
    return torch.tensor([any(map(is_hanzi, tok.decode([i]))) for i in range(tok.vocab_size)])


class RepetitionPenalty:
    """CTRL's repetition penalty (Keskar et al. 2019, §4.1), on characters already in the poem.

    A logit z of a token that occurred in the sequence becomes z / penalty if z > 0, else
    z · penalty, so penalty > 1 discourages repeats and 1.0 changes nothing. `penalised`:
    (V,) bool, the tokens it applies to (the poem's characters, not punctuation or specials).
    `outside`: idx (B, T) → (B, T) bool, the positions that are not the poem (a condition
    segment: its words are not repeats); None: every position is.
    raises ValueError if penalty < 1.
    """

    def __init__(self, penalty: float, penalised: torch.Tensor,
                 outside: Callable[[torch.Tensor], torch.Tensor] | None = None):
        if penalty < 1:
            raise ValueError(f"repetition_penalty must be ≥ 1 (1 = off), got {penalty}")
        self.penalty, self.penalised, self.outside = penalty, penalised, outside

    @classmethod
    def of_poem(cls, tok: Tokenizer, start: torch.Tensor, penalty: float) -> RepetitionPenalty:
        """The penalty on the poem's characters (`poem_characters`), not on the condition segment of
        `start` (B, T0), the tokens before the poem."""
        ids = plan_ids(tok)
        given = torch.tensor([ids.segment_mask(r) for r in start.tolist()], device=start.device) \
            if ids and ids.segments else None  # (B, T0): the segments' positions
        if given is None or not given.any():
            return cls(penalty, poem_characters(tok))
        return cls(penalty, poem_characters(tok), lambda idx: F.pad(given, (0, idx.size(1) - given.size(1))))

    def __call__(self, idx: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        poem = idx if self.outside is None else idx.masked_fill(self.outside(idx), 0)  # id 0, <bos>: never penalised
        seen = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, poem, True)  # (B, V)
        seen &= self.penalised.to(logits.device)
        scaled = torch.where(logits > 0, logits / self.penalty, logits * self.penalty)
        return torch.where(seen, scaled, logits)


class TopicLean:
    """Weighted decoding toward a topic (Ghazvininejad et al. 2016, Hafez, §5): row r's logits plus
    `bias[r]` (B or 1, V) on the tokens the row has not written yet (a character written once is
    leaned toward no more); never at a line's last character, where the rhyme is (a line as long as
    the poem's first, or `line_len`, the form's; 5 before the first line ends). start: the tokens
    before the poem (`<bos>`, condition segment, given plan). The bias itself (the title plan's
    words' log-lifts): `model.sampling.title_plan.topic_lean`."""

    def __init__(self, bias: torch.Tensor, tok: Tokenizer, start: int, line_len: int | None = None):
        self.bias, self.start, self.line_len, self.hanzi = bias, start, line_len, poem_characters(tok)
        self.marks = torch.tensor(sorted(tok.stoi[c] for c in LINE_END if c in tok.stoi))

    def __call__(self, idx: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        bias = self.bias.to(logits).expand_as(logits).scatter(1, idx, 0.0)  # what a row has written: no more
        return logits + bias * self.inside_line(idx[:, self.start:])

    def inside_line(self, body: torch.Tensor) -> torch.Tensor:
        """(B, 1) bool: whether each row's next character is not its line's last. body: (B, n) the
        poem so far (plan tokens are not characters)."""
        if not body.size(1):
            return torch.ones(len(body), 1, dtype=torch.bool, device=body.device)
        mark, written = torch.isin(body, self.marks.to(body.device)), self.hanzi.to(body.device)[body].long().cumsum(1)
        since = written[:, -1:] - torch.where(mark, written, 0).cummax(1).values[:, -1:]  # (B, 1) in this line
        first = written.gather(1, mark.long().argmax(1, keepdim=True))  # (B, 1): the first line's length
        length = self.line_len or torch.where(mark.any(1, keepdim=True), first, 5)
        return since + 1 < length
