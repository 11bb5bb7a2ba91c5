"""Constrained decoding of a 词 to a tune (`form=ci tune=浣溪沙`): a logits processor that keeps
the tune's template (`data.verse.tunes`), so 100 % of the 词 have it.

A tune has one template or several (又一体: the same tune punctuated or cut differently); the
processor starts with every template of the tune seen in at least `MIN_EVIDENCE` training 词
whose marks the vocabulary has, keeps per row the templates the text so far fits, and allows a
token when one of them allows it:
- **shape**: each line has its template's length and closing mark, and the 词 ends (`<eos>`)
  after its last line;
- `rhyme`: the characters at a segment's rhyme positions share one 词林正韵 class of the
  segment's tone (`data.verse.ci.rhyme_classes`; the first rhyme picks it, among classes with a
  character in the vocabulary for every position of the segment) and do not repeat while another
  is left; a tune that changes rhyme (菩萨蛮) picks a class per segment;
- `meter`: every position the template fixes (平 or 仄, not 中) takes a character of that tone
  (a polyphonic character fits either);
- `acrostic`: line i starts with the acrostic's i-th character (templates with as many lines);
- `keywords`: each row's keywords stand in it, whole, inside a line, where the model chooses
  (`model.sampling.ci_keywords`: the rules of `model.sampling.keywords` on the templates).

Plan tokens (a model trained with them, the default): a row's plan slots take the token of one of
its tune's templates (a model trained with tune tokens, `experiment=ci`: `plans` draws one by the
templates' shares) or else `<其他>`, the form token of every poem that is not one of the four
forms, then a rhyme token, as in `model.sampling.constraints`; on a model with tune tokens also a
词林正韵 class (`<7部平>`), in which `rhyme` then rhymes the first segment: with `rhyme` such a
model's rhyme slot takes only a class of the first segment's tone that the vocabulary can rhyme it
in, so the plan names the class the 词 rhymes in first.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Sequence

import torch

from data.tokenizer import CharTokenizer
from data.verse.ci import CI_LINE_END, rhyme_classes
from data.verse.plan import PLAN_SLOTS, plan_ids
from data.verse.poetry import is_hanzi
from data.verse.tunes import EITHER, MIN_EVIDENCE, Variant, find_tune, tunes
from model.sampling.ci_keywords import KeywordRow, TuneKeywords
from model.sampling.constraints import poem_tokens, vocabulary_tables


@dataclass(frozen=True)
class _Template:
    """A variant as the processor reads it: marks (body index → the mark after that many
    characters), line starts, the tone of each position, and each rhyme position's segment."""
    variant: Variant
    length: int
    marks: dict[int, str]
    starts: tuple[int, ...]
    tones: str
    rhyme_at: dict[int, int]
    sizes: tuple[int, ...]  # positions per segment


def _template(v: Variant) -> _Template:
    marks, starts, rhyme_at, at = {}, [], {}, 0
    for (n, mark), segment in zip(v.lines, v.rhymes):
        starts.append(at)
        at += n
        marks[at] = mark
        if segment is not None:
            rhyme_at[at - 1] = segment
    sizes = tuple(sum(s == i for s in v.rhymes) for i in range(len(v.segments)))
    return _Template(v, at, marks, tuple(starts), "".join(v.tones), rhyme_at, sizes)


@lru_cache(maxsize=8)
def _vocabulary_tables(tok: CharTokenizer, script: str) -> tuple:
    """(hanzi (V,) bool, character → tones, tone → (V,) bool, character → 词林正韵 classes, class →
    (V,) bool) of a vocabulary: built once per tokenizer (shared tensors: do not modify)."""
    hanzi, _, _, char_tones, tone_masks = vocabulary_tables(tok, script)
    classes = {c: cls for c, cls in rhyme_classes(script).items() if c in tok.stoi and is_hanzi(c)}
    class_masks: dict[tuple[int, str], torch.Tensor] = {}
    for c, cls in classes.items():
        for k in cls:
            class_masks.setdefault(k, torch.zeros(tok.vocab_size, dtype=torch.bool))[tok.stoi[c]] = True
    return hanzi, char_tones, tone_masks, classes, class_masks


@dataclass
class _TuneRow:
    """Where one 词 is: characters so far (marks not counted), whether the mark after them is
    written, the templates it still fits, and per template the rhyme classes each segment still
    shares (None: no rhyme yet) and the rhyme characters used."""
    k: int = 0
    marked: bool = False
    live: frozenset[int] = frozenset()
    classes: dict[int, tuple[frozenset | None, ...]] = field(default_factory=dict)
    used: frozenset[str] = frozenset()
    ended: bool = False
    plan_left: int = 0
    tune: str = ""
    kw: KeywordRow | None = None


