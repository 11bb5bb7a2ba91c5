"""attention_maps.py's HTML view in headless Chromium, loaded from file:// with the network off
(`python -m pytest -m browser`; .ci/run installs Chromium, a CJK font and Playwright).

The page shows weights with 4 decimals of values embedded in units of 1e-4, so a shown
weight is within 5e-5 of the array (1e-4 below); a weight of another row, column, head or
map differs by far more in these maps (q and k scaled up: sharp, different per head).
"""
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from attention_maps import attention_report
from model.inspection.attention_stats import random_head_maps, random_qk_maps
from model.inspection.attention_view import page as empty_page
from model.loading import build_gpt, load_engine, model_fields
from tests.conftest import write_corpus
from tests.html_views import embedded_data
from tests.test_attention_maps import report_cfg, write_checkpoint

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
TEXT = "床前明月光，疑是地上霜。"
N_LAYER, N_HEAD = 2, 2


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs Playwright's Python package: pip install "
                                                                  "playwright (the browser: apt-get install chromium)")
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"needs Chromium at {CHROMIUM}: apt-get install -y chromium fonts-noto-cjk")
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield chromium
        chromium.close()


def sharp_checkpoint(path: Path) -> Path:
    """A tiny untrained model whose q and k weights are scaled up ×20: sharp maps, a different pattern per head."""
    write_checkpoint(path, n_layer=N_LAYER, seed=0)
    ckpt = torch.load(path, weights_only=True)
    for name, w in ckpt["state_dict"].items():
        if name.endswith("attn.c_attn.weight"):
            w[: 2 * w.size(1)] *= 20.0  # the W_q and W_k rows
    torch.save(ckpt, path)
    return path


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """attention_maps.py's view of TEXT, and the maps it shows as arrays computed here: (4 kinds,
    n_layer, n_head, T, T), the lesson's maps repeated for every layer."""
    tmp = tmp_path_factory.mktemp("view")
    ckpt = sharp_checkpoint(tmp / "checkpoints" / "run" / "last.ckpt")
    report = attention_report(report_cfg(tmp, write_corpus(tmp / "tang.jsonl.xz"), ckpt, f"text='{TEXT}'",
                                         "heldout.n_poems=2"))
    engine = load_engine(ckpt)
    idx, tokens = engine.encode_line(TEXT)
    torch.manual_seed(1337)  # conf/attention_maps.yaml's init_seed
    init = build_gpt(model_fields(engine.model.cfg), engine.tokenizer, engine.script).eval()
    with torch.no_grad():
        trained, at_init = (torch.stack(m.attention_maps(idx), 1)[0] for m in (engine.model, init))  # (L, H, T, T)
    T = len(tokens)
    lesson = [m.expand(N_LAYER, -1, -1, -1) for m in (random_qk_maps(T, N_HEAD, 8, 0),
                                                      random_head_maps(T, N_HEAD, 16, 8, 0))]
    arrays = torch.stack([trained, at_init, *lesson]).double().numpy()
    assert np.abs(arrays[0] - arrays[1]).max() > 0.1 and np.abs(arrays[0, :, 0] - arrays[0, :, 1]).max() > 0.1
    return Path(report["html"]), report, tokens, arrays


@pytest.fixture
def view(browser, exported):
    """The exported page open in an offline context; yields (page, the URLs it requested, its errors)."""
    context = browser.new_context(offline=True, viewport={"width": 960, "height": 480})
    page = context.new_page()
    requests, errors = [], []
    page.on("request", lambda r: requests.append(r.url))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(exported[0].as_uri())
    page.wait_for_selector(".head")
    yield page, requests, errors
    context.close()


def shown_strips(page) -> list[dict]:
    """Every strip of the all-heads grid: its kind, layer, head, query and shown weights (None after the query)."""
    return page.eval_on_selector_all(".grid .strip", """strips => strips.map(s => ({
        kind: +s.dataset.kind, layer: +s.dataset.layer, head: +s.dataset.head, query: +s.dataset.query,
        weights: [...s.children].map(c => c.dataset.weight === undefined ? null : +c.dataset.weight)}))""")


