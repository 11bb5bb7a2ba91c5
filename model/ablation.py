"""Switching attention heads off (ablation), as interpretability work tests what a head is for
(Michel et al. 2019, "Are Sixteen Heads Really Better than One?"; Olsson et al. 2022): the
named heads' outputs, before the heads are merged and W_O, are replaced by zero
(`ablate_mode=zero`) or by each head's mean output over positions of training-split poems
(`mean`: mean ablation, which keeps the layer's input to W_O at its usual scale). A forward
pre-hook on each layer's W_O (`c_proj`, whose input is the merged heads, head h in columns
h·d_k … (h+1)·d_k − 1) replaces them, so the attention module itself holds no state for it and
is the same on every backend, with or without the KV cache; generation, `nats` and the attention
maps of later layers all see it. `model.loading.load_engine(ablate=…)` sets it.
"""
from __future__ import annotations

import re
from collections.abc import Sequence

import torch
import torch.nn as nn
from torch.utils.hooks import RemovableHandle

from model.engine import Engine, pad

MODES = ("zero", "mean")
MEAN_POEMS = 256
"""ablate_mode=mean: the mean output of each head over every position of this many training poems."""


def ablated_suffix(ablated: Sequence[str], mode: str) -> str:
    """The part of a default output folder that keeps an ablated run's results apart from the
    model's own: `-ablate-L3H1-L3H0-zero`, or "" with no head off."""
    return f"-ablate-{'-'.join(ablated)}-{mode}" if ablated else ""


def parse_heads(names: Sequence[str], n_layer: int, n_head: int) -> list[tuple[int, int]]:
    """Head names `L<layer>H<head>` (e.g. `L3H2`; one name alone as a string too: `ablate=L3H2`) →
    [(layer, head)], in order, without repeats. raises ValueError in one line for a malformed name or a
    head the model does not have."""
    heads = []
    for name in [names] if isinstance(names, str) else names:
        m = re.fullmatch(r"L(\d+)H(\d+)", str(name).strip())
        if not m:
            raise ValueError(f"ablate: {name!r} is not a head name; name heads L<layer>H<head>, e.g. L3H2")
        layer, head = int(m[1]), int(m[2])
        if layer >= n_layer or head >= n_head:
            raise ValueError(f"ablate: {name} is not a head of this model, which has layers 0–{n_layer - 1} and "
                             f"heads 0–{n_head - 1} (L0H0 … L{n_layer - 1}H{n_head - 1})")
        if (layer, head) not in heads:
            heads.append((layer, head))
    return heads


@torch.no_grad()
def head_means(engine: Engine, poems: Sequence[str]) -> torch.Tensor:
    """Each head's mean output (its weights @ v) over every position of `poems` (text in the
    model's script, each fed from `<bos>`, at most block_size − 1 characters): (n_layer, n_head, d_k).
    Read at the input of each layer's W_O (`c_proj`) with forward hooks, with no head ablated."""
    gpt, cfg = engine.model, engine.model.cfg
    idx, lengths = pad([engine.encode_line(p, "training poem")[0][0] for p in poems], engine.device)  # (B, T)
    real = torch.arange(idx.size(1), device=idx.device)[None] < lengths[:, None]  # (B, T)
    sums = []
    hooks = [block.attn.c_proj.register_forward_pre_hook(lambda m, args: sums.append(
        (args[0].float() * real[..., None]).sum((0, 1)))) for block in gpt.blocks]  # padding after: causal, unread
    try:
        gpt(idx)
    finally:
        for h in hooks:
            h.remove()
    d_k = cfg.n_embd // cfg.n_head
    return (torch.stack(sums) / real.sum()).view(cfg.n_layer, cfg.n_head, d_k)


def switch_off(attn: nn.Module, heads: Sequence[int], values: torch.Tensor | None = None) -> RemovableHandle:
    """Switch heads of one `CausalSelfAttention` off until the returned handle's `remove()`: the
    output of each head in `heads` (its weights @ v) becomes values[i] ((len(heads), d_k) float;
    None: zero) at every position. raises ValueError for a head outside 0 … n_head − 1 or values
    of another shape."""
    if bad := [h for h in heads if not 0 <= h < attn.n_head]:
        raise ValueError(f"head {bad[0]} is not one of this layer's heads 0 … {attn.n_head - 1}")
    if values is not None and tuple(values.shape) != (len(heads), attn.d_k):
        raise ValueError(f"values must be ({len(heads)}, {attn.d_k}), got {tuple(values.shape)}")
    off = torch.zeros(attn.n_head, 1, dtype=torch.bool)  # (n_head, 1)
    off[list(heads)] = True
    value = torch.zeros(attn.n_head, attn.d_k)  # (n_head, d_k)
    if values is not None:
        value[list(heads)] = values.detach().float().cpu()

    def replace(module, args):  # args[0]: the merged heads, (B, T, n_embd)
        y = args[0].unflatten(-1, (attn.n_head, attn.d_k))  # (B, T, n_head, d_k)
        return torch.where(off.to(y.device), value.to(y.device, y.dtype), y).flatten(-2)

    return attn.c_proj.register_forward_pre_hook(replace)


def ablate(engine: Engine, names: Sequence[str], mode: str = "zero", poems: Sequence[str] = ()) -> None:
    """Switch the named heads off in engine's model (every head on again first); names as
    `parse_heads`; mode zero | mean (mean: over `poems`, training-split poems, `head_means`).
    raises ValueError for a bad name or mode, or mode=mean without poems."""
    if mode not in MODES:
        raise ValueError(f"ablate_mode={mode!r} is not one of {', '.join(MODES)}")
    cfg = engine.model.cfg
    heads = parse_heads(names, cfg.n_layer, cfg.n_head)
    for hook in engine.ablation_hooks:
        hook.remove()
    engine.ablation_hooks.clear()
    engine.ablated.clear()
    if heads and mode == "mean" and not poems:
        raise ValueError("ablate_mode=mean needs training poems for the heads' mean outputs")
    means = head_means(engine, poems) if heads and mode == "mean" else None
    for layer, block in enumerate(engine.model.blocks):
        mine = [h for ly, h in heads if ly == layer]
        if mine:
            engine.ablation_hooks.append(switch_off(block.attn, mine, None if means is None else means[layer, mine]))
    engine.ablated.extend(f"L{ly}H{h}" for ly, h in heads)