class TuneConstraint:
    """Logits processor keeping a tune's template, its rhyme and 平仄 (module docstring).

    tokenizer: the model's CharTokenizer; tune: a tune name (either script, `find_tune`), or one
    per row; acrostic: in the model's script; script: the model's script; keywords: one tuple
    per row (or one for every row) of cleaned keywords in the model's script
    (`model.sampling.keywords.clean_keywords`); prompt: the text given (its keywords count as
    written); seed: the keywords' slots. raises ValueError for a non-character tokenizer, an
    unknown tune (with the nearest names), an acrostic with a line count no template has, or a
    vocabulary without the template's marks or rhymes; `check_keywords` for keywords.
    """

    def __init__(self, tokenizer: CharTokenizer, tune: str | Sequence[str], acrostic: str = "", rhyme: bool = False,
                 meter: bool = False, script: str = "simplified", keywords: Sequence[tuple[str, ...]] = (),
                 prompt: str = "", seed: int = 0):
        if not isinstance(tokenizer, CharTokenizer):
            raise ValueError("form=ci needs a character-level model (tokenizer=char)")
        self.tok, self.acrostic, self.rhyme, self.meter = tokenizer, acrostic, rhyme, meter
        self.row_tunes = [find_tune(t) for t in ([tune] if isinstance(tune, str) else tune)]
        self.templates: list[_Template] = []
        self.of_tune: dict[str, frozenset[int]] = {}  # tune → its templates' indices
        for name in dict.fromkeys(self.row_tunes):
            first = len(self.templates)
            self.templates += [_template(v) for v in self._usable(name)]
            self.of_tune[name] = frozenset(range(first, len(self.templates)))
        V = tokenizer.vocab_size
        self.hanzi, self.tones, self.tone_masks, self.classes, self.class_masks = _vocabulary_tables(tokenizer, script)
        if rhyme:
            need = max(max(t.sizes) for t in self.templates)
            self.open = {tone: frozenset(k for k, m in self.class_masks.items() if k[1] == tone and m.sum() >= need)
                         for tone in "平仄"}
            if not all(self.open[tone] for t in self.templates for tone in t.variant.segments):
                raise ValueError(f"no 词林正韵 class has {need} characters of the tone {'、'.join(self.of_tune)} "
                                 "rhymes in, in this vocabulary")
        self.plan = plan_ids(tokenizer)
        self.plan_tokens: dict[str, torch.Tensor] = {}  # tune → (V,) bool: the plan tokens its rows may take
        for name in self.of_tune if self.plan else ():
            rhymes = [*self.plan.rhymes.values(), self.plan.none, *self.plan.ci_rhymes.values()]
            if rhyme and self.plan.ci_rhymes:  # the classes `rhyme` can keep in the tune's first segment
                tones = {self.templates[i].variant.segments[0] for i in self.of_tune[name]}
                rhymes = [i for c, i in self.plan.ci_rhymes.items() if any(c in self.open[t] for t in tones)]
            self.plan_tokens[name] = torch.zeros(V, dtype=torch.bool)
            self.plan_tokens[name][[*(self._tokens(name) or [self.plan.forms["other"]]), *rhymes]] = True
        self.class_of_id = {i: c for c, i in self.plan.ci_rhymes.items()} if self.plan else {}
        self.rows: list[_TuneRow] = []
        self.consumed = 0
        self._masks: dict[tuple, torch.Tensor] = {}  # state → (V,) bool, the tokens banned there
        self._buffer: torch.Tensor | None = None  # (B, V) bool: each call's banned tokens
        self._class_unions: dict[frozenset, torch.Tensor] = {}
        self.prompt = prompt
        self.row_keywords = [tuple(w for w in row if w not in prompt) for row in keywords]
        first = sum(map(is_hanzi, prompt))  # the body index where the keywords' sections start
        self.kw = TuneKeywords(self.templates, self.tones, meter, acrostic, first, seed, self._only) \
            if any(self.row_keywords) else None

    def _usable(self, name: str) -> list[Variant]:
        """The templates of tune `name` this processor writes (module docstring). raises ValueError
        if the vocabulary lacks their marks or the acrostic's line count fits none."""
        variants = tunes()[name]
        usable = [v for v in variants if (v.count >= MIN_EVIDENCE or v is variants[0])
                  and all(m in self.tok.stoi for _, m in v.lines)]
        if not usable:
            marks = "".join(sorted({m for v in variants for _, m in v.lines} - set(self.tok.stoi)))
            raise ValueError(f"the vocabulary lacks {marks}, which every template of {name} needs")
        if self.acrostic:
            lines = sorted({len(v.lines) for v in usable})
            usable = [v for v in usable if len(v.lines) == len(self.acrostic)]
            if not usable:
                raise ValueError(f"the acrostic {self.acrostic} has {len(self.acrostic)} characters, but {name} has "
                                 f"{' or '.join(map(str, lines))} lines")
        return usable

    def _tokens(self, name: str, live: frozenset[int] | None = None) -> dict[int, int]:
        """The tune tokens of the templates of tune `name` this processor writes (a model trained
        with them), or of those among `live`: id → the training 词 of its template."""
        kept = {self.templates[i].variant.shape for i in (self.of_tune[name] if live is None else live)}
        return {i: v.count for i, (t, k) in self.plan.templates.items()
                if t == name and (v := tunes()[t][k]).shape in kept}

    def plans(self, n: int, seed: int) -> list[list[int]]:
        """The first plan token of each of n rows: a token of one of its tune's templates that this
        processor writes and the prompt begins, drawn (seeded) by the training 词 each holds;
        `<其他>` on a model without tune tokens. raises ValueError for a model without plan tokens."""
        if self.plan is None:
            raise ValueError("this model has no plan tokens")
        rng, other = random.Random(seed), self.plan.forms["other"]
        tokens = {}  # tune → its tokens the prompt fits
        for tune in self.of_tune:
            row = self._start(tune)
            row.plan_left = 0
            fits = all(self._advance(row, c) is None for c in self.prompt)  # else check_text says why
            tokens[tune] = self._tokens(tune, row.live if fits else None)
        return [rng.choices(list(tokens[t]), weights=list(tokens[t].values())) if tokens[t] else [other]
                for t in (self.row_tunes * n if len(self.row_tunes) == 1 else self.row_tunes)]

    def max_tokens(self) -> int:
        """Tokens of the longest template, marks and `<eos>` included (not `<bos>`)."""
        return max(t.length + len(t.marks) for t in self.templates) + 1

    def _start(self, tune: str, keywords: tuple[str, ...] = ()) -> _TuneRow:
        live = self.of_tune[tune]
        return _TuneRow(live=live, classes={i: (None,) * len(self.templates[i].variant.segments) for i in live},
                        plan_left=PLAN_SLOTS if self.plan else 0, tune=tune,
                        kw=KeywordRow(frozenset(keywords), len(keywords)) if keywords else None)

    def _only(self, chars) -> torch.Tensor:
        """(V,) bool: only these characters."""
        allowed = torch.zeros(self.tok.vocab_size, dtype=torch.bool)
        allowed[[self.tok.stoi[c] for c in chars]] = True
        return allowed

    def check_keywords(self) -> None:
        """raises ValueError, in one line, if some row's keywords cannot all be placed in its tune:
        a keyword longer than every line, more keyword characters than the 词 holds, a keyword
        whose 平仄 fits no position (meter), or no joint placement (the rules of
        `model.sampling.ci_keywords`, the acrostic, the prompt)."""
        rows = self.row_keywords * len(self.row_tunes) if len(self.row_keywords) == 1 else self.row_keywords
        for tune, words in dict.fromkeys(zip(self.row_tunes, rows)):
            if not words:
                continue
            row = self._start(tune, words)
            row.plan_left = 0
            for c in self.prompt:
                self._advance(row, c)
            templates = [self.templates[i] for i in self.of_tune[tune]]
            longest = max(n - (r is not None) for t in templates for (n, _), r in zip(t.variant.lines, t.variant.rhymes))
            size = max(t.length for t in templates)
            if long := [w for w in words if len(w) > longest]:
                raise ValueError(f"the keyword {long[0]} has {len(long[0])} characters, more than a line of {tune} "
                                 f"holds before its rhyme ({longest})")
            if (total := sum(map(len, words))) > size:
                raise ValueError(f"the keywords {'、'.join(words)} have {total} characters, more than {tune} holds "
                                 f"({size})")
            for w in words:
                if self.meter and not any(self.kw.tones_fit(i, k, w) for i in self.of_tune[tune]
                                          for k in range(self.templates[i].length - len(w) + 1)):
                    tones = "".join("/".join(sorted(self.tones.get(c, ()))) or "?" for c in w)
                    raise ValueError(f"the keyword {w} ({tones}) fits no position of {tune}'s 平仄 (meter=true)")
            if not any(self.kw.placeable(i, row.k, row.kw.pending, row.kw.total) for i in row.live):
                rules = ["each rhyming line's last character left to the rhyme", *(["the 平仄"] * self.meter),
                         *(["the acrostic"] * bool(self.acrostic)), *(["the prompt"] * bool(self.prompt)),
                         *(["one keyword to each part of the 词"] * (len(words) > 1))]
                said = f"the keywords {'、'.join(words)} cannot all" if len(words) > 1 else f"the keyword {words[0]} cannot"
                raise ValueError(f"{said} be placed in {tune} with {', '.join(rules)}")

    def check_text(self, text: str) -> None:
        """raises ValueError saying where `text` (a prompt) leaves every template of a tune asked for."""
        for tune in self.of_tune:
            row = self._start(tune)
            row.plan_left = 0
            for i, c in enumerate(text):
                if reason := self._advance(row, c):
                    raise ValueError(f"the prompt {text!r} does not fit {tune} at {c!r} (character {i + 1}): {reason}")

    # --- one template ------------------------------------------------------------------------

    def _expects(self, i: int, row: _TuneRow) -> tuple[str, object]:
        """What template i allows next: ("mark", m), ("end", None) or ("char", classes|None)."""
        t = self.templates[i]
        if row.k in t.marks and not row.marked:
            return "mark", t.marks[row.k]
        if row.k == t.length:
            return "end", None
        segment = t.rhyme_at.get(row.k) if self.rhyme else None
        return "char", None if segment is None else (segment, row.classes[i][segment])

    def _char_ok(self, i: int, row: _TuneRow, c: str) -> tuple[bool, str]:
        t, (kind, rhyme) = self.templates[i], self._expects(i, row)
        if kind != "char":
            return False, f"the line ends here with {rhyme}" if kind == "mark" else "the 词 ends here"
        if not is_hanzi(c):
            return False, "a character comes here, not a mark"
        if self.acrostic and row.k in t.starts and c != self.acrostic[t.starts.index(row.k)]:
            return False, f"the line starts with {self.acrostic[t.starts.index(row.k)]} (acrostic)"
        tone = t.tones[row.k]
        if self.meter and tone != EITHER and tone not in self.tones.get(c, ()):
            return False, f"character {row.k + 1} is {tone} (meter)"
        if rhyme is not None:
            segment, shared = rhyme
            have = self.classes.get(c, frozenset()) & (shared if shared is not None
                                                       else self.open[t.variant.segments[segment]])
            if not have:
                return False, f"character {row.k + 1} rhymes ({t.variant.segments[segment]}韵)"
        return True, ""

    # --- the processor -----------------------------------------------------------------------

    def _advance(self, row: _TuneRow, c: str) -> str | None:
        """Move `row` past c; returns why no template allows it, or None."""
        if c in CI_LINE_END:
            live = frozenset(i for i in row.live if self._expects(i, row) == ("mark", c))
            if not live:
                return "no line of the tune ends here" + ("" if row.k else " (a 词 starts with a character)")
            row.live, row.marked = live, True
            row.ended = all(self.templates[i].length == row.k for i in live)
            if row.kw is not None:
                TuneKeywords.advance(row.kw, None)
            return None
        results = {i: self._char_ok(i, row, c) for i in row.live}
        live = frozenset(i for i, (ok, _) in results.items() if ok)
        if not live:
            return next(why for _, why in results.values())
        if row.kw is not None and row.k >= self.kw.first:  # the keywords: templates that allow c, and what c opens
            self.kw.key(row.kw, row.k, row.live)
            live = frozenset(i for i in live if (chars := self.kw.allowed(i, row.k, row.kw, row.live)) is None
                             or c in chars)
            if not live:
                return "the keywords could not all be placed after it"
            TuneKeywords.advance(row.kw, c, {w for i in live for w in self.kw.starts(i, row.k, row.kw)})
        for i in live:
            t = self.templates[i]
            if self.rhyme and (segment := t.rhyme_at.get(row.k)) is not None:
                shared = row.classes[i][segment]
                have = self.classes[c] & (shared if shared is not None else self.open[t.variant.segments[segment]])
                row.classes[i] = row.classes[i][:segment] + (have,) + row.classes[i][segment + 1:]
                row.used = row.used | {c}
        row.live, row.k, row.marked = live, row.k + 1, False
        return None

    def _plan_rhyme(self, row: _TuneRow, cls: tuple[int, str]) -> None:
        """A row that planned 词林正韵 class `cls` rhymes its first segment in it, in every live
        template whose first segment has its tone (where the vocabulary has enough of it)."""
        for i in row.live:
            segments = self.templates[i].variant.segments
            if segments and cls in self.open[segments[0]] and row.classes[i][0] is None:
                row.classes[i] = (frozenset({cls}), *row.classes[i][1:])

    def _banned(self, row: _TuneRow) -> tuple[torch.Tensor, list[int]]:
        """((V,) bool, the tokens none of the row's templates allows next (shared: do not modify);
        the ids of the characters the row has rhymed with, where a rhyme is due here ([]: none)).
        Masks are kept per state (position, templates, the classes of the rhyme due here);
        `__call__` bans the rhymed characters too while others are left."""
        if row.ended:
            key = ("ended",)
        else:
            due = tuple((i, row.classes[i][s]) for i in sorted(row.live)
                        if (s := self.templates[i].rhyme_at.get(row.k)) is not None) if self.rhyme else ()
            key = (row.k, row.marked, row.live, due, row.kw and self.kw.key(row.kw, row.k, row.live))
        if key not in self._masks:
            self._masks[key] = ~self._mask_of(row)
        banned = self._masks[key]
        used = [self.tok.stoi[c] for c in row.used] if not row.ended and row.used and key[3] else []
        return (banned & ~self.plan_tokens[row.tune] if row.plan_left else banned), used

    def _rhymes(self, classes: frozenset) -> torch.Tensor:
        """(V,) bool: the characters of any of these 词林正韵 classes."""
        if classes not in self._class_unions:
            self._class_unions[classes] = torch.stack([self.class_masks[k] for k in classes]).any(0)
        return self._class_unions[classes]

    def _mask_of(self, row: _TuneRow) -> torch.Tensor:
        allowed = torch.zeros(self.tok.vocab_size, dtype=torch.bool)
        if row.ended:
            allowed[self.tok.eos_id] = True
            return allowed
        for i in row.live:
            t, (kind, rhyme) = self.templates[i], self._expects(i, row)
            if kind != "char" and row.kw is not None and (row.kw.open or kind == "end" and row.kw.pending):
                continue  # no line ends inside a keyword, no 词 before its keywords
            if kind == "mark":
                allowed[self.tok.stoi[rhyme]] = True
                continue
            if kind == "end":
                allowed[self.tok.eos_id] = True
                continue
            mask = self.hanzi
            if self.acrostic and row.k in t.starts:
                mask = torch.zeros_like(mask)
                mask[self.tok.stoi[self.acrostic[t.starts.index(row.k)]]] = True
            tone = t.tones[row.k]
            if self.meter and tone != EITHER:
                mask = mask & self.tone_masks[tone]
            if rhyme is not None:
                segment, shared = rhyme
                mask = mask & self._rhymes(shared if shared is not None else self.open[t.variant.segments[segment]])
            if row.kw is not None and (words := self.kw.mask(i, row.k, row.kw, row.live)) is not None:
                mask = mask & words
            allowed |= mask
        return allowed

    def __call__(self, idx: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """idx: (B, T) int64, the sequence so far; logits: (B, V) float, written into (in place: the
        engine hands each step's own) → the same logits, forbidden tokens -inf."""
        if not self.rows:
            tunes = self.row_tunes * idx.size(0) if len(self.row_tunes) == 1 else self.row_tunes
            words = self.row_keywords * len(tunes) if len(self.row_keywords) == 1 else self.row_keywords
            self.rows = [self._start(t, w) for t, w in zip(tunes, words or [()] * len(tunes))]
        for row, ids in zip(self.rows, poem_tokens(idx, self.consumed, self.plan)):
            for i in ids:
                if i in (self.tok.bos_id, self.tok.eos_id):
                    continue
                if self.tok.is_plan(i):
                    row.plan_left = max(0, row.plan_left - 1)
                    if self.rhyme and i in self.class_of_id:
                        self._plan_rhyme(row, self.class_of_id[i])
                    continue
                row.plan_left = 0
                if reason := self._advance(row, self.tok.itos[i]):
                    raise ValueError(f"a generated token broke the tune: {reason}")  # a bug if seen
        self.consumed = idx.size(1)
        masks, used = zip(*map(self._banned, self.rows))
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
