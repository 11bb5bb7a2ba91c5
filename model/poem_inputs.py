"""What the network is told about a poem besides its tokens (`GPTConfig.poem_inputs`): one
module beside the GPT (`model/gpt.py`), which adds its rows to the token embeddings and to the
output vectors. docs/rhyme.md says why and how each was measured; docs/experiments.md the parts
measured apart.

- phonology (Deng et al. 2020, Jiuge, Yi et al. 2019): learned embeddings of each token's 平水韵
  level-tone groups (a polyphonic character: the mean over its readings) and of its tone class,
  added to its input embedding and to its output vector, so a hidden state that points at a
  rhyme group raises every character of it.
- structure (SongNet, Li et al. 2020): embeddings of where the next token sits in its poem, its
  line, the countdown to the line's end and its slot type, read from the text so far
  (`structure_ids`), also in a window that starts mid-poem; in a 词 planned by its tune's token
  (`experiment=ci`), read from the tune's template instead, as SongNet gives its model the
  template.
- `rhyme_loss_weight` > 0: an auxiliary head predicting the rhyme group of every target in a
  rhyme slot (a multi-task loss, never in `nats`).

The per-vocabulary tables (each token's group ids, tone id and token kind) come from the data
layer (`data/features.py`, which also defines the ids and their counts) through `set_phonology`
and `set_token_kinds`, called by `model.loading.build_gpt`; they are buffers, saved in the
checkpoint, so the network reads no rhyme table.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from data.features import GROUPS, PAD, READINGS, TEMPLATE_MARKS, TOKEN_KINDS, TONES, TUNE_LINES

BOS, EOS, MARK = (TOKEN_KINDS.index(k) for k in ("bos", "eos", "line_end"))
SLOTS = ("unknown", "first-line character", "character", "line-end mark", "rhyme slot", "仄 rhyme slot")
"""Slot types of `PoemInputs.structure_ids`, by id; the last only in a 词 whose template rhymes
there in 仄 (a model with tune tokens: `GPTConfig.rhyme_groups` > GROUPS)."""
LINES = COUNTDOWN = 10
"""Line-index ids (0 unknown, then lines 0, 1, …, the last shared by the rest) and countdown ids
(0 unknown, then 0, 1, … tokens left in the line, capped)."""


class PoemInputs(nn.Module):
    """cfg: GPTConfig (vocab_size, n_embd, rhyme_loss_weight, rhyme_groups). Its tables (`set_phonology`,
    `set_token_kinds`, `set_full_stops`) are buffers, filled by `model.loading.build_gpt`."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.wge = nn.Embedding(cfg.rhyme_groups, cfg.n_embd)  # rhyme-group embedding
        self.wtone = nn.Embedding(len(TONES), cfg.n_embd)  # tone-class embedding
        self.register_buffer("phon_group_ids", torch.zeros(cfg.vocab_size, READINGS, dtype=torch.long))
        self.register_buffer("phon_tone_ids", torch.zeros(cfg.vocab_size, dtype=torch.long))
        self.rhyme_head = nn.Linear(cfg.n_embd, cfg.rhyme_groups, bias=False) if cfg.rhyme_loss_weight > 0 else None
        self.wline = nn.Embedding(LINES, cfg.n_embd)  # line index, countdown, slot type of the next token
        self.wcount = nn.Embedding(COUNTDOWN, cfg.n_embd)
        self.wslot = nn.Embedding(len(SLOTS) - (cfg.rhyme_groups == GROUPS), cfg.n_embd)
        self.register_buffer("token_kind", torch.zeros(cfg.vocab_size, dtype=torch.long))  # TOKEN_KINDS ids
        self.register_buffer("full_stop", torch.zeros(cfg.vocab_size, dtype=torch.bool))  # closes a couplet
        # a tune token's template (`set_tunes`): data, not weights, so not in the checkpoint
        self.register_buffer("tune_lengths", torch.zeros(cfg.vocab_size, TUNE_LINES, dtype=torch.long),
                             persistent=False)
        self.register_buffer("tune_rhymes", torch.zeros(cfg.vocab_size, TUNE_LINES, dtype=torch.long),
                             persistent=False)
        self.register_buffer("tune_marks", torch.zeros(cfg.vocab_size, TUNE_LINES, dtype=torch.long),
                             persistent=False)

    @torch.no_grad()
    def set_phonology(self, groups: torch.Tensor, tones: torch.Tensor) -> None:
        """The phonology ids of every token id (`data.features.phonology_tables`): groups
        (vocab_size, READINGS) int, group ids in [0, rhyme_groups), PAD after a token's last reading,
        at least one id per row; tones (vocab_size,) int in [0, len(TONES)).
        raises ValueError for a wrong shape or an id out of range."""
        V = self.cfg.vocab_size
        for name, t, shape, low, high in (("groups", groups, (V, READINGS), PAD, self.cfg.rhyme_groups),
                                          ("tones", tones, (V,), 0, len(TONES))):
            if tuple(t.shape) != shape:
                raise ValueError(f"{name} must be {shape}, got {tuple(t.shape)}")
            if t.numel() and (t.max() >= high or t.min() < low):
                raise ValueError(f"{name} ids must lie in [0, {high})")
        if (groups[:, 0] < 0).any():
            raise ValueError("every token needs a first group id (0: none)")
        self.phon_group_ids.copy_(groups)
        self.phon_tone_ids.copy_(tones)

    @torch.no_grad()
    def set_token_kinds(self, kinds: torch.Tensor) -> None:
        """What kind each token id is (`data.features.token_kinds`): kinds (vocab_size,) int,
        `TOKEN_KINDS` ids. raises ValueError for a wrong shape or id."""
        if tuple(kinds.shape) != (self.cfg.vocab_size,) or kinds.min() < 0 or kinds.max() >= len(TOKEN_KINDS):
            raise ValueError(f"kinds must be ({self.cfg.vocab_size},) ids in [0, {len(TOKEN_KINDS)})")
        self.token_kind.copy_(kinds)

    @torch.no_grad()
    def set_full_stops(self, flags: torch.Tensor) -> None:
        """Which token ids end in a mark that closes a couplet (`data.features.full_stops`): flags
        (vocab_size,) bool. raises ValueError for a wrong shape."""
        if tuple(flags.shape) != (self.cfg.vocab_size,):
            raise ValueError(f"flags must be ({self.cfg.vocab_size},), got {tuple(flags.shape)}")
        self.full_stop.copy_(flags.bool())

    @torch.no_grad()
    def set_tunes(self, lengths: torch.Tensor, rhymes: torch.Tensor, marks: torch.Tensor) -> None:
        """The template of every tune token (`data.features.tune_tables`): lengths (vocab_size,
        TUNE_LINES) int, each line's characters (0: no line, and every row of a token that is no
        tune); rhymes (vocab_size, TUNE_LINES) int, the tone its last character rhymes in (1 平,
        2 仄, 0 none); marks
        (vocab_size, TUNE_LINES) int, its closing mark's id, 1 … len(TEMPLATE_MARKS) (0: no line).
        raises ValueError for a wrong shape or a mark id out of range."""
        shape = (self.cfg.vocab_size, TUNE_LINES)
        if any(tuple(t.shape) != shape for t in (lengths, rhymes, marks)):
            raise ValueError(f"lengths, rhymes and marks must be {shape}, got {tuple(lengths.shape)}, "
                             f"{tuple(rhymes.shape)}, {tuple(marks.shape)}")
        if marks.numel() and (marks.min() < 0 or marks.max() > len(TEMPLATE_MARKS)):
            raise ValueError(f"mark ids must lie in [0, {len(TEMPLATE_MARKS)}]")
        self.tune_lengths.copy_(lengths)
        self.tune_rhymes.copy_(rhymes)
        self.tune_marks.copy_(marks)

    def forward(self, x: torch.Tensor, idx: torch.Tensor, history: torch.Tensor | None = None) -> torch.Tensor:
        """The token embeddings x (B, T, n_embd) of idx (B, T) int64 with the poem's rows added
        → (B, T, n_embd); history (B, H) int64: the text's tokens before idx (None: idx starts it)."""
        s = self.structure_ids(idx, history)  # (B, T, 3)
        return x + self.output_rows(idx) + self.wline(s[..., 0]) + self.wcount(s[..., 1]) + self.wslot(s[..., 2])

    def output_rows(self, idx: torch.Tensor) -> torch.Tensor:
        """Each token's phonology embedding: idx (..., T) int64 → (..., T, n_embd), the mean group
        embedding over its readings + its tone embedding (also what is added to its output vector)."""
        g = self.phon_group_ids[idx]  # (..., T, READINGS), PAD after the last reading
        keep = (g != PAD).unsqueeze(-1).to(self.wge.weight.dtype)  # (..., T, READINGS, 1)
        groups = (self.wge(g.clamp(min=0)) * keep).sum(-2) / keep.sum(-2)  # (..., T, n_embd)
        return groups + self.wtone(self.phon_tone_ids[idx])  # (..., T, n_embd)

    def structure_ids(self, idx: torch.Tensor, history: torch.Tensor | None = None) -> torch.Tensor:
        """Where the token after each position sits in its poem, from the text up to it (SongNet,
        Li et al. 2020, with the countdown to the line's end): idx (B, T) int64, history (B, H)
        the tokens before idx (none: idx starts the text) → (B, T, 3) int64: line-index id,
        countdown id, slot type (`SLOTS`).

        A poem starts at `<bos>`; before one (a window that starts mid-poem) and after `<eos>`
        the line id is 0 (unknown), and the countdown and slots are read from the marks: after one mark, slot 1
        (a character of a line of unknown length); after two, the line is as long as the one
        between them (countdown as below), and the next line is even, so its last character a
        rhyme slot, when the last mark is ，or ； rather than a full stop (`full_stop`: 。？！).
        Line index: the line-end marks since `<bos>`, + 1, capped at
        LINES - 1. Countdown: the tokens still to come in the line before its mark, + 1
        (1: the mark is next), capped at COUNTDOWN - 1; a line is as long as the poem's
        first, so in the first line it is 0 (unknown). Slot type: 1 a character of the first
        line, 2 a character, 3 the mark, 4 the last character of an even line (a rhyme slot).
        e.g. after `<bos>床前明月光，疑是地上` the next token (霜) gets line id 2, countdown 2, slot 4.
        In a 词 whose plan is a tune token (`set_tunes`) every line the template has is read from
        the template: its countdown (the line's length; where the mark is next, the countdown id
        names the mark instead, 1 + its index in TEMPLATE_MARKS: ，1, 。2, 、3, as SongNet's
        template symbols name the punctuation), its slot (a rhyme slot where it rhymes, 5 where in
        仄), and its line id, which counts the lines left instead (1: the last line; a long tune's end is then
        in sight where a line index would be capped); past its last line all three are 0, as
        after `<eos>`.
        """
        full = idx if history is None else torch.cat([history, idx], dim=1)  # (B, N)
        kind = self.token_kind[full]  # (B, N)
        pos = torch.arange(full.size(1), device=idx.device).expand_as(full)  # (B, N)
        none = torch.full_like(pos, -1)
        start = torch.where(kind == BOS, pos, none).cummax(1).values  # (B, N) the last <bos> at or before
        known = (start >= 0) & (torch.where(kind == EOS, pos, none).cummax(1).values < start)  # no <eos> since
        marks = (kind == MARK).long().cumsum(1)  # (B, N) marks up to here
        line = marks - marks.gather(1, start.clamp(min=0))  # (B, N) the next token's line (0-based)
        anchor = torch.maximum(torch.where(kind == MARK, pos, none).cummax(1).values, start)
        offset = pos - anchor  # tokens already in the next token's line
        first_end = torch.where((kind == MARK) & (line == 1), pos, none).cummax(1).values  # the first line's mark
        length = first_end - start - 1  # the first line's length, where first_end > start
        has_length = known & (first_end > start)
        left = (length - offset).clamp(min=0)  # tokens before the mark; 0: the mark is next
        line_id = torch.where(known, line.clamp(max=LINES - 2) + 1, 0)
        count_id = torch.where(has_length, left.clamp(max=COUNTDOWN - 2) + 1, 0)
        slot = torch.where(left == 0, 3, torch.where((left == 1) & (line % 2 == 1), 4, 2))
        slot = torch.where(has_length, slot, torch.where(known, 1, 0))
        count_id, slot = self._recovered(kind, full, pos, start, count_id, slot)
        ids = self._templated(full, pos, start, known, line, offset, line_id, count_id, slot)
        return torch.stack(ids, dim=-1)[:, -idx.size(1):]  # (B, T, 3)

    def _templated(self, full, pos, start, known, line, offset, line_id, count_id, slot):
        """`structure_ids`' line, countdown and slot ids, (B, N) each, read from the template of a
        tune token that is the poem's plan (right before its last plan token, `start`)."""
        is_tune = self.tune_lengths[full, 0] > 0  # (B, N)
        tune_at = torch.where(is_tune, pos, torch.full_like(pos, -1)).cummax(1).values  # the last tune token
        row = line.clamp(max=TUNE_LINES - 1)  # (B, N)
        tune = full.gather(1, tune_at.clamp(min=0))  # (B, N) its id
        length = self.tune_lengths[tune, row]  # (B, N) the line's characters in the template, 0: none
        planned = known & (tune_at >= 0) & (tune_at == start - 1)  # (B, N) inside a 词 planned by its tune
        left = (length - offset).clamp(min=0)  # characters before the line's mark
        rhyme = self.tune_rhymes[tune, row]  # (B, N) 1 平, 2 仄, 0 none
        t_slot = torch.where(left == 0, 3, torch.where((left == 1) & (rhyme > 0), 3 + rhyme, 2))
        lines_left = (self.tune_lengths[tune] > 0).sum(-1) - line  # (B, N) ≥ 1 inside the template
        inside = length > 0  # past the template's last line: every id 0, as after <eos>
        t_count = torch.where(left == 0, self.tune_marks[tune, row], left.clamp(max=COUNTDOWN - 2) + 1)  # the mark's id
        return (torch.where(planned, torch.where(inside, lines_left.clamp(max=LINES - 2), 0), line_id),
                torch.where(planned, torch.where(inside, t_count, 0), count_id),
                torch.where(planned, torch.where(inside, t_slot, 0), slot))

    def _recovered(self, kind, full, pos, start, count_id, slot):
        """`structure_ids`' countdown and slot ids, (B, N) each, with the positions before the
        text's first `<bos>` and `<eos>` read from the marks."""
        none = torch.full_like(pos, -1)
        lost = (start < 0) & (torch.where(kind == EOS, pos, none).cummax(1).values < 0)  # (B, N)
        last = torch.where(kind == MARK, pos, none).cummax(1).values  # (B, N) the last mark at or before
        prev = torch.where(last >= 1, last.gather(1, (last - 1).clamp(min=0)), none)  # the mark before it
        even = ~self.full_stop[full].gather(1, last.clamp(min=0))  # the next line is a couplet's second
        has_length = lost & (prev >= 0)
        left = (last - prev - 1 - (pos - last)).clamp(min=0)  # tokens before the next mark
        rec_slot = torch.where(left == 0, 3, torch.where((left == 1) & even, 4, 2))
        rec_slot = torch.where(has_length, rec_slot, torch.where(last >= 0, 1, 0))
        rec_count = torch.where(has_length, left.clamp(max=COUNTDOWN - 2) + 1, 0)
        return torch.where(lost, rec_count, count_id), torch.where(lost, rec_slot, slot)

    def rhyme_loss(self, x: torch.Tensor, targets: torch.Tensor, idx: torch.Tensor | None = None) -> torch.Tensor:
        """rhyme_loss_weight × the mean cross-entropy (nats) of `rhyme_head` predicting the first
        group id of each target in a rhyme slot, 0 if there is none: x (B, T, n_embd) the final
        hidden states, targets (B, T) int64, -1 not scored; idx (B, T) the inputs. A rhyme slot:
        slot type 4 or 5 (`structure_ids`: an even line's last character, a 词's 平 or 仄 rhyme), whose
        rhyme the poem's rules fix."""
        t = targets.clamp(min=0)  # (B, T)
        final = (targets >= 0) & (self.structure_ids(idx)[..., 2] >= SLOTS.index("rhyme slot"))  # (B, T)
        if not final.any():
            return x.new_zeros(())
        logits = self.rhyme_head(x[final]).float()  # (N, rhyme_groups)
        return self.cfg.rhyme_loss_weight * F.cross_entropy(logits, self.phon_group_ids[t[final], 0])
