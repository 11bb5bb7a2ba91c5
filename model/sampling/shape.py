"""Constrained decoding to templates (`data.verse.templates`): `TemplateConstraint`, the logits
processor that keeps every row to the templates it still fits (a form with its tone patterns, an
acrostic's lines, a tune's variants), so 100 % of the poems have one. A token is allowed when one
of the row's templates allows it by its shape (line lengths, closing marks, the end), by every rule
asked for (`model.sampling.rules`) and by the row's keywords (`model.sampling.keywords.Placement`);
plan slots take the plan tokens that name the row's templates. docs/sampling.md#templates.
"""
from __future__ import annotations

import random
from functools import partial
from typing import Sequence

import torch

from data.tokenizer import CharTokenizer
from data.verse.ci import CI_LINE_END
from data.verse.plan import PLAN_SLOTS, plan_ids
from data.verse.poetry import is_hanzi
from data.verse.templates import Template
from model.sampling.keywords import KeywordRow, Keywords, Placement
from model.sampling.rules import Acrostic, Row, Rule, Tones, only, rhyme_rule, vocabulary_tables


class TemplateConstraint:
    """Logits processor keeping each row to its templates (module docstring).

    tokenizer: the model's CharTokenizer; rows: each row's templates, or one tuple for every row
    (one rhyme book throughout); script: the model's; rhyme, meter, acrostic: the rules asked for
    (the acrostic in the model's script); keywords: one tuple per row (or one for every row) of
    cleaned keywords in the model's script; prompt: the text given (its keywords count as written);
    seed: the keywords' slots. raises ValueError for a non-character tokenizer, no template whose
    marks the vocabulary has or whose lines the acrostic fills, a vocabulary without the rhymes;
    `check_text` for a prompt, `check_keywords` for keywords.
    """

    def __init__(self, tokenizer: CharTokenizer, rows: Sequence[tuple[Template, ...]], script: str = "simplified",
                 rhyme: bool = False, meter: bool = False, acrostic: str = "",
                 keywords: Sequence[tuple[str, ...]] = (), prompt: str = "", seed: int = 0):
        if not isinstance(tokenizer, CharTokenizer):
            raise ValueError("form, tune, acrostic, rhyme and meter need a character-level model (tokenizer=char)")
        self.tok, self.prompt, self.plan, self.only = tokenizer, prompt, plan_ids(tokenizer), partial(only, tokenizer)
        self.templates: list[Template] = []
        self.groups: list[frozenset[int]] = []  # each distinct row's templates, by index
        at: dict[tuple[Template, ...], int] = {}
        for row in rows:
            if row not in at:
                at[row] = len(self.groups)
                first = len(self.templates)
                self.templates += self._usable(row, acrostic)
                self.groups.append(frozenset(range(first, len(self.templates))))
        self.of_row = [at[row] for row in rows]
        self.hanzi, char_tones, tone_masks = vocabulary_tables(tokenizer, script)
        self.acrostic = Acrostic(self.templates, acrostic, self.only) if acrostic else None
        self.tones = Tones(self.templates, char_tones, tone_masks) if meter else None
        if meter and not all(m.any() for m in tone_masks.values()):
            raise ValueError("meter needs characters of both tones (平 and 仄) in the vocabulary")
        if self.tones and self.acrostic:  # the templates whose line openings the acrostic fits
            self.groups = [self._fitting(g, acrostic) for g in self.groups]
        self.rhyme = rhyme_rule(tokenizer, script, self.templates, self.plan) if rhyme else None
        self.keywords = [tuple(w for w in row if w not in prompt) for row in keywords]
        self.kw = Placement(self.templates, self.tones, self.acrostic, sum(map(is_hanzi, prompt)), seed, self.only) \
            if any(self.keywords) else None
        self.rules: list[Rule] = [r for r in (self.acrostic, self.tones, self.rhyme, self.kw and Keywords(self.kw))
                                  if r is not None]
        self.prompt_rhyme = [None] * len(self.groups)  # per group: the classes a prompt's rhyme leaves
        self.rows: list[Row] = []
        self.consumed = 0
        self._masks: dict[tuple, torch.Tensor] = {}  # state → (V,) bool, the tokens banned there
        self._buffer: torch.Tensor | None = None  # (B, V) bool: each call's banned tokens

    def _usable(self, templates: tuple[Template, ...], acrostic: str) -> list[Template]:
        """The templates whose marks the vocabulary has and, with an acrostic, whose lines it fills.
        raises ValueError if none is."""
        name = templates[0].name or "the acrostic"
        usable = [t for t in templates if all(m in self.tok.stoi for _, m in t.lines)]
        if not usable:
            marks = "".join(sorted({m for t in templates for _, m in t.lines} - set(self.tok.stoi)))
            raise ValueError(f"the vocabulary lacks {marks}, which every template of {name} needs")
        if acrostic and not (usable := [t for t in usable if len(t.lines) == len(acrostic)]):
            lines = " or ".join(map(str, sorted({len(t.lines) for t in templates})))
            raise ValueError(f"the acrostic {acrostic} has {len(acrostic)} characters, but {name} has {lines} lines")
        return usable

    def _fitting(self, g: frozenset[int], acrostic: str) -> frozenset[int]:
        """The templates of g whose line openings have the acrostic's tones. raises ValueError if none has."""
        kept = frozenset(i for i in g if all(self.tones.fits(i, k, c) for k, c in zip(self.templates[i].starts, acrostic)))
        if not kept:
            raise ValueError(f"the acrostic {acrostic!r} fits none of the {self.templates[min(g)].name} tone patterns "
                             "(meter=true)")
        return kept

    def _start(self, g: int, keywords: tuple[str, ...] = (), plan: bool = True) -> Row:
        n = max(len(self.templates[i].segments) for i in self.groups[g])
        return Row(live=self.groups[g], rhyme=(None,) * n, plan_left=PLAN_SLOTS if self.plan and plan else 0,
                   kw=KeywordRow(frozenset(keywords), len(keywords)) if keywords else None)

    def _name(self, g: int) -> str:
        return self.templates[min(self.groups[g])].name or "the acrostic"

    def max_tokens(self) -> int:
        """Tokens of the longest template, marks and `<eos>` included (not `<bos>`)."""
        return max(t.length + len(t.lines) for t in self.templates) + 1

    def _walk(self, g: int, text: str) -> Row:
        """A row of group g past `text` (a prompt). raises ValueError saying where it breaks the templates."""
        row = self._start(g, plan=False)
        for n, c in enumerate(text):
            if reason := self._advance(row, c):
                raise ValueError(f"the prompt {text!r} does not fit {self._name(g)} at {c!r} (character {n + 1}): "
                                 f"{reason}")
        return row

    def check_text(self, text: str) -> None:
        """raises ValueError saying where `text` (a prompt) leaves every template of a row; a prompt
        that rhymes already leaves a plan's rhyme token only its classes."""
        for g in range(len(self.groups)):
            row = self._walk(g, text)
            self.prompt_rhyme[g] = row.rhyme[0] if row.rhyme else None

    def check_keywords(self, rules: list[str]) -> None:
        """raises ValueError, in one line, if some row's keywords cannot all be placed in its templates
        after the prompt (`Placement.check`; `rules`: the rules in force, for the message)."""
        rows = self.keywords * len(self.of_row) if len(self.keywords) == 1 else self.keywords
        for g, words in dict.fromkeys(zip(self.of_row, rows)):
            if words:
                row = self._walk(g, self.prompt)
                self.kw.check(self._name(g), row.live, row.k, words, rules)

    def _first_tokens(self, g: int, live: frozenset[int] | None = None) -> dict[int, int]:
        """The plan tokens naming group g's templates (or those among `live`) → the training poems each
        holds (`Book.first_tokens`); {} for none."""
        live = sorted(live or self.groups[g])
        return self.templates[live[0]].book.first_tokens(self.plan, [self.templates[i] for i in live])

    def plan_tokens(self, g: int) -> torch.Tensor:
        """(V,) bool: the plan tokens group g's rows may take in their plan slots (module docstring)."""
        ids, book = self.plan, self.templates[min(self.groups[g])].book
        first = list(self._first_tokens(g)) or [ids.forms["other"]]
        rhymes = [*{**ids.rhymes, **book.plan_rhymes(ids)}.values(), ids.none]
        if self.rhyme is not None and self.rhyme.plan:
            rhymes = [j for k, j in self.rhyme.plan.items() if self._plannable(g, k)]
        allowed = torch.zeros(self.tok.vocab_size, dtype=torch.bool)
        allowed[[*first, *rhymes]] = True
        return allowed

    def _plannable(self, g: int, cls) -> bool:
        """Whether group g's first segment can rhyme in class `cls` (within a prompt's rhyme)."""
        within = self.prompt_rhyme[g]
        return (within is None or cls in within) and any(
            self.templates[i].segments and cls in self.rhyme.open[self.templates[i].segments[0]] for i in self.groups[g])

    def plans(self, n: int, seed: int) -> list[list[int]]:
        """The first plan token of each of n rows: a token naming one of its templates that the prompt
        begins, drawn (seeded) by the training poems each holds; `<其他>` where no token names one."""
        rng, other, tokens = random.Random(seed), self.plan.forms["other"], {}
        for g in range(len(self.groups)):
            row = self._start(g, plan=False)
            fits = all(self._advance(row, c) is None for c in self.prompt)  # else check_text says why
            tokens[g] = self._first_tokens(g, row.live if fits else None)
        rows = self.of_row * n if len(self.of_row) == 1 else self.of_row
        return [rng.choices(list(tokens[g]), weights=list(tokens[g].values())) if tokens[g] else [other] for g in rows]

    # --- one row -------------------------------------------------------------------------------

    def _expects(self, i: int, row: Row) -> tuple[str, str | None]:
        return self.templates[i].expects(row.k, row.marked)

    def _why_no_mark(self, row: Row) -> str:
        i = min(row.live)
        kind, mark = self._expects(i, row)
        line = self.templates[i].line_of(row.k if kind == "char" else row.k - 1)
        return (f"line {line + 1} continues with a character, not a mark" if kind == "char" else
                f"line {line + 1} ends with {mark}" if kind == "mark" else "the poem ends here")

    def _char_ok(self, i: int, row: Row, c: str) -> str | None:
        kind, mark = self._expects(i, row)
        if kind != "char":
            return f"the line ends here with {mark}" if kind == "mark" else "the poem ends here"
        if not is_hanzi(c):
            return "a character comes here, not a mark"
        return next((why for rule in self.rules if (why := rule.why_not(i, row, c))), None)

    def _advance(self, row: Row, c: str) -> str | None:
        """Move `row` past c; returns why no template allows it, or None."""
        if c in CI_LINE_END:
            live = frozenset(i for i in row.live if self._expects(i, row) == ("mark", c))
            if not live:
                return self._why_no_mark(row)
            row.live, row.marked = live, True
            row.ended = all(self.templates[i].length == row.k for i in live)
            for rule in self.rules:
                rule.close(row)
            return None
        results = {i: self._char_ok(i, row, c) for i in row.live}
        live = frozenset(i for i, why in results.items() if why is None)
        if not live:
            return next(iter(results.values()))
        for rule in self.rules:
            rule.advance(row, c, live)
        row.live, row.k, row.marked = live, row.k + 1, False
        return None

    def _banned(self, row: Row, g: int) -> tuple[torch.Tensor, list[int]]:
        """((V,) bool, the tokens none of the row's templates allows next (shared: do not modify);
        the ids of the characters the row has rhymed with, where a rhyme is due here ([]: none)).
        Masks are kept per state; `__call__` bans the rhymed characters too while others are left."""
        key = ("ended",) if row.ended else (row.k, row.marked, row.live, *(rule.key(row) for rule in self.rules))
        if key not in self._masks:
            self._masks[key] = ~self._mask_of(row)
        banned = self._masks[key]
        used = [self.tok.stoi[c] for c in self.rhyme.repeats(row)] if self.rhyme is not None else []
        return (banned & ~self.plan_tokens(g) if row.plan_left else banned), used

    def _mask_of(self, row: Row) -> torch.Tensor:
        allowed = torch.zeros(self.tok.vocab_size, dtype=torch.bool)
        if row.ended:
            allowed[self.tok.eos_id] = True
            return allowed
        for i in row.live:
            kind, mark = self._expects(i, row)
            if kind != "char":
                if all(rule.may_close(row, kind == "end") for rule in self.rules):
                    allowed[self.tok.eos_id if kind == "end" else self.tok.stoi[mark]] = True
                continue
            mask = self.hanzi
            for rule in self.rules:
                if (m := rule.mask(i, row)) is not None:
                    mask = mask & m
            allowed |= mask
        return allowed

    def __call__(self, idx: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """idx: (B, T) int64, the sequence so far; logits: (B, V) float, written into (in place: the
        engine hands each step's own) → the same logits, forbidden tokens -inf."""
        if not self.rows:
            groups = self.of_row * idx.size(0) if len(self.of_row) == 1 else self.of_row
            words = self.keywords * len(groups) if len(self.keywords) == 1 else self.keywords or [()] * len(groups)
            self.rows = [self._start(g, w) for g, w in zip(groups, words)]
            self._row_groups = groups
        for row, ids in zip(self.rows, idx[:, self.consumed:].tolist()):
            for i in (ids if self.consumed or not (self.plan and self.plan.segments) else self.plan.body(ids)):
                if i in (self.tok.bos_id, self.tok.eos_id):
                    continue
                if self.tok.is_plan(i):
                    row.plan_left = max(0, row.plan_left - 1)
                    if self.rhyme is not None:
                        self.rhyme.plan_class(row, i)
                    continue
                row.plan_left = 0
                if reason := self._advance(row, self.tok.itos[i]):
                    raise ValueError(f"a generated token broke the template: {reason}")  # a bug if seen
        self.consumed = idx.size(1)
        masks, used = zip(*map(self._banned, self.rows, self._row_groups))
        if self._buffer is None or self._buffer.size(0) != len(masks):
            self._buffer = torch.empty(len(masks), self.tok.vocab_size, dtype=torch.bool)
        banned = torch.stack(masks, out=self._buffer)  # (B, V), written into one buffer for every step
        if rows := [b for b, ids in enumerate(used) for _ in ids]:  # one pass for every row's rhymed characters
            at = {b: j for j, b in enumerate(dict.fromkeys(rows))}  # the rows where a rhyme is due
            fresh = banned[list(at)]  # (k, V): theirs
            fresh[[at[b] for b in rows], [i for ids in used for i in ids]] = True
            left = ~fresh.all(1)  # (k,): repeat a rhyme only if nothing else is left
            banned[[b for b, ok in zip(at, left.tolist()) if ok]] = fresh[left]
        return logits.masked_fill_(banned.to(logits.device), float("-inf"))
