"""Attention-map figures with Chinese tick labels.

Matplotlib's default font has no Chinese glyphs, so the labels use Noto Sans CJK SC, the
font file shipped by the `mplfonts` package. Figures are plain `matplotlib.figure.Figure`
objects (no pyplot state), so nothing stays open once the caller drops them.
"""
from __future__ import annotations

import importlib.resources
from functools import lru_cache

import numpy as np
from matplotlib import font_manager
from matplotlib.figure import Figure

FONT_FILE = "NotoSansCJKsc-Regular.otf"


@lru_cache(maxsize=None)
def chinese_font() -> font_manager.FontProperties:
    """FontProperties of Noto Sans CJK SC from `mplfonts`, registered with Matplotlib.

    raises FileNotFoundError if the package's font file is missing (reinstall mplfonts).
    """
    path = importlib.resources.files("mplfonts") / "fonts" / FONT_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall the font package: pip install --force-reinstall mplfonts")
    font_manager.fontManager.addfont(str(path))
    return font_manager.FontProperties(fname=str(path))


@lru_cache(maxsize=None)
def _charmap() -> frozenset[int]:
    from matplotlib.ft2font import FT2Font

    return frozenset(FT2Font(chinese_font().get_file()).get_charmap())


def tick_label(token: str) -> str:
    """The token itself where the font has its glyphs, else its code points (`U+20734`):
    a label that says which character it is instead of an empty box."""
    if all(ord(c) in _charmap() for c in token):
        return token
    return " ".join(f"U+{ord(c):04X}" for c in token)


def attention_grid(maps: np.ndarray, labels: list[str], title: str = "") -> Figure:
    """One row of heatmaps, one per head.

    maps: (n_head, T, T) float in [0, 1], row i = where position i looks; labels: T tick
    labels (characters; any the font lacks are shown as code points). Colour scale 0 … 1 for every panel; the upper triangle (future
    positions, weight 0 by causality) is left blank. raises ValueError on shape mismatch.
    """
    maps = np.asarray(maps, dtype=float)
    if maps.ndim != 3 or maps.shape[1] != maps.shape[2] or maps.shape[1] != len(labels):
        raise ValueError(f"maps must be (n_head, T, T) with T = len(labels) = {len(labels)}, got {maps.shape}")
    n_head, T, _ = maps.shape
    font = chinese_font()
    labels = [tick_label(t) for t in labels]
    fig = Figure(figsize=(2.3 * n_head + 0.8, 2.6), layout="constrained")
    axes = fig.subplots(1, n_head, squeeze=False)[0]
    future = np.triu(np.ones((T, T), dtype=bool), k=1)
    image = None
    for h, ax in enumerate(axes):
        image = ax.imshow(np.ma.masked_where(future, maps[h]), vmin=0.0, vmax=1.0, cmap="viridis")
        ax.set_title(f"head {h}", fontsize=9)
        ax.set_xticks(range(T), labels, fontproperties=font, fontsize=7)
        ax.set_yticks(range(T), labels if h == 0 else [""] * T, fontproperties=font, fontsize=7)
        ax.tick_params(length=0)
    fig.colorbar(image, ax=list(axes), shrink=0.8, label="attention weight")
    if title:
        fig.suptitle(title, fontproperties=font, fontsize=10)
    return fig
