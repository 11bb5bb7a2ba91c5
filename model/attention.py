"""Causal multi-head self-attention, as built in the attention lesson (a course lesson that
builds it step by step on 「床前明月光」) and its supplementary reading (notes on chapter 3 of
Raschka's *Build a Large Language Model (From Scratch)*, from its MLNLP-World and Datawhale
Chinese translations); docs/attention.md describes both and walks through these steps.

The steps and names follow the lesson (sections 3 and 5) and the shapes table of the reading
(section 5.3): project x to q, k, v; split heads `(B, T, n_embd) → (B, n_head, T, d_k)`;
scores = q kᵀ / √d_k; causal mask (a registered buffer, the reading's §4.3) set to -inf;
softmax; dropout on the attention weights (the reading's §6.3); weights @ v; merge heads;
output projection. Formula: Vaswani et al. 2017, "Attention Is
All You Need", eq. 1. Two options act on q and k before the scores and keep every other step:
`qk_norm` (RMS-normalise each head's q and k: Henry et al. 2020, "Query-Key Normalization for
Transformers"; Dehghani et al. 2023) and `rope` (rotary position embeddings: Su et al. 2021,
"RoFormer", eq. 34: each pair of q, k coordinates rotated by an angle proportional to the
position, so q·k depends on the positions only through their distance).

Three backends compute the same thing and differ only in how:
- `naive`: the explicit formula, step by step.
- `sdpa`:  `F.scaled_dot_product_attention`, PyTorch picks the kernel.
- `flash`: the same call restricted to the FlashAttention kernel; `flash_unavailable_reason`
  says up front when this device, dtype and dropout have no such kernel.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import nullcontext

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = ("naive", "sdpa", "flash")


class BackendUnavailableError(RuntimeError):
    """The chosen attention backend cannot run on this device / dtype / dropout."""


def flash_unavailable_reason(device_type: str, dtype: torch.dtype, dropout: float, d_k: int) -> str | None:
    """Why the FlashAttention kernel cannot run here, or None if it can.

    device_type: 'cpu' | 'cuda' | ...; dtype: the dtype q, k, v will have (under autocast,
    the autocast dtype); dropout: the attention dropout that will be used (0 in eval);
    d_k: head size. The rules are PyTorch's (sdp_utils): the CPU flash kernel has no
    dropout; the CUDA one needs float16/bfloat16, compute capability ≥ 8.0 and
    d_k a multiple of 8 up to 256. A short trial call confirms the verdict.
    """
    if device_type == "cpu":
        if dropout > 0:
            return (f"the CPU FlashAttention kernel has no dropout, and dropout={dropout}. "
                    "Use attention=sdpa or attention=naive, or set model.dropout=0")
    elif device_type == "cuda":
        if dtype not in (torch.float16, torch.bfloat16):
            return (f"FlashAttention on CUDA needs float16 or bfloat16, not {dtype}. "
                    "Use trainer.precision=bf16-mixed (or 16-mixed), or attention=sdpa")
        if torch.cuda.get_device_capability() < (8, 0):
            return (f"FlashAttention needs a GPU of compute capability 8.0 or newer; this one is "
                    f"{'.'.join(map(str, torch.cuda.get_device_capability()))}. Use attention=sdpa")
        if d_k % 8 or d_k > 256:
            return (f"FlashAttention needs a head size d_k that is a multiple of 8 and at most 256, not {d_k}. "
                    "Use attention=sdpa")
    else:
        return f"this project's FlashAttention backend supports cpu and cuda, not {device_type}. Use attention=sdpa"
    try:  # the rules above are PyTorch's today; a trial call catches what they miss
        q = torch.zeros(1, 1, 8, d_k, device=device_type, dtype=dtype, requires_grad=dropout > 0)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            F.scaled_dot_product_attention(q, q, q, dropout_p=dropout, is_causal=True)
    except RuntimeError as err:
        return f"PyTorch has no FlashAttention kernel for this case ({err}). Use attention=sdpa"
    return None


def check_backend(backend: str, device_type: str, dtype: torch.dtype, dropout: float, d_k: int) -> None:
    """Raise before any long work if `backend` cannot run here.

    raises ValueError for an unknown backend name, BackendUnavailableError (with the
    reason and the backend to use instead) if `flash` has no kernel on this device.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "flash" and (reason := flash_unavailable_reason(device_type, dtype, dropout, d_k)):
        raise BackendUnavailableError(f"attention=flash cannot run here: {reason}.")


