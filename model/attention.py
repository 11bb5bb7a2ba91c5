"""Causal multi-head self-attention, step by step as the attention lesson builds it on
「床前明月光」 (docs/attention.md tells the lesson and its reading, and maps each step here):

    1. project x to queries, keys and values, and split them into heads: (B, n_head, T, d_k)
    2. scores = q kᵀ / √d_k                     (Vaswani et al. 2017, eq. 1)
    3. causal mask: a query sees itself and the positions before it (a registered buffer)
    4. softmax over the keys: each row of weights sums to 1
    5. dropout on the attention weights (training only)
    6. weights @ v: each query's mix of the values
    7. merge the heads: (B, T, n_embd)
    8. output projection W_O

`CausalSelfAttention.forward` does steps 2–6 as written above with `backend='naive'`, the branch
to read; `sdpa` (the default: PyTorch's `F.scaled_dot_product_attention`, which picks a fused
kernel) and `flash` (the same call held to the FlashAttention kernel) do them in one call, the
same function. The layers keep nanoGPT's (and GPT-2's) names: `c_attn` holds W_q, W_k and W_v
side by side, `c_proj` is W_O. Rotary position
embeddings (`rope`; Su et al. 2021, RoFormer eq. 34) turn q and k by their positions before step 2.
Which devices have a FlashAttention kernel: `model.device.check_backend`. Decoding feeds the
layer one new position at a time with the keys and values of the positions before
(`model/kv_cache.py`); switching heads off acts on step 7's input (`model/ablation.py`).
"""
from __future__ import annotations

import math
from contextlib import nullcontext

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = ("naive", "sdpa", "flash")


def causal_attention_weights(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Steps 2–4 as one function: softmax(q kᵀ / √d_k), the future masked. q: (..., T, d_k), the
    last T of the L positions of k: (..., L, d_k) → (..., T, L) float, rows sum to 1, masked
    entries exactly 0. For inspection: the random baselines (`model/inspection/attention_stats.py`)
    and the KV cache's attention rows."""
    T, L = q.size(-2), k.size(-2)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (..., T, L)
    mask = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()[L - T:]  # (T, L), True where it may look
    return F.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (halves layout): x (B, n_head, T, d_k), cos and sin (T, d_k / 2)
    of position × frequency → x with each coordinate pair (i, i + d_k/2) turned by its angle."""
    x1, x2 = x.chunk(2, dim=-1)  # (B, n_head, T, d_k / 2) each
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)  # (B, n_head, T, d_k)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention, steps 1–8 of the module's docstring.

    n_embd: model width; n_head: heads, d_k = n_embd // n_head; block_size: the longest T;
    dropout: on the attention weights (step 5) and on the output, in training; backend: one of
    `BACKENDS`; rope: rotary position embeddings on q and k (base 10,000).
    raises ValueError if n_embd % n_head != 0, d_k is odd with rope, or the backend is unknown.
    """

    def __init__(self, n_embd: int, n_head: int, block_size: int, dropout: float = 0.0, backend: str = "sdpa",
                 rope: bool = False):
        super().__init__()
        if n_embd % n_head:
            raise ValueError(f"n_embd={n_embd} is not divisible by n_head={n_head}")
        if rope and (n_embd // n_head) % 2:
            raise ValueError(f"rope needs an even head size d_k, not {n_embd // n_head}")
        if backend not in BACKENDS:
            raise ValueError(f"unknown attention backend {backend!r}; choose one of {', '.join(BACKENDS)}")
        self.n_head, self.n_embd, self.d_k = n_head, n_embd, n_embd // n_head
        self.dropout, self.backend, self.rope = dropout, backend, rope
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=False)  # W_q, W_k, W_v side by side
        self.c_proj = nn.Linear(n_embd, n_embd, bias=False)  # W_O
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        # True where a query may look: position t sees the positions ≤ t. A buffer moves with the model
        # between devices; not persistent: rebuilt from block_size, so not in checkpoints
        self.register_buffer("mask", torch.ones(block_size, block_size, dtype=torch.bool).tril(), persistent=False)
        if rope:  # the angle of position t at frequency i: t / 10000^(2i / d_k)
            freq = 10000.0 ** (-torch.arange(0, self.d_k, 2).float() / self.d_k)  # (d_k / 2,)
            angle = torch.outer(torch.arange(block_size).float(), freq)  # (block_size, d_k / 2)
            self.register_buffer("cos", angle.cos(), persistent=False)
            self.register_buffer("sin", angle.sin(), persistent=False)

    def forward(self, x: torch.Tensor, cache=None) -> torch.Tensor:
        """x: (B, T, n_embd) float → (B, T, n_embd).

        cache: a layer's `model.kv_cache.KVCache` holding the keys and values of the positions
        before x (decoding); x's are appended to it. Without it x starts at position 0. The
        positions must stay within block_size.
        """
        B, T, C = x.shape
        # 1. queries, keys, values: one projection cut in three, then each split into heads
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)  # x W_qᵀ, x W_kᵀ, x W_vᵀ: each (B, T, n_embd)
        q = q.view(B, T, self.n_head, self.d_k).transpose(1, 2)  # (B, n_head, T, d_k)
        k = k.view(B, T, self.n_head, self.d_k).transpose(1, 2)  # (B, n_head, T, d_k)
        v = v.view(B, T, self.n_head, self.d_k).transpose(1, 2)  # (B, n_head, T, d_k)
        if self.rope:  # not in the lesson: turn q and k by their positions
            start = 0 if cache is None else cache.length
            cos, sin = self.cos[start:start + T], self.sin[start:start + T]  # (T, d_k / 2)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if cache is not None:
            k, v = cache.append(q, k, v)  # (B, n_head, L, d_k) each: every position so far
        L = k.size(2)  # keys: T without a cache, the cached positions + T with one
        if self.backend == "naive":
            scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)  # 2. (B, n_head, T, L)
            # 3. no looking ahead: the mask's rows of the T queries (the top-left T × T without a cache)
            scores = scores.masked_fill(~self.mask[L - T:L, :L], float("-inf"))
            weights = F.softmax(scores, dim=-1)  # 4. (B, n_head, T, L), rows sum to 1
            weights = self.attn_dropout(weights)  # 5.
            y = weights @ v  # 6. (B, n_head, T, d_k)
        else:  # steps 2–6 in one fused call
            p = self.dropout if self.training else 0.0
            # is_causal masks the top-left triangle, right when T == L; one new query sees every key;
            # otherwise (a cache and several new positions) the bottom T rows of the mask
            mask = None if T in (1, L) else self.mask[L - T:L, :L]
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION) if self.backend == "flash" else nullcontext():
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=T == L and T > 1)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # 7. merge the heads: (B, T, n_embd)
        return self.resid_dropout(self.c_proj(y))  # 8. W_O: (B, T, n_embd)

    @torch.no_grad()
    def attention_weights(self, x: torch.Tensor) -> torch.Tensor:
        """The weights of step 4 for x (B, T, n_embd), whatever the backend: (B, n_head, T, T) float,
        rows sum to 1, the upper triangle exactly 0, no dropout. The fused kernels return none, so
        the naive path runs once here and the weights are read at step 5's input."""
        seen = []
        hook = self.attn_dropout.register_forward_hook(lambda module, args, out: seen.append(args[0]))
        backend, self.backend = self.backend, "naive"
        try:
            self(x)
        finally:
            hook.remove()
            self.backend = backend
        return seen[0]
