"""The KV cache of decoding: each attention layer keeps the keys and values of the positions it
has seen, so a step computes q, k, v for the new token only instead of for the whole context
again. `Cache` is a GPT's (one `KVCache` per layer, and the text so far); the inference engine
(`model/engine.py`) makes one per generation and feeds it to `GPT.forward`.
"""
from __future__ import annotations

import torch

from model.attention import causal_attention_weights


class KVCache:
    """One layer's keys and values: k, v (B, n_head, block_size, d_k), filled up to `length`,
    allocated at the first `append` with its batch size, device and dtype (so autocast works).
    keep_weights: each append also leaves in `weights` the attention row of its last query,
    (B, n_head, length), computed explicitly whatever the backend (the fused kernels return
    none): what a viewer shows beside a drawn token."""

    def __init__(self, block_size: int, keep_weights: bool = False):
        self.block_size, self.length, self.keep_weights = block_size, 0, keep_weights
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.weights: torch.Tensor | None = None

    def append(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q, k, v: (B, n_head, T, d_k) of the next T positions → every key and value so far,
        (B, n_head, length + T, d_k) each. raises ValueError if the cache would pass block_size."""
        start, end = self.length, self.length + k.size(2)
        if end > self.block_size:
            raise ValueError(f"KV cache holds {self.block_size} positions (block_size); cannot add up to {end}")
        if self.k is None:
            shape = (k.size(0), k.size(1), self.block_size, k.size(3))
            self.k, self.v = k.new_empty(shape), v.new_empty(shape)
        self.k[:, :, start:end], self.v[:, :, start:end] = k, v
        self.length = end
        if self.keep_weights:  # the last query sees every key: (B, n_head, length)
            self.weights = causal_attention_weights(q[:, :, -1:], self.k[:, :, :end])[:, :, 0]
        return self.k[:, :, :end], self.v[:, :, :end]


class Cache:
    """A GPT's KV cache: one `KVCache` per layer (`layers`), and `ids` (B, N) int64, every token fed
    so far: the text's history, which the structure inputs read.

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
