"""An interactive attention view: one self-contained HTML page (no network, no CDN).

The page is the template `attention_view.html` (plain JavaScript and CSS, no build step)
with the data embedded as JSON. It shows the text along the top; hovering or clicking a
character shows its attention row as a heat strip in every head (or in one head, beside
a T × T heatmap), weights on hover, each head beside the same head of the baselines
(the model at initialisation, the lesson's random maps) and labelled with its verdict.
Why a page of our own and not bertviz or CircuitsVis: docs/attention-view.md.

Inputs are plain arrays (numpy, torch on the CPU, nested lists), so the studio can build
the same page, and its script (`MingyueAttention.mount`, `view.appendStep`) can grow a
view one generated token at a time.
"""
from __future__ import annotations

import html
import importlib.resources
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from matplotlib import colormaps

from model.inspection.attention_stats import STATISTICS

SCALE = 10_000
"""Weights are embedded as integers in units of 1/SCALE: a rounding error ≤ 0.5/SCALE = 5e-5."""

TEMPLATE = "attention_view.html"


def quantised(weights: torch.Tensor) -> list:
    """Attention weights (float, any shape) → nested lists of integers in units of 1/SCALE."""
    return torch.round(weights * SCALE).int().tolist()


def prompt_rows(model, ids: Sequence[int], first: int) -> list[dict]:
    """The attention rows of the positions first … len(ids) − 2 of a text (token ids) that no
    generation step computed (a prompt), from one pass of `model` (a GPT) over the text's last
    block_size tokens: [{"pos": position, "start": the pass's first position, "w": [layer][head][key]
    in units of 1/SCALE over the keys start … pos}] (the studio's `rows`)."""
    window = torch.tensor([list(ids)[-model.cfg.block_size:]], device=model.wte.weight.device)  # (1, T)
    start = len(ids) - window.size(1)
    maps = torch.stack(model.attention_maps(window))[:, 0]  # (n_layer, n_head, T, T)
    return [{"pos": p, "start": start, "w": quantised(maps[:, :, p - start, : p - start + 1])}
            for p in range(max(first, start), len(ids) - 1)]


@dataclass
class ProbeView:
    """One text of a view.

    tokens: the T strings the positions hold (`<bos>` first, then the characters);
    maps: {label: weights}, the first the model's (e.g. "trained"), the others its
    baselines in display order; weights (n_layer, n_head, T, T), or (n_head, T, T) for one
    set of maps shown beside head h of every layer (the lesson's map h), row i = where
    position i looks (rows sum to 1, zero above the diagonal); verdicts: {label: rows of
    `model.inspection.attention_stats.head_rows`} (e.g. "probe line", "held-out poems"):
    each head's pattern, flags and statistics.
    """

    tokens: Sequence[str]
    maps: Mapping[str, object]
    verdicts: Mapping[str, Sequence[Mapping]] = field(default_factory=dict)


def _check_maps(label: str, weights: object, T: int, shape: tuple[int, int] | None) -> np.ndarray:
    """weights as (n_layer or 1, n_head, T, T) float64; raises ValueError on a bad shape or value."""
    m = np.asarray(weights, dtype=np.float64)
    if m.ndim == 3:
        m = m[None]
    if m.ndim != 4 or m.shape[2:] != (T, T):
        raise ValueError(f"maps[{label!r}] must be (n_layer, n_head, T, T) or (n_head, T, T) with T = {T}, "
                         f"got {np.shape(weights)}")
    if shape is not None and (m.shape[1] != shape[1] or m.shape[0] not in (1, shape[0])):
        raise ValueError(f"maps[{label!r}] has {m.shape[0]} layers × {m.shape[1]} heads; the model has "
                         f"{shape[0]} × {shape[1]} (or give one set of {shape[1]} maps)")
    if not np.isfinite(m).all() or m.min() < -1e-6 or m.max() > 1 + 1e-6:
        raise ValueError(f"maps[{label!r}] must hold attention weights in [0, 1], got {m.min()} … {m.max()}")
    return m


def _rows(m: np.ndarray) -> list:
    """(L, H, T, T) → nested lists [layer][head][row i] of the i + 1 causal weights in units of 1/SCALE."""
    q = np.rint(m * SCALE).astype(np.int64)
    T = m.shape[-1]
    return [[[q[layer, head, i, : i + 1].tolist() for i in range(T)] for head in range(m.shape[1])]
            for layer in range(m.shape[0])]


