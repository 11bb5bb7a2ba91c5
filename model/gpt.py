"""A GPT language model (decoder-only Transformer), in the style of nanoGPT's model.py.

Token embeddings, `n_layer` pre-LayerNorm blocks (causal self-attention, then an MLP, each
added to the residual stream), a final LayerNorm and an output head. Initialisation as GPT-2
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
  rarer ones sit in tail clusters each 4 times narrower than the last; or `tied`, a linear layer
  tied to the token embedding (nanoGPT's). `model.loading.head_for_vocabulary` decides which
  head a vocabulary gets before the model is built.
- `poem_inputs` (and the auxiliary `rhyme_loss_weight`): what the network is told about a poem
  besides its tokens, one module beside this one, `model/poem_inputs.py`.
- `backend`: the attention backend (`model/attention.py`: naive | sdpa | flash), the same function.
No layer has a bias (nanoGPT's `bias=False`).

Named methods, one return type each: `forward` → logits, `loss` → mean cross-entropy, `nats`
→ per-token cross-entropy, `attention_maps` → every layer's weights. Generation lives in the
inference engine (`model/engine.py`), which feeds `forward` with a KV cache (`model/kv_cache.py`).
A GPT with poem inputs gets its tables from `model.loading.build_gpt`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.attention import CausalSelfAttention
from model.poem_inputs import GROUPS, PoemInputs


@dataclass
class GPTConfig:
    """Model shape and options; `vocab_size` and `rhyme_groups` come from the tokenizer, `backend`
    from conf/attention, the rest from conf/model."""
    vocab_size: int
    block_size: int = 64  # longest context T
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0  # on the attention weights, residual branches and embeddings
    backend: str = "sdpa"  # the attention backend: naive | sdpa | flash
    head: str = "tied"  # tied | adaptive
    head_cutoffs: tuple[int, ...] = (2000, 4000)  # adaptive: frequency ranks where the tail clusters start
    pos_emb: str = "learned"  # learned (a table of block_size vectors) | rope (rotary, in the attention)
    mlp_act: str = "gelu"  # gelu | relu2 (ReLU squared: So et al. 2021, "Primer")
    zero_init_proj: bool = False  # residual output projections start at 0: each block starts as the identity
    poem_inputs: bool = False  # each token's 平水韵 groups and tone, and where it sits in the poem, in and out
    rhyme_loss_weight: float = 0.0  # with poem_inputs: weight of the auxiliary rhyme loss at rhyme slots
    rhyme_groups: int = GROUPS  # with poem_inputs: the tokenizer's rhyme-group ids (data.features.group_count)

    def __post_init__(self):
        self.head_cutoffs = tuple(self.head_cutoffs)


MODEL_FIELDS = tuple(f.name for f in fields(GPTConfig) if f.name not in ("vocab_size", "rhyme_groups", "backend"))
"""The fields conf/model sets (the model's shape and options); vocab_size and rhyme_groups come
from the tokenizer, backend from conf/attention."""
HEADS, POS_EMBS, MLP_ACTS = ("tied", "adaptive"), ("learned", "rope"), ("gelu", "relu2")


class MLP(nn.Module):
    """Position-wise feed-forward network: Linear(n_embd → 4·n_embd), GELU or ReLU², Linear back, dropout."""
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=False)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=False)
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
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=False)
        self.attn = CausalSelfAttention(cfg.n_embd, cfg.n_head, cfg.block_size, cfg.dropout, cfg.backend,
                                        rope=cfg.pos_emb == "rope")
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=False)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cache=None) -> torch.Tensor:  # cache: the layer's `model.kv_cache.KVCache`
        x = x + self.attn(self.ln_1(x), cache)  # (B, T, n_embd)
        return x + self.mlp(self.ln_2(x))  # (B, T, n_embd)


class RowsPlus(nn.Linear):
    """A bias-free Linear layer whose weight's first rows get `extra()` ((rows, in_features))
    added at every call: the adaptive head cluster with the poem inputs."""
    def __init__(self, in_features: int, out_features: int, extra):
        super().__init__(in_features, out_features, bias=False)
        self.extra = extra  # a bound method of the head: not a submodule

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = self.extra()  # (rows, in_features)
        return F.linear(x, torch.cat([self.weight[: e.size(0)] + e, self.weight[e.size(0):]]))


class OutputHead(nn.Module):
    """Final hidden states → scores of every token, tied or adaptive (`GPTConfig.head`).

    tied: a linear layer whose weight is the token embedding's (Press & Wolf 2017); adaptive:
    an adaptive softmax over frequency ranks (`id_rank`: token id → rank, `set_token_counts`).
    extra: token ids (N,) → (N, n_embd) rows added to those tokens' output vectors (the poem
    inputs' phonology), or None."""
    def __init__(self, cfg: GPTConfig, wte: nn.Embedding, extra=None):
        super().__init__()
        self.extra, self.vocab_size = extra, cfg.vocab_size
        if cfg.head == "tied":
            self.tied = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
            self.tied.weight = wte.weight  # weight tying
            return
        self.tied = None
        self.adaptive = nn.AdaptiveLogSoftmaxWithLoss(cfg.n_embd, cfg.vocab_size, list(cfg.head_cutoffs), 4.0)
        if extra is not None:  # the head cluster's rows (its most frequent tokens) get theirs added
            self.adaptive.head = RowsPlus(cfg.n_embd, self.adaptive.head_size, self._head_extra)
        self.register_buffer("id_rank", torch.arange(cfg.vocab_size))  # (vocab_size,), saved in checkpoints

    def _head_extra(self) -> torch.Tensor:  # (cutoffs[0], n_embd), the head cluster's tokens in rank order
        return self.extra(torch.argsort(self.id_rank)[: self.adaptive.cutoffs[0]][None])[0]

    @torch.no_grad()
    def set_token_counts(self, counts: torch.Tensor) -> None:
        """Order the adaptive clusters by frequency: counts (vocab_size,) int, each id's count in
        the training data (ties keep id order). No-op when tied. raises ValueError for a wrong shape."""
        if self.tied is not None:
            return
        if counts.shape != (self.vocab_size,):
            raise ValueError(f"counts must be ({self.vocab_size},), got {tuple(counts.shape)}")
        order = torch.sort(-counts.to(torch.int64), stable=True).indices  # (vocab_size,) ids, most frequent first
        self.id_rank[order] = torch.arange(self.vocab_size, device=self.id_rank.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, T, n_embd) → logits (B, T, vocab_size); adaptive: log-probabilities in id order."""
        if self.tied is not None:
            if self.extra is None:
                return self.tied(x)
            ids = torch.arange(self.vocab_size, device=x.device)[None]  # (1, vocab_size)
            return F.linear(x, self.tied.weight + self.extra(ids)[0])
        with torch.autocast(device_type=x.device.type, enabled=False):  # the adaptive softmax writes float32 in place
            logp = self.adaptive.log_prob(x.reshape(-1, x.size(-1)).float())  # (B·T, vocab_size), rank order
            return logp[:, self.id_rank].view(*x.shape[:-1], -1)  # (B, T, vocab_size)

    def nats(self, x: torch.Tensor, targets: torch.Tensor, mean: bool = False) -> torch.Tensor:
        """Cross-entropy in nats of targets (B, T) int64 (-1: not scored) given x (B, T, n_embd):
        (B, T), 0 where not scored, or with `mean` their mean over the scored positions, a scalar.
        The adaptive head scores the targets only, never the full distribution."""
        if self.tied is not None:
            logits = self(x)  # (B, T, vocab_size)
            nats = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1), ignore_index=-1,
                                   reduction="mean" if mean else "none")
            return nats if mean else nats.view(targets.shape)
        with torch.autocast(device_type=x.device.type, enabled=False):
            scored = targets.reshape(-1) != -1  # (B·T,)
            h = x.reshape(-1, x.size(-1))[scored].float()  # (N, n_embd), N scored positions
            out = self.adaptive(h, self.id_rank[targets.reshape(-1)[scored]])
            if mean:
                return out.loss
            return torch.zeros(scored.shape, device=h.device).masked_scatter(scored, -out.output).view(targets.shape)


class GPT(nn.Module):
    """cfg: GPTConfig. raises ValueError for an unknown backend, head, pos_emb or mlp_act,
    n_embd % n_head != 0, adaptive cutoffs that are not positive, increasing and below vocab_size,
    or a rhyme loss without the poem inputs."""

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
                             "for the vocabulary first (model.loading.head_for_vocabulary)")
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)  # token embedding
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd) if cfg.pos_emb == "learned" else None  # positions
        if cfg.rhyme_loss_weight > 0 and not cfg.poem_inputs:
            raise ValueError("rhyme_loss_weight > 0 needs poem_inputs=true (the tokens' rhyme groups)")
        self.poem = PoemInputs(cfg) if cfg.poem_inputs else None
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=False)
        self.lm_head = OutputHead(cfg, self.wte, self.poem.output_rows if self.poem else None)
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

    def _embed(self, idx: torch.Tensor, start: int = 0, history: torch.Tensor | None = None) -> torch.Tensor:
        """idx (B, T) int64 at positions start … start + T − 1, after the tokens `history` →
        the blocks' input (B, T, n_embd). raises ValueError if the positions pass block_size."""
        B, T = idx.shape
        if start + T > self.cfg.block_size:
            raise ValueError(f"sequence length {start + T} exceeds block_size {self.cfg.block_size}")
        x = self.wte(idx)  # (B, T, n_embd)
        if self.poem is not None:
            x = self.poem(x, idx, history)  # + phonology and structure rows
        if self.wpe is not None:  # with rope, positions enter in the attention instead
            x = x + self.wpe(torch.arange(start, start + T, device=idx.device))  # + (T, n_embd)
        return self.drop(x)

    def _hidden(self, idx: torch.Tensor, cache=None) -> torch.Tensor:
        """idx (B, T) int64 → the final LayerNorm's output (B, W, n_embd), W = T unless the cache refilled."""
        x = self._embed(idx) if cache is None else self._embed(*cache.feed(idx))  # (B, W, n_embd)
        for i, block in enumerate(self.blocks):
            x = block(x, None if cache is None else cache.layers[i])  # (B, W, n_embd)
        return self.ln_f(x)  # (B, W, n_embd)

    def forward(self, idx: torch.Tensor, cache=None) -> torch.Tensor:
        """idx: (B, T) int64 token ids → logits (B, T, vocab_size) float; with the adaptive head
        log-probabilities (in id order), which softmax alike.

        cache: a `model.kv_cache.Cache`; idx continues the text it holds. When it refills the
        logits are those of the positions it ran, the last W of idx. raises ValueError if the
        positions pass block_size (without a cache: T > block_size).
        """
        return self.lm_head(self._hidden(idx, cache))  # (B, T, vocab_size)

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy in nats per scored token, a scalar: idx, targets (B, T) int64,
        targets -1 where not scored; plus the auxiliary rhyme loss if rhyme_loss_weight > 0 (not
        in `nats`). raises ValueError as `forward`."""
        x = self._hidden(idx)  # (B, T, n_embd)
        aux = self.poem.rhyme_loss(x, targets, idx) if self.cfg.rhyme_loss_weight > 0 else 0.0
        return self.lm_head.nats(x, targets, mean=True) + aux

    def nats(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of every position in nats, (B, T) float, 0 where targets is -1 (not
        scored): idx, targets (B, T) int64. raises ValueError as `forward`."""
        return self.lm_head.nats(self._hidden(idx), targets)

    @torch.no_grad()
    def attention_maps(self, idx: torch.Tensor) -> list[torch.Tensor]:
        """Attention weights of every layer for idx: (B, T) int64.

        returns n_layer tensors of (B, n_head, T, T) float, eval semantics, rows sum to 1,
        whatever the attention backend.
        """
        x = self._embed(idx)  # (B, T, n_embd)
        maps = []
        for block in self.blocks:
            maps.append(block.attn.attention_weights(block.ln_1(x)))  # (B, n_head, T, T)
            x = block(x)
        return maps