def test_every_head_renders_offline_with_its_verdict(view, exported, tmp_path):
    page, requests, errors = view
    _, report, tokens, arrays = exported
    T = len(tokens)
    assert [u for u in requests if not u.startswith("file://")] == [] and errors == []
    assert page.eval_on_selector_all(".tok", "ts => ts.map(t => t.textContent)") == tokens
    heads = page.eval_on_selector_all(".grid .head", "hs => hs.map(h => [+h.dataset.layer, +h.dataset.head])")
    assert heads == [[layer, head] for layer in range(N_LAYER) for head in range(N_HEAD)]
    names = page.eval_on_selector_all(".grid .head .name", "ns => ns.map(n => n.textContent)")
    assert names == [f"L{h['layer']}H{h['head']} · {h['pattern']}" for h in report["probe"]["heads"]]
    strips = shown_strips(page)
    assert sorted((s["layer"], s["head"], s["kind"]) for s in strips) == \
        [(layer, head, k) for layer in range(N_LAYER) for head in range(N_HEAD) for k in range(4)]
    assert all(len(s["weights"]) == T and s["query"] == T - 1 for s in strips)
    # each head's map drawn on its canvas: the causal triangle coloured, nothing left blank
    painted = page.eval_on_selector_all(".grid .head canvas", """cs => cs.map(c => {
        const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data; let n = 0;
        for (let i = 0; i < d.length; i += 4) n += !(d[i] === 242 && d[i + 1] === 242 && d[i + 2] === 242);
        return n / (c.width * c.height); })""")
    assert len(painted) == N_LAYER * N_HEAD and all(p >= (T + 1) / (2 * T) - 0.01 for p in painted), painted
    page.click(f'.tok[data-pos="{tokens.index("上")}"]')  # the row that chose 霜 (docs/attention-view.png)
    page.screenshot(path=str(tmp_path / "attention-view.png"), full_page=True)
    assert (tmp_path / "attention-view.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("character", ["上", "霜"])
def test_clicked_and_hovered_characters_show_the_arrays_weights(view, exported, character):
    """上's row is where each head looked when the model chose 霜."""
    page, _, _ = view
    _, _, tokens, arrays = exported
    i = tokens.index(character)
    page.click(f'.tok[data-pos="{i}"]')
    strips = shown_strips(page)
    assert len(strips) == 4 * N_LAYER * N_HEAD
    for s in strips:
        expected = arrays[s["kind"], s["layer"], s["head"], i, : i + 1]
        assert s["query"] == i and s["weights"][i + 1 :] == [None] * (len(tokens) - i - 1)
        np.testing.assert_allclose(s["weights"][: i + 1], expected, rtol=0, atol=1e-4, err_msg=str(s))
    # the weight on hover, in the tip: L1H1 of the model and of the lesson's section 3 map, every key
    for kind in (0, 2):
        for j in range(i + 1):
            page.hover(f'.grid .strip[data-kind="{kind}"][data-layer="1"][data-head="1"] .w[data-key="{j}"]')
            tip = page.inner_text(".tip")
            assert tip.startswith("L1H1 · " if kind == 0 else "map 1 · ") and f"[{i}]" in tip, tip
            assert float(tip.rsplit(": ", 1)[1]) == pytest.approx(arrays[kind, 1, 1, i, j], abs=1e-4)
    # hovering a character (nothing pinned) shows its row, under the text for the current head
    page.click(f'.tok[data-pos="{i}"]')  # unpin
    page.hover('.tok[data-pos="3"]')
    under_text = page.eval_on_selector_all('.text .w[data-kind="0"]', "ws => ws.map(w => w.dataset.weight)")
    assert [float(w) for w in under_text[:4]] == pytest.approx(arrays[0, 0, 0, 3, :4], abs=1e-4)
    assert under_text[4:] == [None] * (len(tokens) - 4)


def test_one_head_shows_its_maps_beside_the_baselines_and_its_figures(view, exported):
    page, _, errors = view
    _, report, tokens, arrays = exported
    page.click("text=one head")
    page.click('.bar span:has(> .lab:text("layer")) button:text("1")')
    page.click('.bar span:has(> .lab:text("head")) button:text("0")')
    canvases = page.eval_on_selector_all(".maps canvas", "cs => cs.map(c => [+c.dataset.kind, +c.dataset.layer])")
    assert canvases == [[k, 1] for k in range(4)]
    table = page.eval_on_selector_all(".mv table tr", "rs => rs.map(r => [...r.children].map(c => c.textContent))")
    assert table[0] == ["L1H0", "probe line", "2 held-out poems"]
    assert table[1] == ["verdict", report["probe"]["heads"][2]["pattern"], report["heldout"]["heads"][2]["pattern"]]
    entropy = next(r for r in table if r[0] == "entropy")
    assert float(entropy[1].split()[0]) == pytest.approx(report["probe"]["heads"][2]["entropy"], abs=1e-3)
    # hovering the heatmap shows the weight of that row and column
    box = page.locator('.maps canvas[data-kind="0"]').bounding_box()
    cell = box["width"] / len(tokens)
    for a, b in ((5, 2), (11, 10), (12, 0)):
        page.mouse.move(box["x"] + (b + 0.5) * cell, box["y"] + (a + 0.5) * cell)
        assert float(page.inner_text(".tip").rsplit(": ", 1)[1]) == pytest.approx(arrays[0, 1, 0, a, b], abs=1e-4)
    assert errors == []


def test_a_view_fed_one_generation_step_at_a_time(browser, tmp_path):
    """The studio's path: the empty page, then each new position's rows (`view.appendStep`)."""
    path = tmp_path / "empty.html"
    path.write_text(empty_page(), encoding="utf-8")
    context = browser.new_context(offline=True)
    page = context.new_page()
    page.goto(path.as_uri())
    rng = np.random.default_rng(0)
    rows = []
    for t, token in enumerate(["<bos>", "床", "前"]):
        r = rng.random((2, 3, t + 1))
        rows.append(r / r.sum(-1, keepdims=True))
        page.evaluate("([token, rows]) => window.mingyueView.appendStep(token, rows)", [token, rows[-1].tolist()])
    strips = shown_strips(page)
    assert len(strips) == 6 and all(s["query"] == 2 for s in strips)
    for s in strips:
        np.testing.assert_allclose(s["weights"], rows[2][s["layer"], s["head"]], atol=1e-4)
    page.click('.tok[data-pos="1"]')  # an earlier step's row
    np.testing.assert_allclose(shown_strips(page)[5]["weights"][:2], rows[1][1, 2], atol=1e-4)
    assert embedded_data(path.read_text(encoding="utf-8")) is None
    context.close()