def _figure(v) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else round(float(v), 4)


def _verdicts(rows: Sequence[Mapping], statistics: Sequence[str]) -> list[dict]:
    return [{"layer": int(r["layer"]), "head": int(r["head"]), "pattern": r["pattern"], "flags": dict(r["flags"]),
             "stats": {n: _figure(r.get(n)) for n in statistics}} for r in rows]


def view_data(probes: Sequence[ProbeView], title: str = "", statistics: Sequence[str] = STATISTICS,
              effects: Mapping[str, str] | None = None) -> dict:
    """The JSON the page's script reads.

    probes: one or more texts, the same map labels and model shape in each; title: shown
    on top; statistics: the names of the verdicts' figures, in table order; effects: head name
    (`L3H1`) → what switching it off did, one line on its card → {"title", "scale", "effects",
    "colormap" (256 viridis colours as one hex string, the PNGs' scale 0 … 1), "statistics", "kinds" (map labels),
    "n_layer", "n_head", "probes": [{"tokens", "maps": [kind][layer][head][row] integer
    weights in units of 1/scale, "verdicts": [{"label", "heads"}]}]}. raises ValueError
    for no probes, different labels or shapes, or weights that are not causal maps.
    """
    if not probes:
        raise ValueError("need at least one probe")
    kinds = list(probes[0].maps)
    if not kinds:
        raise ValueError("need at least the model's maps")
    shape, out = None, []
    for p, probe in enumerate(probes):
        if list(probe.maps) != kinds:
            raise ValueError(f"probe {p} has maps {list(probe.maps)}, probe 0 has {kinds}")
        tokens = [str(t) for t in probe.tokens]
        maps = []
        for label in kinds:
            m = _check_maps(label, probe.maps[label], len(tokens), shape)
            shape = shape or m.shape[:2]
            maps.append(_rows(m))
        out.append({"tokens": tokens, "maps": maps,
                    "verdicts": [{"label": label, "heads": _verdicts(rows, statistics)}
                                 for label, rows in probe.verdicts.items()]})
    return {"title": title, "scale": SCALE, "effects": dict(effects or {}), "colormap": colormap(),
            "statistics": list(statistics), "kinds": kinds,
            "n_layer": int(shape[0]), "n_head": int(shape[1]), "probes": out}


def colormap() -> str:
    """The page's colour scale: matplotlib's viridis from 0 to 1 (the PNGs' scale), 256 colours as
    one string of 6-digit hex RGB."""
    lut = colormaps["viridis"](np.linspace(0.0, 1.0, 256))[:, :3]
    return "".join(f"{r:02x}{g:02x}{b:02x}" for r, g, b in np.rint(lut * 255).astype(int))


def _template() -> str:
    return importlib.resources.files(__package__).joinpath(TEMPLATE).read_text(encoding="utf-8")


def assets() -> tuple[str, str]:
    """The view's style sheet and script, (CSS, JavaScript), for a page that mounts views
    itself (the studio: `MingyueAttention.mount(root, data)`). raises RuntimeError if the
    template lost either."""
    found = re.search(r"<style>\n(.*?)</style>.*<script>\n(/\* MingyueAttention.*?)</script>", _template(), re.S)
    if not found:
        raise RuntimeError(f"{TEMPLATE} lost its <style> or its MingyueAttention <script>")
    return found.group(1), found.group(2)


def page(data: dict | None = None, title: str = "") -> str:
    """The template with `data` (from `view_data`) embedded; None embeds nothing, for a page
    whose script is fed later (`MingyueAttention.mount(root, data)`)."""
    template = _template()
    payload = "null" if data is None else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    payload = payload.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")  # stays inside <script>
    slot = '<script id="mingyue-data" type="application/json">null</script>'
    if template.count(slot) != 1 or template.count("<title>attention</title>") != 1:
        raise RuntimeError(f"{TEMPLATE} lost its data or title slot")
    return (template.replace("<title>attention</title>", f"<title>{html.escape(title or 'attention')}</title>")
            .replace(slot, slot.replace("null", payload)))


def attention_view_html(probes: Sequence[ProbeView], title: str = "", statistics: Sequence[str] = STATISTICS,
                        effects: Mapping[str, str] | None = None) -> str:
    """One self-contained HTML page of the probes' attention (see `view_data` for the
    arguments and errors): no external script, style sheet or font (its size for the
    default model: docs/attention-view.md)."""
    return page(view_data(probes, title, statistics, effects), title)