def causal_attention_weights(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """softmax(q kᵀ / √d_k) with the future masked: the lesson's section 3 formula.

    q: (..., T, d_k), k: (..., L, d_k) float; mask: (T, L) bool, True where a query may look
    (the lower triangle; with a KV cache its bottom T rows) → (..., T, L) float, rows sum to
    1, masked entries exactly 0. Used by the `naive` backend and by the random baselines of
    `model/inspection/attention_stats.py`.
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (..., T, L)
    scores = scores.masked_fill(~mask, float("-inf"))  # future → -inf
    return F.softmax(scores, dim=-1)  # (..., T, L), rows sum to 1


class KVCache:
    """Keys and values of the positions one attention layer has already seen (for decoding).

    Holds k, v: (B, n_head, block_size, d_k), filled up to `length`, allocated at the first
    `append` with its batch size, device and dtype (so autocast works). Appending the new
    positions' keys and values lets each decoding step compute q, k, v for the new token
    only, instead of for the whole context again (the "KV cache" of Transformer inference).
    With keep_weights, each forward through the layer also leaves in `weights` the attention
    row of its last query, computed explicitly (`causal_attention_weights`) whatever the
    backend, since the fused kernels return none: what a viewer shows beside a drawn token.
    """

    def __init__(self, block_size: int, keep_weights: bool = False):
        self.block_size, self.length = block_size, 0
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.keep_weights = keep_weights
        self.weights: torch.Tensor | None = None  # with keep_weights: the last query's row, (B, n_head, length)

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v: (B, n_head, T, d_k) of the next T positions → all keys and values so far,
        (B, n_head, length + T, d_k). raises ValueError if the cache would pass block_size."""
        start, end = self.length, self.length + k.size(2)
        if end > self.block_size:
            raise ValueError(f"KV cache holds {self.block_size} positions (block_size); cannot add up to {end}")
        if self.k is None:
            shape = (k.size(0), k.size(1), self.block_size, k.size(3))
            self.k, self.v = k.new_empty(shape), v.new_empty(shape)
        self.k[:, :, start:end], self.v[:, :, start:end] = k, v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]


