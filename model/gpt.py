"""A GPT language model (decoder-only Transformer), in the style of nanoGPT's model.py.

Token embeddings, `n_layer` pre-LayerNorm blocks (causal self-attention, then an MLP, each
added to the residual stream), a final LayerNorm and an output layer. Initialisation as GPT-2
(Radford et al. 2019): N(0, 0.02), the residual projections scaled by 1/√(2·n_layer).

The default recipe (conf/model/tiny.yaml, chosen by fixed-time comparisons) and the
alternatives each option names:
- positions: `pos_emb='rope'`, rotary embeddings in the attention (Su et al. 2021); or
  `learned`, a table of block_size vectors added to the token embeddings (nanoGPT's).
- MLP: `mlp_act='relu2'`, Linear(n_embd → 4·n_embd), ReLU squared (So et al. 2021, "Primer"),
  Linear back; or `gelu` (GPT-2's).
- `zero_init_proj=True`: the residual output projections start at 0, so each block starts as
  the identity; False keeps GPT-2's scaled initialisation.
- output: `head='adaptive'`, an adaptive softmax (Grave et al. 2017, "Efficient softmax
  approximation for GPUs"): the `head_cutoffs[0]` most frequent tokens get a full-width output,
  rarer ones sit in tail clusters of width n_embd / head_div_value^k, so a step costs a fraction
  of a full softmax over every character; or `tied`, a linear layer tied to the token embedding
  (nanoGPT's). Which head a vocabulary gets is decided once, before the model is built, by
  `head_for_vocabulary` (a vocabulary below the first cutoff gets the tied head, said in the log).
- `phonology`: what a token sounds like enters with it (Deng et al. 2020; Jiuge, Yi et al.
  2019): learned embeddings of its rhyme group(s) (a polyphonic character: the mean over its
  readings) and of its tone class are added to its token embedding. The per-vocabulary ids
  come from the data layer (`data/phonology.py`) through `set_phonology` and are buffers, saved
  in the checkpoint. `phon_output`: the output layer adds each token's phonology embedding to
  its output vector (tied to the input's; the adaptive head: the head cluster's tokens), so
  a hidden state that points at a rhyme group raises every character of it.
  `rhyme_loss_weight` > 0 adds an auxiliary head predicting the rhyme group of every target
  that ends a line (the next target is a line-end mark): a multi-task loss.
- `qk_norm`: RMS-normalise q and k per head; `bias`: biases in Linear and LayerNorm layers;
  `attention`: the backend (`model/attention.py`: naive | sdpa | flash), the same function.

Named methods, one return type each: `forward` → logits, `loss` → mean cross-entropy, `nats`
→ per-token cross-entropy, `attention_maps` → every layer's weights. Generation lives in the
inference engine (`model/engine.py`), which feeds `forward` with a KV cache (`new_cache`).
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.attention import CausalSelfAttention, KVCache

log = logging.getLogger(__name__)


@dataclass
class GPTConfig:
    """Model shape and options; `vocab_size` comes from the tokenizer, the rest from conf/model."""
    vocab_size: int
    block_size: int = 64  # longest context T
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0  # on attention weights, residual branches and embeddings
    bias: bool = False  # bias in Linear and LayerNorm layers
    attention: str = "sdpa"  # naive | sdpa | flash
    head: str = "tied"  # tied | adaptive
    head_cutoffs: tuple[int, ...] = (2000, 4000)  # adaptive: frequency ranks where the tail clusters start
    head_div_value: float = 4.0  # adaptive: each tail cluster is this many times narrower than the last
    pos_emb: str = "learned"  # learned (a table of block_size vectors) | rope (rotary, in the attention)
    qk_norm: bool = False  # RMS-normalise q and k per head before the scores
    mlp_act: str = "gelu"  # gelu | relu2 (ReLU squared: So et al. 2021, "Primer")
    zero_init_proj: bool = False  # residual output projections start at 0: each block starts as the identity
    phonology: bool = False  # add learned embeddings of each token's rhyme groups and tone (set_phonology)
    phon_groups: int = 31  # phonology: rhyme-group ids (0 none, then the 30 level-tone groups)
    phon_tones: int = 4  # phonology: tone ids (none, level, oblique, both)
    phon_readings: int = 4  # phonology: group ids per token (a polyphonic character's readings, padded with -1)
    rhyme_loss_weight: float = 0.0  # phonology: weight of the auxiliary loss on the rhyme group of line-final targets
    phon_output: bool = False  # phonology: the output layer scores each token's phonology embedding too
    structure: bool = False  # add embeddings of where the next token sits in the poem (structure_ids)
    struct_lines: int = 10  # structure: line-index ids (0 unknown, then lines 0, 1, …, the last shared by the rest)
    struct_countdown: int = 10  # structure: countdown ids (0 unknown, then 0, 1, … tokens left in the line, capped)

    def __post_init__(self):
        self.head_cutoffs = tuple(self.head_cutoffs)


MODEL_FIELDS = tuple(f.name for f in fields(GPTConfig) if f.name not in ("vocab_size", "attention"))
"""The fields conf/model sets (the model's shape and options); vocab_size comes from the tokenizer,
attention from conf/attention."""


def head_for_vocabulary(model: dict, vocab_size: int) -> dict:
    """The model fields `model` (GPTConfig's, without vocab_size) with the output head decided for
    a vocabulary of vocab_size ids, said in the log when it differs from what was asked: adaptive
    cutoffs at or past the vocabulary are dropped, and a vocabulary below the first cutoff (e.g. a
    small BPE vocabulary) gets the tied head, since there is no tail to save on. Idempotent."""
    if model.get("head") != "adaptive":
        return model
    asked = tuple(model.get("head_cutoffs", GPTConfig.head_cutoffs))
    cutoffs = tuple(c for c in asked if c < vocab_size)
    if cutoffs == asked:
        return model
    if not cutoffs:
        log.info(f"model.head=tied: the vocabulary of {vocab_size} tokens is below the adaptive head's first cutoff "
                 f"{asked[0]}, so there is no tail cluster to save on")
        return {**model, "head": "tied", "head_cutoffs": []}
    log.info(f"model.head_cutoffs={list(cutoffs)}: the cutoffs {[c for c in asked if c >= vocab_size]} are not below "
             f"the vocabulary of {vocab_size} tokens")
    return {**model, "head_cutoffs": list(cutoffs)}


class MLP(nn.Module):
    """Position-wise feed-forward network: Linear(n_embd → 4·n_embd), GELU or ReLU², Linear back, dropout."""
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)
        self.relu2 = cfg.mlp_act == "relu2"

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, n_embd) → (B, T, n_embd)
        h = self.c_fc(x)  # (B, T, 4·n_embd)
        h = F.relu(h).square() if self.relu2 else F.gelu(h)
        return self.dropout(self.c_proj(h))


class Block(nn.Module):
    """Pre-LayerNorm Transformer block: x + attn(ln_1(x)), then + mlp(ln_2(x))."""
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg.n_embd, cfg.n_head, cfg.block_size, cfg.dropout, cfg.attention, cfg.bias,
                                        cfg.qk_norm, cfg.pos_emb == "rope")
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), cache)  # (B, T, n_embd)
        return x + self.mlp(self.ln_2(x))  # (B, T, n_embd)


class RowsPlus(nn.Linear):
    """A bias-free Linear layer whose weight's first rows get `extra()` ((rows, in_features))
    added at every call: the adaptive head cluster with phonology (`GPTConfig.phon_output`)."""
    def __init__(self, in_features: int, out_features: int, extra):
        super().__init__(in_features, out_features, bias=False)
        self.extra = extra  # a bound method of the GPT: not a submodule

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = self.extra()  # (rows, in_features)
        return F.linear(x, torch.cat([self.weight[: e.size(0)] + e, self.weight[e.size(0):]]))


class Cache(list):
    """The KV cache of a GPT: one `KVCache` per layer, and `ids` (B, N) int64, the text's tokens
    so far (None without structure features), which `GPT.structure_ids` reads."""
    ids: torch.Tensor | None = None


HEADS = ("tied", "adaptive")
SLOTS = ("unknown", "first-line character", "character", "line-end mark", "rhyme slot")
"""Slot types of `GPT.structure_ids`, by id."""
POS_EMBS = ("learned", "rope")
MLP_ACTS = ("gelu", "relu2")


class GPT(nn.Module):
    """cfg: GPTConfig. raises ValueError for an unknown attention backend, head, pos_emb or mlp_act,
    n_embd % n_head != 0, or adaptive cutoffs that are not positive, increasing and below vocab_size."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        for name, value, allowed in (("head", cfg.head, HEADS), ("pos_emb", cfg.pos_emb, POS_EMBS),
                                     ("mlp_act", cfg.mlp_act, MLP_ACTS)):
            if value not in allowed:
                raise ValueError(f"unknown {name} {value!r}; choose one of {', '.join(allowed)}")
        cutoffs = list(cfg.head_cutoffs)
        if cfg.head == "adaptive" and (not cutoffs or cutoffs != sorted(set(cutoffs)) or cutoffs[0] <= 0):
            raise ValueError(f"head_cutoffs {cutoffs} must be positive and strictly increasing")
        if cfg.head == "adaptive" and cutoffs[-1] >= cfg.vocab_size:
            raise ValueError(f"head_cutoffs {cutoffs} must be below vocab_size {cfg.vocab_size}; decide the head "
                             "for the vocabulary first (model.gpt.head_for_vocabulary)")
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)  # token embedding
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd) if cfg.pos_emb == "learned" else None  # positions
        if cfg.phonology:  # ids per token id, from set_phonology; saved in checkpoints
            self.wge = nn.Embedding(cfg.phon_groups, cfg.n_embd)  # rhyme-group embedding
            self.wtone = nn.Embedding(cfg.phon_tones, cfg.n_embd)  # tone-class embedding
            self.register_buffer("phon_group_ids", torch.zeros(cfg.vocab_size, cfg.phon_readings, dtype=torch.long))
            self.register_buffer("phon_tone_ids", torch.zeros(cfg.vocab_size, dtype=torch.long))
            self.rhyme_head = nn.Linear(cfg.n_embd, cfg.phon_groups, bias=False) if cfg.rhyme_loss_weight > 0 else None
        elif cfg.rhyme_loss_weight > 0 or cfg.phon_output:
            raise ValueError("rhyme_loss_weight > 0 and phon_output need phonology=True (the tokens' rhyme groups)")
        if cfg.structure:  # line index, countdown, slot type of the next token
            self.wline = nn.Embedding(cfg.struct_lines, cfg.n_embd)
            self.wcount = nn.Embedding(cfg.struct_countdown, cfg.n_embd)
            self.wslot = nn.Embedding(len(SLOTS), cfg.n_embd)
        if cfg.structure or cfg.rhyme_loss_weight > 0:  # TOKEN_KINDS id per token id (set_token_kinds)
            self.register_buffer("token_kind", torch.zeros(cfg.vocab_size, dtype=torch.long))
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        if cfg.head == "tied":
            self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
            self.lm_head.weight = self.wte.weight  # weight tying (Press & Wolf 2017)
        else:  # clusters by frequency rank; id_rank maps a token id to its rank (set_token_counts)
            self.lm_head = nn.AdaptiveLogSoftmaxWithLoss(cfg.n_embd, cfg.vocab_size, cutoffs, cfg.head_div_value)
            if cfg.phon_output:  # the head cluster's rows (its most frequent tokens) get their phonology added
                self.lm_head.head = RowsPlus(cfg.n_embd, self.lm_head.head_size, self._head_phonology)
            self.register_buffer("id_rank", torch.arange(cfg.vocab_size))  # (vocab_size,), saved in checkpoints
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # residual projections, GPT-2 §2.3
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))
                if cfg.zero_init_proj:
                    nn.init.zeros_(p)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    @torch.no_grad()
    def set_token_counts(self, counts: torch.Tensor) -> None:
        """Order the adaptive softmax's clusters by token frequency: counts (vocab_size,) int, how
        often each id occurs in the training data (ties keep id order). No-op for the tied head.
        raises ValueError if counts has the wrong shape."""
        if self.cfg.head != "adaptive":
            return
        if counts.shape != (self.cfg.vocab_size,):
            raise ValueError(f"counts must be ({self.cfg.vocab_size},), got {tuple(counts.shape)}")
        order = torch.sort(-counts.to(torch.int64), stable=True).indices  # (vocab_size,) ids, most frequent first
        self.id_rank[order] = torch.arange(self.cfg.vocab_size, device=self.id_rank.device)

    @torch.no_grad()
    def set_phonology(self, groups: torch.Tensor, tones: torch.Tensor) -> None:
        """The phonology ids of every token id (`data.features.phonology_tables`): groups
        (vocab_size, phon_readings) int, group ids in [0, phon_groups), -1 padding after a token's
        last reading, at least one id per row; tones (vocab_size,) int in [0, phon_tones).
        raises ValueError if the model has no phonology, or for a wrong shape or an id out of range."""
        c = self.cfg
        if not c.phonology:
            raise ValueError("this model has no phonology features (phonology=False)")
        for name, t, shape, high in (("groups", groups, (c.vocab_size, c.phon_readings), c.phon_groups),
                                     ("tones", tones, (c.vocab_size,), c.phon_tones)):
            if tuple(t.shape) != shape:
                raise ValueError(f"{name} must be {shape}, got {tuple(t.shape)}")
            if t.numel() and (t.max() >= high or t.min() < (-1 if name == "groups" else 0)):
                raise ValueError(f"{name} ids must lie in [0, {high})")
        if (groups[:, 0] < 0).any():
            raise ValueError("every token needs a first group id (0: none)")
        self.phon_group_ids.copy_(groups)
        self.phon_tone_ids.copy_(tones)

    @torch.no_grad()
    def set_token_kinds(self, kinds: torch.Tensor) -> None:
        """What kind each token id is (`data.features.token_kinds`): kinds (vocab_size,) int, 0
        other, 1 `<bos>`, 2 `<eos>`, 3 a line-end mark. raises ValueError if the model has no use
        for them (neither structure nor the rhyme loss), or for a wrong shape or id."""
        if not hasattr(self, "token_kind"):
            raise ValueError("this model uses no token kinds (structure=False, rhyme_loss_weight=0)")
        if tuple(kinds.shape) != (self.cfg.vocab_size,) or kinds.min() < 0 or kinds.max() > 3:
            raise ValueError(f"kinds must be ({self.cfg.vocab_size},) ids in [0, 4)")
        self.token_kind.copy_(kinds)

    def structure_ids(self, idx: torch.Tensor, history: torch.Tensor | None = None) -> torch.Tensor:
        """Where the token after each position sits in its poem, from the text up to it (SongNet,
        Li et al. 2020, with the countdown to the line's end): idx (B, T) int64, history (B, H)
        the tokens before idx (none: idx starts the text) → (B, T, 3) int64: line-index id,
        countdown id, slot type (`SLOTS`).

        A poem starts at `<bos>`; before one (a window that starts mid-poem) and after `<eos>`
        every id is 0 (unknown). Line index: the line-end marks since `<bos>`, + 1, capped at
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
        start = torch.where(kind == 1, pos, none).cummax(1).values  # (B, N) the last <bos> at or before
        known = (start >= 0) & (torch.where(kind == 2, pos, none).cummax(1).values < start)  # no <eos> since
        marks = (kind == 3).long().cumsum(1)  # (B, N) marks up to here
        at_start = marks.gather(1, start.clamp(min=0))  # marks up to the <bos>
        line = marks - at_start  # (B, N) the next token's line (0-based)
        anchor = torch.maximum(torch.where(kind == 3, pos, none).cummax(1).values, start)
        offset = pos - anchor  # tokens already in the next token's line
        first_end = torch.where((kind == 3) & (line == 1), pos, none).cummax(1).values  # the first line's mark
        length = first_end - start - 1  # the first line's length, where first_end > start
        has_length = known & (first_end > start)
        left = (length - offset).clamp(min=0)  # tokens before the mark; 0: the mark is next
        line_id = torch.where(known, line.clamp(max=self.cfg.struct_lines - 2) + 1, 0)
        count_id = torch.where(has_length, left.clamp(max=self.cfg.struct_countdown - 2) + 1, 0)
        slot = torch.where(left == 0, 3, torch.where((left == 1) & (line % 2 == 1), 4, 2))
        slot = torch.where(has_length, slot, torch.where(known, 1, 0))
        return torch.stack([line_id, count_id, slot], dim=-1)[:, -idx.size(1):]  # (B, T, 3)

    def _phonology(self, idx: torch.Tensor) -> torch.Tensor:
        """idx (B, T) → (B, T, n_embd): mean group embedding over each token's readings + tone embedding."""
        g = self.phon_group_ids[idx]  # (B, T, phon_readings), -1 padding
        keep = (g >= 0).unsqueeze(-1).to(self.wge.weight.dtype)  # (B, T, R, 1)
        groups = (self.wge(g.clamp(min=0)) * keep).sum(2) / keep.sum(2)  # (B, T, n_embd)
        return groups + self.wtone(self.phon_tone_ids[idx])  # (B, T, n_embd)

    def _head_phonology(self) -> torch.Tensor:
        """(head_cutoffs[0], n_embd): the phonology embeddings of the adaptive head cluster's
        tokens, in frequency-rank order (the rows of its weight they are added to)."""
        ids = torch.argsort(self.id_rank)[: self.cfg.head_cutoffs[0]]  # rank → id
        return self._phonology(ids[None])[0]

    def _tied_logits(self, x: torch.Tensor) -> torch.Tensor:
        """The tied output layer: x (B, T, n_embd) → (B, T, vocab_size); with phon_output each
        token's output vector is its embedding plus its phonology embedding."""
        if not self.cfg.phon_output:
            return self.lm_head(x)
        return F.linear(x, self.wte.weight + self._phonology(torch.arange(self.cfg.vocab_size, device=x.device)[None])[0])

    def _embed(self, idx: torch.Tensor, start: int = 0, history: torch.Tensor | None = None) -> torch.Tensor:
        B, T = idx.shape
        if start + T > self.cfg.block_size:
            raise ValueError(f"sequence length {start + T} exceeds block_size {self.cfg.block_size}")
        x = self.wte(idx)  # (B, T, n_embd)
        if self.cfg.phonology:
            x = x + self._phonology(idx)
        if self.cfg.structure:
            s = self.structure_ids(idx, history)  # (B, T, 3)
            x = x + self.wline(s[..., 0]) + self.wcount(s[..., 1]) + self.wslot(s[..., 2])
        if self.wpe is not None:  # with rope, positions enter in the attention instead
            x = x + self.wpe(torch.arange(start, start + T, device=idx.device))  # + (T, n_embd)
        return self.drop(x)

    def new_cache(self, keep_weights: bool = False, history: torch.Tensor | None = None) -> Cache:
        """An empty KV cache per layer, for `forward(..., cache=)`; keep_weights: each layer keeps
        its last query's attention row (`KVCache.weights`). history: (B, H) int64, the tokens of
        the text before the cache's first (e.g. those a refill drops), which the structure
        features read; ignored without them."""
        cache = Cache(KVCache(self.cfg.block_size, keep_weights) for _ in self.blocks)
        cache.ids = history if self.cfg.structure else None
        return cache

    def _hidden(self, idx: torch.Tensor, cache: Cache | None = None, history: torch.Tensor | None = None) -> torch.Tensor:
        """idx (B, T) int64 → the final LayerNorm's output (B, T, n_embd), the output layer's input.
        history: as `forward`'s; with a cache, the cache's own."""
        if cache is not None and self.cfg.structure:
            history, cache.ids = cache.ids, idx if cache.ids is None else torch.cat([cache.ids, idx], dim=1)
        x = self._embed(idx, cache[0].length if cache else 0, history)  # (B, T, n_embd)
        for i, block in enumerate(self.blocks):
            x = block(x, cache[i] if cache else None)  # (B, T, n_embd)
        return self.ln_f(x)  # (B, T, n_embd)

    def forward(self, idx: torch.Tensor, cache: Cache | None = None,
                history: torch.Tensor | None = None) -> torch.Tensor:
        """idx: (B, T) int64 token ids → logits (B, T, vocab_size) float; with the adaptive head
        log-probabilities (in id order), which softmax alike.

        cache: from `new_cache`; idx continues the positions it holds (and is added to it).
        history: (B, H) int64, the text's tokens before idx when idx is a cropped window (the
        structure features read them; no position or attention does); not with a cache, which
        keeps its own (`new_cache`). raises ValueError if the positions pass block_size.
        """
        x = self._hidden(idx, cache, history)  # (B, T, n_embd)
        if self.cfg.head == "tied":
            return self._tied_logits(x)  # (B, T, vocab_size)
        # in float32 even under autocast: the adaptive softmax writes float32 results in place
        with torch.autocast(device_type=x.device.type, enabled=False):
            logp = self.lm_head.log_prob(x.reshape(-1, x.size(-1)).float())  # (B·T, vocab_size), rank order
            return logp[:, self.id_rank].view(*idx.shape, -1)  # (B, T, vocab_size)

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy in nats per scored token, a scalar: idx, targets (B, T) int64,
        targets -1 where not scored; plus the auxiliary rhyme loss if rhyme_loss_weight > 0 (not
        in `nats`). The adaptive head scores the targets only, never the full distribution: what
        it saves in training. raises ValueError as `forward`."""
        x = self._hidden(idx)  # (B, T, n_embd)
        aux = self._rhyme_loss(x, targets) if self.cfg.rhyme_loss_weight > 0 else 0.0
        if self.cfg.head == "tied":
            logits = self._tied_logits(x)  # (B, T, vocab_size)
            return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1), ignore_index=-1) + aux
        with torch.autocast(device_type=x.device.type, enabled=False):
            scored = targets.reshape(-1) != -1  # (B·T,)
            h = x.reshape(-1, x.size(-1))[scored].float()  # (N, n_embd)
            return self.lm_head(h, self.id_rank[targets.reshape(-1)[scored]]).loss + aux

    def _rhyme_loss(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """rhyme_loss_weight × the mean cross-entropy (nats) of `rhyme_head` predicting the first
        group id of each line-final target (a target whose next target is a line-end mark), 0 if
        there is none: x (B, T, n_embd), targets (B, T) int64, -1 not scored."""
        t = targets.clamp(min=0)  # (B, T)
        final = (targets[:, :-1] >= 0) & (self.token_kind[t[:, 1:]] == 3)  # (B, T-1): target t ends a line
        if not final.any():
            return x.new_zeros(())
        logits = self.rhyme_head(x[:, :-1][final]).float()  # (N, phon_groups)
        return self.cfg.rhyme_loss_weight * F.cross_entropy(logits, self.phon_group_ids[t[:, :-1][final], 0])

    def nats(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of every position in nats, (B, T) float, 0 where targets is -1 (not
        scored): idx, targets (B, T) int64. raises ValueError as `forward`."""
        x = self._hidden(idx)  # (B, T, n_embd)
        if self.cfg.head == "tied":
            logits = self._tied_logits(x)  # (B, T, vocab_size)
            return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1), ignore_index=-1,
                                   reduction="none").view(targets.shape)
        with torch.autocast(device_type=x.device.type, enabled=False):
            scored = targets.reshape(-1) != -1  # (B·T,)
            h = x.reshape(-1, x.size(-1))[scored].float()  # (N, n_embd), N scored positions
            out = self.lm_head(h, self.id_rank[targets.reshape(-1)[scored]])
            nats = torch.zeros(scored.shape, device=h.device).masked_scatter(scored, -out.output)  # (B·T,)
            return nats.view(targets.shape)  # (B, T)

    @torch.no_grad()
    def attention_maps(self, idx: torch.Tensor) -> list[torch.Tensor]:
        """Attention weights of every layer for idx: (B, T) int64.

        returns n_layer tensors of (B, n_head, T, T) float, eval semantics, rows sum to 1,
        whatever the attention backend.
        """
        x = self._embed(idx)
        maps = []
        for block in self.blocks:
            maps.append(block.attn.attention_weights(block.ln_1(x)))
            x = block(x)
        return maps
