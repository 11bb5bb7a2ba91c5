import json
import warnings

import numpy as np
import pytest
from matplotlib.figure import Figure

from data.datamodule import PoetryDataModule
from model.inspection.plots import _charmap, attention_grid, chinese_font, tick_label


def render(fig: Figure) -> list[str]:
    """Draw the figure; return the messages of any warnings (missing glyphs warn)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig.canvas.draw()
    return [str(w.message) for w in caught]


def causal_maps(n_head, T):
    rng = np.random.default_rng(0)
    m = np.tril(rng.random((n_head, T, T)))
    return m / m.sum(-1, keepdims=True)


def test_probe_line_renders_without_missing_glyphs():
    labels = ["<bos>", *"床前明月光，疑是地上霜。"]
    fig = attention_grid(causal_maps(4, len(labels)), labels, title="layer 0 · 床前明月光")
    assert render(fig) == []
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == labels
    image = ax.get_images()[0]
    assert image.get_clim() == (0.0, 1.0)
    assert np.ma.getmaskarray(image.get_array())[0, 1] and not np.ma.getmaskarray(image.get_array())[1, 0]


def test_grid_of_rows_shares_one_colour_scale_and_labels_the_outer_panels():
    labels = ["<bos>", *"床前，"]
    maps = np.stack([causal_maps(3, 4), np.tile(np.eye(4), (3, 1, 1))])  # (2 rows, 3 columns, T, T)
    fig = attention_grid(maps, labels, row_titles=["trained", "lesson §3\nrandom q, k"],
                         col_titles=["a", "b", "c"])
    assert render(fig) == []
    panels = [ax for ax in fig.axes if ax.get_images() and ax.get_label() != "<colorbar>"]
    assert len(panels) == 6
    assert all(ax.get_images()[0].get_clim() == (0.0, 1.0) for ax in panels)
    assert all(np.ma.getmaskarray(ax.get_images()[0].get_array())[np.triu_indices(4, 1)].all() for ax in panels)
    assert [t.get_text() for t in panels[3].get_xticklabels()] == labels  # bottom row: characters
    assert panels[0].get_xticklabels() == [] and panels[0].get_ylabel() == "trained"
    assert [ax.get_title() for ax in panels[:3]] == ["a", "b", "c"]
    with pytest.raises(ValueError, match="row titles"):
        attention_grid(maps, labels, row_titles=["only one"])


def test_every_character_of_the_shipped_vocabulary_has_a_label_with_glyphs(tmp_path):
    """The real corpus: BMP characters render as themselves, rarer ones (CJK Ext. B) as code points."""
    from data.build_corpus import CORPUS_DIR

    dm = PoetryDataModule(str(CORPUS_DIR / "tang.jsonl.xz"), str(tmp_path / "cache"))
    chars = dm.tokenizer.itos[2:]
    labels = [tick_label(c) for c in chars]
    assert all(lab == c for c, lab in zip(chars, labels) if ord(c) < 0x10000)
    assert sum(lab != c for c, lab in zip(chars, labels)) < 0.05 * len(chars)
    fig = Figure()
    font = chinese_font()
    for i in range(0, len(labels), 400):
        fig.text(0, 0, "".join(labels[i:i + 400]), fontproperties=font)
    assert render(fig) == []
    assert json.loads((dm.cache_dir / "meta.json").read_text())["vocab_size"] == len(chars) + 2


def test_font_lacks_rare_characters_so_labels_say_the_code_point():
    assert ord("𠜴") not in _charmap()
    assert tick_label("𠜴") == "U+20734" and tick_label("床") == "床"


def test_shape_mismatch_is_refused():
    with pytest.raises(ValueError, match="n_head, T, T"):
        attention_grid(np.zeros((2, 3, 3)), ["a", "b"])
    with pytest.raises(ValueError, match="n_rows, n_cols, T, T"):
        attention_grid(np.zeros((1, 2, 2, 3, 3)), ["a", "b", "c"])
