"""What the network is told about a poem besides its tokens: one module beside the GPT
(`model/gpt.py`), which adds its rows to the token embeddings and, with `phon_output`, to the
output vectors. docs/rhyme.md says why and how each was measured.

- phonology (`GPTConfig.phonology`; Deng et al. 2020, Jiuge, Yi et al. 2019): learned
  embeddings of each token's 平水韵 level-tone groups (a polyphonic character: the mean over its
  readings) and of its tone class. `phon_output`: the same embeddings are added to each token's
  output vector, so a hidden state that points at a rhyme group raises every character of it.
- structure (`GPTConfig.structure`; SongNet, Li et al. 2020): embeddings of where the next
  token sits in its poem, its line, the countdown to the line's end and its slot type, read from
  the text so far (`structure_ids`).
- `rhyme_loss_weight` > 0: an auxiliary head predicting the rhyme group of every target that
  ends a line (a multi-task loss, never in `nats`).

The per-vocabulary tables (each token's group ids, tone id and token kind) come from the data
layer (`data/features.py`, which also defines the ids and their counts) through `set_phonology`
and `set_token_kinds`, called by `model.loading.build_gpt`; they are buffers, saved in the
checkpoint, so the network reads no rhyme table.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from data.features import GROUPS, PAD, READINGS, TOKEN_KINDS, TONES

BOS, EOS, MARK = (TOKEN_KINDS.index(k) for k in ("bos", "eos", "line_end"))
SLOTS = ("unknown", "first-line character", "character", "line-end mark", "rhyme slot")
"""Slot types of `PoemInputs.structure_ids`, by id."""


def uses_poem_inputs(cfg) -> bool:
    """Whether a GPTConfig asks for any poem input (then the GPT has a `PoemInputs`)."""
    return cfg.phonology or cfg.structure or cfg.rhyme_loss_weight > 0 or cfg.phon_output


class PoemInputs(nn.Module):
    """cfg: GPTConfig (n_embd, phonology, phon_output, structure, struct_lines, struct_countdown,
    rhyme_loss_weight, rhyme_loss_at). raises ValueError for rhyme_loss_weight > 0 or phon_output
    without phonology, and for another rhyme_loss_at, or rhyme_slots without structure."""

    def __init__(self, cfg):
        super().__init__()
        if (cfg.rhyme_loss_weight > 0 or cfg.phon_output) and not cfg.phonology:
            raise ValueError("rhyme_loss_weight > 0 and phon_output need phonology=True (the tokens' rhyme groups)")
        if cfg.rhyme_loss_at not in ("line_ends", "rhyme_slots"):
            raise ValueError(f"rhyme_loss_at={cfg.rhyme_loss_at!r} is not one of ('line_ends', 'rhyme_slots')")
        if cfg.rhyme_loss_weight > 0 and cfg.rhyme_loss_at == "rhyme_slots" and not cfg.structure:
            raise ValueError("rhyme_loss_at=rhyme_slots needs structure=True (which lines are even)")
        self.cfg = cfg
        if cfg.phonology:  # ids per token id, from set_phonology; saved in checkpoints
            self.wge = nn.Embedding(GROUPS, cfg.n_embd)  # rhyme-group embedding
            self.wtone = nn.Embedding(len(TONES), cfg.n_embd)  # tone-class embedding
            self.register_buffer("phon_group_ids", torch.zeros(cfg.vocab_size, READINGS, dtype=torch.long))
            self.register_buffer("phon_tone_ids", torch.zeros(cfg.vocab_size, dtype=torch.long))
            self.rhyme_head = nn.Linear(cfg.n_embd, GROUPS, bias=False) if cfg.rhyme_loss_weight > 0 else None
        if cfg.structure:  # line index, countdown, slot type of the next token
            self.wline = nn.Embedding(cfg.struct_lines, cfg.n_embd)
            self.wcount = nn.Embedding(cfg.struct_countdown, cfg.n_embd)
            self.wslot = nn.Embedding(len(SLOTS), cfg.n_embd)
        if cfg.structure or cfg.rhyme_loss_weight > 0:  # TOKEN_KINDS id per token id (set_token_kinds)
            self.register_buffer("token_kind", torch.zeros(cfg.vocab_size, dtype=torch.long))
        if cfg.structure and cfg.struct_recover:  # whether each token id closes a couplet (set_full_stops)
            self.register_buffer("full_stop", torch.zeros(cfg.vocab_size, dtype=torch.bool))

    @torch.no_grad()
    def set_phonology(self, groups: torch.Tensor, tones: torch.Tensor) -> None:
        """The phonology ids of every token id (`data.features.phonology_tables`): groups
        (vocab_size, READINGS) int, group ids in [0, GROUPS), PAD after a token's last reading,
        at least one id per row; tones (vocab_size,) int in [0, len(TONES)).
        raises ValueError if the model has no phonology, or for a wrong shape or an id out of range."""
        V = self.cfg.vocab_size
        if not self.cfg.phonology:
            raise ValueError("this model has no phonology features (phonology=False)")
        for name, t, shape, low, high in (("groups", groups, (V, READINGS), PAD, GROUPS),
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
        `TOKEN_KINDS` ids. raises ValueError if the model has no use for them (neither structure
        nor the rhyme loss), or for a wrong shape or id."""
        if not hasattr(self, "token_kind"):
            raise ValueError("this model uses no token kinds (structure=False, rhyme_loss_weight=0)")
        if tuple(kinds.shape) != (self.cfg.vocab_size,) or kinds.min() < 0 or kinds.max() >= len(TOKEN_KINDS):
            raise ValueError(f"kinds must be ({self.cfg.vocab_size},) ids in [0, {len(TOKEN_KINDS)})")
        self.token_kind.copy_(kinds)

    @torch.no_grad()
    def set_full_stops(self, flags: torch.Tensor) -> None:
        """Which token ids end in a mark that closes a couplet (`data.features.full_stops`): flags
        (vocab_size,) bool. raises ValueError without struct_recover, or for a wrong shape."""
        if not hasattr(self, "full_stop"):
            raise ValueError("this model does not recover structure from marks (struct_recover=False)")
        if tuple(flags.shape) != (self.cfg.vocab_size,):
            raise ValueError(f"flags must be ({self.cfg.vocab_size},), got {tuple(flags.shape)}")
        self.full_stop.copy_(flags.bool())

    def forward(self, x: torch.Tensor, idx: torch.Tensor, history: torch.Tensor | None = None) -> torch.Tensor:
        """The token embeddings x (B, T, n_embd) of idx (B, T) int64 with the poem's rows added
        → (B, T, n_embd); history (B, H) int64: the text's tokens before idx (None: idx starts it)."""
        if self.cfg.phonology:
            x = x + self.output_rows(idx)
        if self.cfg.structure:
            s = self.structure_ids(idx, history)  # (B, T, 3)
            x = x + self.wline(s[..., 0]) + self.wcount(s[..., 1]) + self.wslot(s[..., 2])
        return x

    def output_rows(self, idx: torch.Tensor) -> torch.Tensor:
        """Each token's phonology embedding: idx (..., T) int64 → (..., T, n_embd), the mean group
        embedding over its readings + its tone embedding (also what `phon_output` adds to its
        output vector)."""
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
        every id is 0 (unknown), unless struct_recover: then, before the window's first `<bos>` and
        `<eos>`, the line id stays 0 but the slots are read from the marks: after one mark, slot 1
        (a character of a line of unknown length); after two, the line is as long as the one
        between them (countdown as below), and the next line is even, so its last character a
        rhyme slot, when the last mark is ，or ； rather than a full stop (`full_stop`: 。？！).
        Line index: the line-end marks since `<bos>`, + 1, capped at
        struct_lines - 1. Countdown: the tokens still to come in the line before its mark, + 1
        (1: the mark is next), capped at struct_countdown - 1; a line is as long as the poem's
        first, so in the first line it is 0 (unknown). Slot type: 1 a character of the first
        line, 2 a character, 3 the mark, 4 the last character of an even line (a rhyme slot).
        e.g. after `<bos>床前明月光，疑是地上` the next token (霜) gets line id 2, countdown 2, slot 4.
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
        line_id = torch.where(known, line.clamp(max=self.cfg.struct_lines - 2) + 1, 0)
        count_id = torch.where(has_length, left.clamp(max=self.cfg.struct_countdown - 2) + 1, 0)
        slot = torch.where(left == 0, 3, torch.where((left == 1) & (line % 2 == 1), 4, 2))
        slot = torch.where(has_length, slot, torch.where(known, 1, 0))
        if self.cfg.struct_recover:
            count_id, slot = self._recovered(kind, full, pos, start, count_id, slot)
        return torch.stack([line_id, count_id, slot], dim=-1)[:, -idx.size(1):]  # (B, T, 3)

    def _recovered(self, kind, full, pos, start, count_id, slot):
        """`structure_ids`' countdown and slot ids, (B, N) each, with the positions before the
        text's first `<bos>` and `<eos>` read from the marks (struct_recover)."""
        none = torch.full_like(pos, -1)
        lost = (start < 0) & (torch.where(kind == EOS, pos, none).cummax(1).values < 0)  # (B, N)
        last = torch.where(kind == MARK, pos, none).cummax(1).values  # (B, N) the last mark at or before
        prev = torch.where(last >= 1, last.gather(1, (last - 1).clamp(min=0)), none)  # the mark before it
        even = ~self.full_stop[full].gather(1, last.clamp(min=0))  # the next line is a couplet's second
        has_length = lost & (prev >= 0)
        left = (last - prev - 1 - (pos - last)).clamp(min=0)  # tokens before the next mark
        rec_slot = torch.where(left == 0, 3, torch.where((left == 1) & even, 4, 2))
        rec_slot = torch.where(has_length, rec_slot, torch.where(last >= 0, 1, 0))
        rec_count = torch.where(has_length, left.clamp(max=self.cfg.struct_countdown - 2) + 1, 0)
        return torch.where(lost, rec_count, count_id), torch.where(lost, rec_slot, slot)

    def rhyme_loss(self, x: torch.Tensor, targets: torch.Tensor, idx: torch.Tensor | None = None) -> torch.Tensor:
        """rhyme_loss_weight × the mean cross-entropy (nats) of `rhyme_head` predicting the first
        group id of each line-final target, 0 if there is none: x (B, T, n_embd) the final hidden
        states, targets (B, T) int64, -1 not scored; idx (B, T) the inputs (for rhyme_slots).
        Line-final: with rhyme_loss_at=line_ends a target whose next target is a line-end mark; with
        rhyme_slots a target in slot type 4 (`structure_ids`: an even line's last character, where
        the poem's `<bos>` is in sight), the slots whose rhyme the poem's rules fix."""
        t = targets.clamp(min=0)  # (B, T)
        if self.cfg.rhyme_loss_at == "rhyme_slots":
            final = (targets >= 0) & (self.structure_ids(idx)[..., 2] == SLOTS.index("rhyme slot"))  # (B, T)
        else:
            final = (targets[:, :-1] >= 0) & (self.token_kind[t[:, 1:]] == MARK)  # (B, T-1): target t ends a line
            x, t = x[:, :-1], t[:, :-1]
        if not final.any():
            return x.new_zeros(())
        logits = self.rhyme_head(x[final]).float()  # (N, GROUPS)
        return self.cfg.rhyme_loss_weight * F.cross_entropy(logits, self.phon_group_ids[t[final], 0])
