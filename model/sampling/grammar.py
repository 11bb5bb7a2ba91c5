"""The rules every sampled poem keeps whatever was asked: where a poem may end and where a line mark
may stand (`PoemBoundaries`), and where plan tokens may stand (`PlanGrammar`, a model with plan
tokens: `data/verse/plan.py`); built once per tokenizer (`poem_boundaries`, `plan_grammar`).
"""
from __future__ import annotations

from functools import lru_cache

import torch

from data.tokenizer import Tokenizer
from data.verse.plan import plan_ids
from data.verse.poetry import LINE_END


class PoemBoundaries:
    """The rules every sampled poem keeps, with or without a form: a poem ends (`eos_id`) only
    right after a token whose text ends a sentence (。？！；); a line mark never follows `<bos>`
    or another mark (no poem starts with `。`, no empty line); `bos_id` is never sampled.
    So there are no empty poems and no poem cut mid-line.

    closers: (V,) bool, the tokens after which the poem may end (`eos_id` is added: an ended
    row keeps getting `<eos>`); marks: (V,) bool, the tokens whose text starts with a line mark
    (，。？！；); after_mark: (V,) bool, the tokens whose text ends with one.
    """

    def __init__(self, closers: torch.Tensor, marks: torch.Tensor, after_mark: torch.Tensor, bos_id: int, eos_id: int):
        self.closers, self.marks, self.bos_id, self.eos_id = closers.clone(), marks, bos_id, eos_id
        self.closers[eos_id] = True
        self.no_mark_next = after_mark.clone()
        self.no_mark_next[bos_id] = True

    def __call__(self, idx: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        logits = logits.clone()
        logits[:, self.bos_id] = float("-inf")
        last = idx[:, -1]  # (B,)
        logits[~self.closers.to(idx.device)[last], self.eos_id] = float("-inf")
        no_mark = self.no_mark_next.to(idx.device)[last][:, None] & self.marks.to(idx.device)  # (B, V)
        return logits.masked_fill(no_mark, float("-inf"))


class PlanGrammar:
    """Where plan tokens (`data/verse/plan.py`) may stand: until a row has a form token only a form
    token (right after `<bos>`, or after the condition segment given with it), right after a form
    token only a rhyme token, and no plan token anywhere else. So a poem sampled from `<bos>`
    draws its plan first, and a poem never shows a plan token later.

    forms: (V,) bool, the tokens of a plan's first slot (`PlanIds.firsts`: the form tokens, and the
    tune tokens of a model trained with them); rhymes: (V,) bool, the rhyme tokens allowed in the rhyme
    slot (all of them and `<无韵>`, or only real groups for soft `rhyme`); plan: (V,) bool, every
    plan token.
    """

    def __init__(self, forms: torch.Tensor, rhymes: torch.Tensor, plan: torch.Tensor, bos_id: int):
        self.forms, self.rhymes, self.plan, self.bos_id = forms, rhymes, plan, bos_id

    def __call__(self, idx: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        last = idx[:, -1]  # (B,)
        forms, rhymes, plan = (m.to(idx.device) for m in (self.forms, self.rhymes, self.plan))
        allowed = torch.where(forms[last][:, None], rhymes, ~plan)  # (B, V): after a form token, a rhyme
        unplanned = ~forms[idx].any(dim=1)  # (B,): no form token yet
        allowed = torch.where(unplanned[:, None], forms, allowed)  # (B, V): first of all, a form
        return logits.masked_fill(~allowed, float("-inf"))


@lru_cache(maxsize=8)
def poem_boundaries(tok: Tokenizer) -> PoemBoundaries:
    """The `PoemBoundaries` of a tokenizer's vocabulary (built once per tokenizer; stateless); a
    line mark never follows a plan token either."""
    texts = [tok.decode([i]) for i in range(tok.vocab_size)]
    closers = torch.tensor([t.endswith(tuple(LINE_END[1:])) for t in texts])  # (V,) bool
    marks = torch.tensor([t.startswith(tuple(LINE_END)) for t in texts])  # (V,) bool
    after_mark = torch.tensor([t.endswith(tuple(LINE_END)) or tok.is_plan(i) for i, t in enumerate(texts)])  # (V,)
    return PoemBoundaries(closers, marks, after_mark, tok.bos_id, tok.eos_id)


def plan_grammar(tok: Tokenizer, real: tuple[int, ...] = ()) -> PlanGrammar:
    """The `PlanGrammar` of a tokenizer with plan tokens; real: the only rhyme tokens the rhyme slot
    takes (soft `rhyme`: the classes of the poem's rhyme book, `Book.plan_rhymes`), () for every
    rhyme token and `<无韵>`."""
    ids, V = plan_ids(tok), tok.vocab_size
    forms, rhymes, plan = (torch.zeros(V, dtype=torch.bool) for _ in range(3))  # (V,) each
    forms[ids.firsts] = True
    rhymes[list(real) or [*ids.rhymes.values(), ids.none, *ids.ci_rhymes.values()]] = True
    plan[ids.all] = True
    return PlanGrammar(forms, rhymes, plan, tok.bos_id)