class Cache:
    """A GPT's KV cache for generation: one `KVCache` per layer (`layers`), and `ids` (B, N)
    int64, every token fed so far: the text's history, which the structure inputs read.

    It refills itself: when the tokens fed next (T of them) would pass block_size, its layers
    start again from the text's last min(block_size, max(block_size // 2, T)) tokens, the rest
    staying history. keep_weights: each layer keeps its last query's attention row."""
    def __init__(self, n_layer: int, block_size: int, keep_weights: bool = False):
        self.n_layer, self.block_size, self.keep_weights = n_layer, block_size, keep_weights
        self.layers = [KVCache(block_size, keep_weights) for _ in range(n_layer)]
        self.ids: torch.Tensor | None = None

    @property
    def length(self) -> int:
        """Positions the layers hold."""
        return self.layers[0].length

    def feed(self, idx: torch.Tensor) -> tuple[torch.Tensor, int, torch.Tensor | None]:
        """Take idx (B, T) int64 into the text → (the tokens to run (B, W), the position of their
        first, the text before them (B, H) or None); W = T unless the cache refilled."""
        before, self.ids = self.ids, idx if self.ids is None else torch.cat([self.ids, idx], dim=1)
        if self.length + idx.size(1) <= self.block_size:
            return idx, self.length, before
        keep = min(self.block_size, max(self.block_size // 2, idx.size(1)))
        self.layers = [KVCache(self.block_size, self.keep_weights) for _ in range(self.n_layer)]
        return self.ids[:, -keep:], 0, self.ids[:, :-keep]


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (RoFormer eq. 34, halves layout): x (B, n_head, T, d_k), cos and
    sin (T, d_k / 2) of position × frequency → x with coordinate pairs (i, i + d_k/2) rotated."""
    x1, x2 = x.chunk(2, dim=-1)  # (B, n_head, T, d_k / 2) each
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)  # (B, n_head, T, d_k)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention.

    n_embd: model width; n_head: heads, d_k = n_embd // n_head; block_size: longest T;
    dropout: probability on the attention weights (training only); resid_dropout: on the output
    (None: dropout);
    backend: one of `BACKENDS`; qk_norm: RMS-normalise q and k per head; rope: rotary
    position embeddings on q and k (base 10,000). raises ValueError if n_embd % n_head != 0,
    d_k is odd with rope, or the backend is unknown.
    """

    def __init__(self, n_embd: int, n_head: int, block_size: int, dropout: float = 0.0,
                 backend: str = "sdpa", bias: bool = False, qk_norm: bool = False, rope: bool = False,
                 resid_dropout: float | None = None):
        super().__init__()
        if n_embd % n_head:
            raise ValueError(f"n_embd={n_embd} is not divisible by n_head={n_head}")
        if rope and (n_embd // n_head) % 2:
            raise ValueError(f"rope needs an even head size d_k, not {n_embd // n_head}")
        if backend not in BACKENDS:
            raise ValueError(f"unknown attention backend {backend!r}; choose one of {', '.join(BACKENDS)}")
        self.n_head, self.n_embd, self.d_k = n_head, n_embd, n_embd // n_head
        self.dropout, self.backend = dropout, backend
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)  # W_q, W_k, W_v side by side
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)  # W_O
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout if resid_dropout is None else resid_dropout)
        # lower-triangular mask: position t may look at positions ≤ t (the lesson's section 3)
        mask = torch.ones(block_size, block_size, dtype=torch.bool).tril()
        self.register_buffer("mask", mask, persistent=False)  # (block_size, block_size)
        self.qk_norm, self.rope = qk_norm, rope
        if rope:  # angle of position t, frequency i: t / 10000^(2i / d_k)
            freq = 10000.0 ** (-torch.arange(0, self.d_k, 2).float() / self.d_k)  # (d_k / 2,)
            angle = torch.outer(torch.arange(block_size).float(), freq)  # (block_size, d_k / 2)
            self.register_buffer("cos", angle.cos(), persistent=False)
            self.register_buffer("sin", angle.sin(), persistent=False)
        self.register_buffer("off", None, persistent=False)  # (n_head,) bool: heads switched off (`ablate`)
        self.register_buffer("off_value", None, persistent=False)  # (n_head, 1, d_k): what they output instead

    def ablate(self, heads: Sequence[int] = (), values: torch.Tensor | None = None) -> None:
        """Switch heads off: the output of each head in `heads` (its weights @ v, before the heads
        are merged and W_O) becomes values[i] ((len(heads), d_k) float; None: zero), at every
        position, on every backend and with a KV cache. heads=(): every head on again.
        raises ValueError for a head outside 0 … n_head − 1 or values of another shape."""
        if bad := [h for h in heads if not 0 <= h < self.n_head]:
            raise ValueError(f"head {bad[0]} is not one of this layer's heads 0 … {self.n_head - 1}")
        if values is not None and tuple(values.shape) != (len(heads), self.d_k):
            raise ValueError(f"values must be ({len(heads)}, {self.d_k}), got {tuple(values.shape)}")
        device = self.mask.device
        if not heads:
            self.off = self.off_value = None
            return
        self.off = torch.zeros(self.n_head, dtype=torch.bool, device=device)
        self.off[list(heads)] = True
        self.off_value = torch.zeros(self.n_head, 1, self.d_k, device=device)
        if values is not None:
            self.off_value[list(heads), 0] = values.to(device, torch.float32)

    def _qkv(self, x: torch.Tensor, start: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, n_embd) at positions start … start + T − 1 → q, k, v, each (B, n_head, T, d_k)."""
        B, T, C = x.shape  # (B, T, n_embd)
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)  # each (B, T, n_embd)
        q = q.view(B, T, self.n_head, self.d_k).transpose(1, 2)  # (B, n_head, T, d_k)
        k = k.view(B, T, self.n_head, self.d_k).transpose(1, 2)  # (B, n_head, T, d_k)
        v = v.view(B, T, self.n_head, self.d_k).transpose(1, 2)  # (B, n_head, T, d_k)
        if self.qk_norm:
            q, k = F.rms_norm(q, (self.d_k,)), F.rms_norm(k, (self.d_k,))
        if self.rope:
            cos, sin = self.cos[start:start + T], self.sin[start:start + T]  # (T, d_k / 2)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        return q, k, v

    def _causal_mask(self, T: int, L: int) -> torch.Tensor:
        """(T, L) bool, True where allowed: the T queries are the last T of the L positions.

        With a KV cache the queries (the new positions) are fewer than the keys; their mask
        is the bottom rows of the full causal mask, not the top-left corner.
        """
        return self.mask[L - T:L, :L]

    def _weights(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        mask = self._causal_mask(q.size(-2), k.size(-2))  # (T, L)
        return causal_attention_weights(q, k, mask)  # (B, n_head, T, L), rows sum to 1

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """x: (B, T, n_embd) float → (B, T, n_embd).

        cache: the keys and values of the positions before x (decoding), extended in place
        with x's; x's positions follow them. Without it, x starts at position 0. The total
        length must stay ≤ block_size. The flash backend extends a non-empty cache one
        token at a time only (its kernel takes no explicit mask).
        """
        B, T, C = x.shape
        q, k, v = self._qkv(x, cache.length if cache is not None else 0)  # each (B, n_head, T, d_k)
        if cache is not None:
            k, v = cache.append(k, v)  # each (B, n_head, L, d_k), L = positions so far
        L = k.size(2)
        if cache is not None and cache.keep_weights:  # the last query's row: (B, n_head, L)
            cache.weights = causal_attention_weights(q[:, :, -1:], k, self._causal_mask(1, L))[:, :, 0]
        if self.backend == "naive":
            weights = self.attn_dropout(self._weights(q, k))  # (B, n_head, T, L)
            y = weights @ v  # (B, n_head, T, d_k)
        else:
            p = self.dropout if self.training else 0.0  # never drop in eval
            # is_causal aligns its mask top-left, right only when T == L; one new token may
            # see every cached key; otherwise pass the bottom rows of the causal mask
            mask = None if T in (1, L) else self._causal_mask(T, L)
            kernel = sdpa_kernel(SDPBackend.FLASH_ATTENTION) if self.backend == "flash" else nullcontext()
            with kernel:
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p,
                                                   is_causal=T == L and T > 1)  # (B, n_head, T, d_k)
        if self.off is not None:  # switched-off heads: their output replaced (`ablate`), before W_O
            y = torch.where(self.off[:, None, None], self.off_value.to(y.dtype), y)  # (B, n_head, T, d_k)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # merge heads: (B, T, n_embd)
        return self.resid_dropout(self.c_proj(y))  # (B, T, n_embd)

    @torch.no_grad()
    def attention_weights(self, x: torch.Tensor) -> torch.Tensor:
        """The attention weights this layer computes for x, whatever the backend.

        x: (B, T, n_embd) → (B, n_head, T, T) float, eval semantics (no dropout): rows sum
        to 1, the upper triangle is exactly 0. The fused kernels cannot return weights, so
        they are computed explicitly here, for the inspected batch only.
        """
        q, k, _ = self._qkv(x)
        return self._weights(q, k)
