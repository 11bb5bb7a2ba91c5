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


def attention_grid(maps: np.ndarray, labels: list[str], title: str = "",
                   row_titles: list[str] | None = None, col_titles: list[str] | None = None) -> Figure:
    """A grid of heatmaps: one row of heads, or several rows (e.g. layers, or a trained
    model's heads above its baselines).

    maps: (n_head, T, T) or (n_rows, n_cols, T, T) float in [0, 1], row i of a map = where
    position i looks; labels: T tick labels (characters; any the font lacks are shown as
    code points); row_titles: n_rows labels on the left; col_titles: n_cols panel titles
    over the first row (default `head h`). Colour scale 0 … 1 for every panel; the upper
    triangle (future positions, weight 0 by causality) is left blank. Panels grow with T
    so the labels stay legible. raises ValueError on shape or title-count mismatch.
    """
    maps = np.asarray(maps, dtype=float)
    if maps.ndim == 3:
        maps = maps[None]
    if maps.ndim != 4 or maps.shape[2] != maps.shape[3] or maps.shape[2] != len(labels):
        raise ValueError(f"maps must be (n_head, T, T) or (n_rows, n_cols, T, T) with T = len(labels) = {len(labels)}, "
                         f"got {maps.shape}")
    n_rows, n_cols, T, _ = maps.shape
    col_titles = col_titles or [f"head {h}" for h in range(n_cols)]
    if len(col_titles) != n_cols or (row_titles is not None and len(row_titles) != n_rows):
        raise ValueError(f"need {n_cols} column titles and {n_rows} row titles, "
                         f"got {len(col_titles)} and {len(row_titles or [])}")
    font = chinese_font()
    labels = [tick_label(t) for t in labels]
    panel = max(2.0, 0.12 * T)  # inches per panel, so the labels stay legible
    left, right, top, bottom = 1.2 if row_titles else 0.6, 1.0, 0.7, 0.7  # margins, inches
    width, height = left + panel * n_cols + right, top + panel * n_rows + bottom
    # a fixed layout (no layout engine) and tick labels on the outer panels only: several
    # times faster to draw than a constrained layout labelling every panel
    fig = Figure(figsize=(width, height))
    axes = fig.subplots(n_rows, n_cols, squeeze=False, gridspec_kw=dict(
        left=left / width, right=1 - right / width, top=1 - top / height, bottom=bottom / height,
        wspace=0.08, hspace=0.08))
    future = np.triu(np.ones((T, T), dtype=bool), k=1)
    image = None
    for r in range(n_rows):
        for c in range(n_cols):
            ax = axes[r, c]
            image = ax.imshow(np.ma.masked_where(future, maps[r, c]), vmin=0.0, vmax=1.0, cmap="viridis")
            if r == 0:
                ax.set_title(col_titles[c], fontsize=9)
            ax.tick_params(length=0)
            if r == n_rows - 1:
                ax.set_xticks(range(T), labels, fontproperties=font, fontsize=7)
            else:
                ax.set_xticks([])
            if c == 0:
                ax.set_yticks(range(T), labels, fontproperties=font, fontsize=7)
            else:
                ax.set_yticks([])
            for text in ax.get_xticklabels():  # `<bos>`, code points: upright they would overlap
                text.set_rotation(90 if len(text.get_text()) > 1 else 0)
        if row_titles is not None:
            axes[r, 0].set_ylabel(row_titles[r], fontproperties=font, fontsize=9)
    bar = fig.add_axes((1 - 0.75 / width, bottom / height, 0.15 / width, min(1.0, 3.0 / height)))
    fig.colorbar(image, cax=bar, label="attention weight")
    if title:
        fig.suptitle(title, fontproperties=font, fontsize=10, y=1 - 0.15 / height)
    return fig
