"""The attention view's HTML builder: self-contained, small, and holding the weights it was given."""
import json
import re

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from model.inspection.attention_stats import STATISTICS, head_rows, head_statistics
from model.inspection.attention_view import SCALE, ProbeView, attention_view_html, page, view_data
from tests.conftest import ROOT
from tests.html_views import dense, embedded_data

PROBES = [p if isinstance(p, str) else p.text
          for p in OmegaConf.load(ROOT / "conf" / "callbacks" / "default.yaml").attention_maps.probe_lines]


def causal(shape, seed=0):
    """Random causal maps (..., T, T): rows of random weights (many digits each) summing to 1."""
    m = np.tril(np.random.default_rng(seed).random(shape))
    return m / m.sum(-1, keepdims=True)


def default_views(n_layer=4, n_head=4) -> list[ProbeView]:
    """The callback's view of the default probe lines for a model of the default shape, on random maps."""
    views = []
    for p, line in enumerate(PROBES):
        tokens = ["<bos>", *line]
        T = len(tokens)
        trained = causal((n_layer, n_head, T, T), seed=p)
        baselines = {name: {n: torch.rand(8) for n in STATISTICS} for name in ("random_qk", "init")}
        heads = head_rows(head_statistics(torch.from_numpy(trained), tokens), baselines)
        views.append(ProbeView(tokens, {"trained": trained, "at initialisation": causal((n_layer, n_head, T, T), 10 + p),
                                        "lesson §3": causal((n_head, T, T), 20 + p),
                                        "lesson §5": causal((n_head, T, T), 30 + p)}, {"probe line": heads}))
    return views


def test_default_view_is_self_contained_and_under_300_kb():
    html = attention_view_html(default_views(), "attention · step 0")
    size = len(html.encode("utf-8"))
    assert 50_000 < size <= 300_000, size  # docs/attention-view.md states the figure
    assert not re.search(r"https?:|<link|@import|url\(", html)  # nothing fetched: no CDN, style sheet or font
    assert not re.search(r"<script[^>]*\bsrc=", html)
    assert html.count("<script") == 2 and html.startswith("<!DOCTYPE html>")


def test_embedded_weights_equal_the_inputs_within_the_rounding():
    views = default_views(n_layer=2, n_head=3)
    data = embedded_data(attention_view_html(views))
    assert (data["scale"], data["n_layer"], data["n_head"]) == (SCALE, 2, 3)
    assert data["kinds"] == ["trained", "at initialisation", "lesson §3", "lesson §5"]
    assert len(data["colormap"]) == 256 * 6 and data["colormap"][:6] == "440154"  # viridis, as the PNGs
    for view, probe in zip(views, data["probes"]):
        assert probe["tokens"] == list(view.tokens)
        T = len(view.tokens)
        for k, (label, weights) in enumerate(view.maps.items()):
            rows = probe["maps"][k]
            assert [len(r) for r in rows[0][0]] == list(range(1, T + 1))  # row i: the i + 1 causal weights
            expected = weights if weights.ndim == 4 else weights[None]  # one set of lesson maps for every layer
            got = dense(rows, data["scale"])
            assert got.shape == expected.shape, label
            np.testing.assert_allclose(got, expected, rtol=0, atol=0.5 / SCALE + 1e-12)
            assert np.abs(got - expected).max() > 1e-6  # rounded, not copied: the tolerance above is the rounding
        (verdicts,) = probe["verdicts"]
        assert verdicts["label"] == "probe line"
        for got, want in zip(verdicts["heads"], view.verdicts["probe line"]):
            assert (got["layer"], got["head"], got["pattern"], got["flags"]) == \
                   (want["layer"], want["head"], want["pattern"], want["flags"])
            assert [got["stats"][n] for n in STATISTICS] == pytest.approx(
                [want[n] for n in STATISTICS], abs=5e-5, nan_ok=True)


def test_view_takes_torch_tensors_and_lists():
    maps = torch.softmax(torch.randn(1, 2, 3, 3).masked_fill(~torch.ones(3, 3, dtype=torch.bool).tril(), -1e9), -1)
    a = view_data([ProbeView(["<bos>", "床", "前"], {"m": maps})])
    b = view_data([ProbeView(("<bos>", "床", "前"), {"m": maps.tolist()})])
    assert a == b and a["probes"][0]["maps"][0][0][1][2] == [round(SCALE * maps[0, 1, 2, j].item()) for j in range(3)]


def test_text_cannot_end_the_script():
    tokens = ["<bos>", "</script>", "<b>&"]
    html = attention_view_html([ProbeView(tokens, {"m": causal((1, 1, 3, 3))})], title="<i>x</i>")
    assert html.count("</script>") == 2 and "<title>&lt;i&gt;x&lt;/i&gt;</title>" in html
    assert embedded_data(html)["probes"][0]["tokens"] == tokens


def test_empty_page_for_a_view_fed_later():
    assert json.loads(re.search(r'"application/json">(.*?)</script>', page()).group(1)) is None
    data = view_data([ProbeView(["<bos>"], {"m": np.ones((1, 1, 1, 1))})])
    assert data["probes"][0]["maps"] == [[[[[SCALE]]]]]


@pytest.mark.parametrize("maps, message", [
    ({"m": np.ones((2, 2, 3, 3))}, r"with T = 2, got \(2, 2, 3, 3\)"),
    ({"m": causal((2, 2, 2, 2)), "b": causal((3, 2, 2, 2))}, r"maps\['b'\] has 3 layers × 2 heads; the model has 2 × 2"),
    ({"m": causal((2, 2, 2, 2)), "b": causal((3, 2, 2))}, r"maps\['b'\] has 1 layers × 3 heads"),
    ({"m": causal((2, 2, 2, 2)) * 2}, r"weights in \[0, 1\], got 0.0 … 2.0"),
    ({"m": np.full((1, 1, 2, 2), np.nan)}, r"weights in \[0, 1\]"),
    ({"m": np.ones((2, 2))}, r"maps\['m'\] must be \(n_layer, n_head, T, T\) or \(n_head, T, T\) with T = 2, got \(2, 2\)"),
    ({}, "need at least the model's maps"),
])
def test_bad_maps_are_refused_with_their_label(maps, message):
    with pytest.raises(ValueError, match=message):
        view_data([ProbeView(["<bos>", "床"], maps)])


def test_probes_must_have_the_same_kinds():
    a = ProbeView(["<bos>"], {"trained": np.ones((1, 1, 1, 1))})
    b = ProbeView(["<bos>"], {"init": np.ones((1, 1, 1, 1))})
    with pytest.raises(ValueError, match=r"probe 1 has maps \['init'\], probe 0 has \['trained'\]"):
        view_data([a, b])
    with pytest.raises(ValueError, match="at least one probe"):
        view_data([])
