"""A GPT language model (decoder-only Transformer), in the style of nanoGPT's model.py.

Token + learned position embeddings, `n_layer` pre-LayerNorm blocks (causal self-attention,
then a GELU MLP, each added to the residual stream), a final LayerNorm and an output layer:
`head='tied'`, a linear layer tied to the token embedding (nanoGPT's), or `head='adaptive'`,
an adaptive softmax (Grave et al. 2017, "Efficient softmax approximation for GPUs"): the
`head_cutoffs[0]` most frequent tokens get a full-width output, rarer ones sit in tail
clusters of width n_embd / head_div_value^k, so a step costs a fraction of a full softmax over
every character. Initialisation as GPT-2 (Radford et al. 2019): N(0, 0.02), with the residual
projections scaled by 1/√(2·n_layer).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Iterator, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.attention import CausalSelfAttention, KVCache
from model.sampling.decoding import LogitsProcessor, check_sampling_args, next_token


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

    def __post_init__(self):
        """Cutoffs past the vocabulary are dropped; a vocabulary smaller than the first cutoff (e.g.
        a small BPE vocabulary) gets the tied head: there is nothing to save."""
        self.head_cutoffs = tuple(c for c in self.head_cutoffs if c < self.vocab_size)
        if self.head == "adaptive" and not self.head_cutoffs:
            self.head = "tied"

    def to_dict(self) -> dict:
        return asdict(self)


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


HEADS = ("tied", "adaptive")
POS_EMBS = ("learned", "rope")
MLP_ACTS = ("gelu", "relu2")


class GPT(nn.Module):
    """cfg: GPTConfig. raises ValueError for an unknown attention backend, head, pos_emb or mlp_act,
    n_embd % n_head != 0, or adaptive cutoffs that are not positive and increasing."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        for name, value, allowed in (("head", cfg.head, HEADS), ("pos_emb", cfg.pos_emb, POS_EMBS),
                                     ("mlp_act", cfg.mlp_act, MLP_ACTS)):
            if value not in allowed:
                raise ValueError(f"unknown {name} {value!r}; choose one of {', '.join(allowed)}")
        cutoffs = list(cfg.head_cutoffs)
        if cfg.head == "adaptive" and (cutoffs != sorted(set(cutoffs)) or cutoffs[0] <= 0):
            raise ValueError(f"head_cutoffs {cutoffs} must be positive and strictly increasing")
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)  # token embedding
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd) if cfg.pos_emb == "learned" else None  # positions
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        if cfg.head == "tied":
            self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
            self.lm_head.weight = self.wte.weight  # weight tying (Press & Wolf 2017)
        else:  # clusters by frequency rank; id_rank maps a token id to its rank (set_token_counts)
            self.lm_head = nn.AdaptiveLogSoftmaxWithLoss(cfg.n_embd, cfg.vocab_size, cutoffs, cfg.head_div_value)
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

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; position embeddings excluded when non_embedding (nanoGPT's convention)."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.wpe.weight.numel() if non_embedding and self.wpe is not None else n

    def _embed(self, idx: torch.Tensor, start: int = 0) -> torch.Tensor:
        B, T = idx.shape
        if start + T > self.cfg.block_size:
            raise ValueError(f"sequence length {start + T} exceeds block_size {self.cfg.block_size}")
        x = self.wte(idx)  # (B, T, n_embd)
        if self.wpe is not None:  # with rope, positions enter in the attention instead
            x = x + self.wpe(torch.arange(start, start + T, device=idx.device))  # + (T, n_embd)
        return self.drop(x)

    def new_cache(self) -> list[KVCache]:
        """An empty KV cache per layer, for `forward(..., cache=)`."""
        return [KVCache(self.cfg.block_size) for _ in self.blocks]

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, cache: list[KVCache] | None = None,
                reduction: str = "mean"):
        """idx: (B, T) int64 token ids; targets: (B, T) int64 or None, -1 where not scored.

        cache: from `new_cache`; idx continues the positions it holds (and is added to it).
        returns (logits (B, T, vocab_size) float, loss: mean cross-entropy in nats per
        scored token, or None without targets; with reduction="none" the nats of every
        position, (B, T) float, 0 where not scored). With the adaptive head the logits are
        log-probabilities, and None when targets are given: training needs only the loss, and
        the full distribution is what the adaptive softmax saves computing. raises ValueError if
        the positions pass block_size, or for a reduction other than "mean" and "none".
        """
        if reduction not in ("mean", "none"):
            raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")
        x = self._embed(idx, cache[0].length if cache else 0)  # (B, T, n_embd)
        for i, block in enumerate(self.blocks):
            x = block(x, cache[i] if cache else None)  # (B, T, n_embd)
        x = self.ln_f(x)  # (B, T, n_embd)
        if self.cfg.head == "tied":
            logits = self.lm_head(x)  # (B, T, vocab_size)
            loss = None if targets is None else F.cross_entropy(
                logits.view(-1, logits.size(-1)).float(), targets.view(-1), ignore_index=-1, reduction=reduction)
            return logits, loss if reduction == "mean" or loss is None else loss.view(targets.shape)
        # in float32 even under autocast: the adaptive softmax writes float32 results in place
        with torch.autocast(device_type=x.device.type, enabled=False):
            if targets is None:  # log-probabilities of every id, in id order
                logp = self.lm_head.log_prob(x.reshape(-1, x.size(-1)).float())  # (B·T, vocab_size), rank order
                return logp[:, self.id_rank].view(*idx.shape, -1), None  # (B, T, vocab_size)
            scored = targets.reshape(-1) != -1  # (B·T,)
            h = x.reshape(-1, x.size(-1))[scored].float()  # (N, n_embd), N scored positions
            out = self.lm_head(h, self.id_rank[targets.reshape(-1)[scored]])
            if reduction == "mean":
                return None, out.loss
            nats = torch.zeros(scored.shape, device=h.device).masked_scatter(scored, -out.output)  # (B·T,)
            return None, nats.view(targets.shape)  # (B, T)

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

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None, eos_id: int | None = None,
                 generator: torch.Generator | None = None, use_cache: bool = True,
                 processors: Sequence[LogitsProcessor] = ()) -> torch.Tensor:
        """Sample continuations of idx: (B, T0) int64 → (B, T0 + n) with n ≤ max_new_tokens.

        Rows that ended are padded with eos_id; see `generate_stream` for the arguments.
        """
        return torch.cat([idx, *self.generate_stream(idx, max_new_tokens, temperature, top_k, top_p, eos_id,
                                                     generator, use_cache, processors)], dim=1)

    @torch.no_grad()
    def generate_stream(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                        top_k: int | None = None, top_p: float | None = None, eos_id: int | None = None,
                        generator: torch.Generator | None = None, use_cache: bool = True,
                        processors: Sequence[LogitsProcessor] = ()) -> Iterator[torch.Tensor]:
        """Yield the next token of every row, (B, 1) int64, up to max_new_tokens times.

        idx: (B, T0) int64, any length: the model sees the last block_size tokens. With
        use_cache (default) each step feeds only the new token and reuses the keys and values
        of the earlier ones (KV cache); when the cache is full it is re-filled with the last
        block_size // 2 tokens. Without it every step recomputes the last block_size tokens.
        Each step: processors (each `(idx so far, logits) → logits`, e.g. constraints) →
        `model.sampling.decoding.next_token` (temperature 0 = greedy, top_k, top_p). Stops once every
        row has produced eos_id; a row that ended gets eos_id. `generator` seeds the draws.
        raises ValueError for a bad temperature / top_k / top_p, non-finite logits from the
        model, NaN or +inf after the processors (at any temperature), or a step where the
        processors allow no token.
        """
        check_sampling_args(temperature, top_k, top_p)
        block = self.cfg.block_size
        done = torch.zeros(idx.size(0), dtype=torch.bool, device=idx.device)
        cache = self.new_cache() if use_cache else None
        logits, _ = self(idx[:, -block:], cache=cache)  # (B, ≤block, vocab_size): the prompt at once
        for step in range(max_new_tokens):
            logits = logits[:, -1, :].float()  # (B, vocab_size)
            if not torch.isfinite(logits).all():
                raise ValueError("the model produced non-finite logits (NaN or inf); the checkpoint is damaged "
                                 "or the precision too low")
            for process in processors:
                logits = process(idx, logits)
            nxt = next_token(logits, temperature, top_k, top_p, generator)  # (B, 1); refuses NaN / +inf
            if eos_id is not None:
                nxt = nxt.masked_fill(done[:, None], eos_id)
                done |= nxt[:, 0] == eos_id
            idx = torch.cat([idx, nxt], dim=1)
            yield nxt
            if (eos_id is not None and done.all()) or step == max_new_tokens - 1:
                return
            if cache is None:
                logits, _ = self(idx[:, -block:])
            elif cache[0].length < block:
                logits, _ = self(nxt, cache=cache)  # (B, 1, vocab_size)
            else:  # cache full: start again from the recent half
                cache = self.new_cache()
                logits, _ = self(idx[:, -(block // 2):], cache=cache)
