"""The studio in headless Chromium (`python -m pytest -m browser`; .ci/run installs Chromium, a
CJK font and Playwright): a real uvicorn server in a thread, the page driven as a user would.

STUDIO_SCREENSHOTS=docs python -m pytest -m browser tests/test_studio_browser.py rewrites the
README's two screenshots (docs/studio-poem.png, docs/studio-step.png); otherwise they go to a
temporary folder.
"""
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from data.verse.ci import shape_of
from data.verse.poetry import LINE_END
from model.loading import load_engine
from model.sampling.poems import SamplingOptions, sample_poems
from model.studio.server import background, create_app
from sample import as_lines
from tests.test_attention_view_browser import browser, sharp_checkpoint, shown_strips  # noqa: F401 (a fixture)
from tests.test_studio import sample_error

pytestmark = pytest.mark.browser
REFUSED = "Failed to load resource: the server responded with a status of 400"
"""What Chromium logs for bad input (/generate answers 400 with the message the page shows)."""


@pytest.fixture(scope="module")
def studio(tmp_path_factory):
    """(the studio's address, its checkpoint): a tiny untrained model with sharp attention maps."""
    ckpt = sharp_checkpoint(tmp_path_factory.mktemp("studio") / "checkpoints" / "run" / "last.ckpt")
    with background(create_app(ckpt.parents[1])) as url:
        yield url, ckpt


@pytest.fixture
def page(browser, studio):  # noqa: F811 (browser: the fixture imported above)
    """The studio open in a fresh context; yields (page, the URLs it requested, its errors)."""
    url, _ = studio
    context = browser.new_context(viewport={"width": 1000, "height": 720})
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=url)
    page = context.new_page()
    requests, errors = [], []
    page.on("request", lambda r: requests.append(r.url))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" and not m.text.startswith(REFUSED) else None)
    page.goto(url)
    page.wait_for_function("window.studio && window.studio.ready")
    yield page, requests, errors
    context.close()


def write(page, **options) -> dict:
    """Fill the form, press write, wait for the poem; returns the page's record of it
    (`window.studio.runs`: poem, timings in ms)."""
    for name, value in options.items():
        field = page.locator(f'#options [name="{name}"]')
        if isinstance(value, bool):
            field.set_checked(value)
        elif name in ("form", "control"):
            field.select_option(value)
        else:
            field.fill(str(value))
    page.click("#write")
    page.wait_for_selector('#stats[data-state="done"], #stats[data-state="error"]')
    return page.evaluate("window.studio.runs[window.studio.runs.length - 1]")


def characters(page) -> list[tuple[int, str]]:
    """(position, character) of every drawn character of the poem, marks left out."""
    shown = page.eval_on_selector_all("#poem .ch.drawn", "cs => cs.map(c => [+c.dataset.pos, c.textContent])")
    return [(pos, c) for pos, c in shown if c not in LINE_END]


def screenshot(page, tmp_path, name):
    folder = Path(os.environ.get("STUDIO_SCREENSHOTS", tmp_path))
    page.screenshot(path=str(folder / name), full_page=True)
    assert (folder / name).read_bytes()[:4] == b"\x89PNG"


def test_a_rhymed_wujue_streams_and_its_10th_character_shows_a_full_forward_passs_weights(page, studio, tmp_path):
    page, requests, errors = page
    url, ckpt = studio
    menu = page.eval_on_selector_all('select[name="form"] option', "os => os.map(o => [o.value, o.textContent])")
    assert menu[0] == ["", "free"] and ["wupai", "五言排律 wupai"] in menu and menu[-1] == ["ci", "词 ci"]  # from /options
    run = write(page, form="wujue", rhyme=True)
    poem = run["poem"]
    assert poem == sample_poems(load_engine(ckpt), SamplingOptions(form="wujue", rhyme=True))[0]  # the defaults' seed
    assert [len(line) for line in poem.replace("。", "，").split("，")] == [5, 5, 5, 5, 0]
    assert run["first"] - run["sent"] < 1000 and run["server_first_ms"] < 1000 and run["chars"] == 24
    pos, character = characters(page)[9]  # the 10th character, the 4th of line 2
    page.click(f'#poem .ch[data-pos="{pos}"]')
    ids = load_engine(ckpt).tokenizer.encode(poem, bos=True)
    assert ids[pos] == load_engine(ckpt).tokenizer.encode(character)[0]
    naive = load_engine(ckpt, backend="naive").model
    with torch.no_grad():  # a full forward pass of the naive backend over the prefix the step saw
        full = torch.stack(naive.attention_maps(torch.tensor([ids[:pos]])))[:, 0].double().numpy()  # (L, H, pos, pos)
    assert page.eval_on_selector_all(".mv .tok", "ts => ts.map(t => t.textContent)") == ["<bos>", *poem[:pos]]
    strips = shown_strips(page)
    assert len(strips) == full.shape[0] * full.shape[1] and np.abs(full[0, 0] - full[0, 1]).max() > 0.1
    for s in strips:  # the row of position pos - 1, which drew the character; the character's own is the next step's
        assert s["query"] == pos - 1 and s["weights"][pos:] == [None]
        np.testing.assert_allclose(s["weights"][:pos], full[s["layer"], s["head"], pos - 1], rtol=0, atol=1e-4)
    page.click('.mv .tok[data-pos="3"]')  # an earlier step's row in the same view
    for s in shown_strips(page):
        np.testing.assert_allclose(s["weights"][:4], full[s["layer"], s["head"], 3, :4], rtol=0, atol=1e-4)
    info = page.inner_text("#step-info")
    assert info.startswith(f"「{character}」 drawn at position {pos} with probability ")
    assert page.inner_text("#allowed").startswith("the masks allowed ")
    page.click(f'#poem .ch[data-pos="{pos}"]')
    screenshot(page, tmp_path, "studio-poem.png")
    assert [u for u in requests if not u.startswith(url)] == [] and errors == []


def test_one_head_and_what_the_masks_allowed_at_the_rhyme(page, tmp_path):
    page, _, errors = page
    run = write(page, form="wujue", rhyme=True, seed=7)
    pos, character = characters(page)[19]  # the last character: the 2nd rhyme
    page.click(f'#poem .ch[data-pos="{pos}"]')
    allowed = page.inner_text("#allowed")
    assert allowed.startswith("the masks allowed ") and " tokens here: " in allowed
    listed = allowed.split(" tokens here: ")[1].split()
    assert character in listed and run["poem"][10] not in listed  # the group's characters, less the 1st rhyme
    page.click("text=one head")
    assert page.eval_on_selector_all(".maps canvas", "cs => cs.length") == 1
    screenshot(page, tmp_path, "studio-step.png")
    page.click("text=all heads")
    assert errors == []


def test_regenerate_a_line_then_copy_the_poem(page, studio):
    page, _, errors = page
    _, ckpt = studio
    first = write(page, form="wujue", seed=11)["poem"]
    page.locator("#poem .line .regen").nth(2).click()  # line 3: keep lines 1 and 2
    page.wait_for_function("window.studio.runs.length === 2 && window.studio.runs[1].done !== undefined")
    again = page.evaluate("window.studio.runs[1].poem")
    kept = first[:12]
    assert again.startswith(kept) and page.input_value('[name="prompt"]') == kept
    assert page.input_value('[name="seed"]') == "12"
    assert again == sample_poems(load_engine(ckpt), SamplingOptions(prompt=kept, form="wujue", seed=12))[0]
    page.click("#copy")
    page.wait_for_function("document.querySelector('#stats').textContent === 'copied the poem'")
    assert page.evaluate("navigator.clipboard.readText()") == as_lines(again)
    assert errors == []


@pytest.mark.parametrize("options", [{"prompt": "床前明月光abc"}, {"form": "wulv", "acrostic": "床前明月"}])
def test_bad_input_shows_sample_pys_message_and_the_next_poem_comes(page, studio, options):
    page, _, errors = page
    _, ckpt = studio
    run = write(page, **options)
    assert "poem" not in run and page.inner_text("#message") == sample_error(ckpt, **options)
    run = write(page, prompt="床前明月光", form="wujue", acrostic="")
    assert run["poem"].startswith("床前明月光，") and page.inner_text("#message") == ""
    assert errors == []


def test_keywords_typed_in_their_field_stand_in_the_poem(page, studio):
    page, _, errors = page
    run = write(page, prompt="", form="wujue", acrostic="", keywords="明月，白日")
    assert "明月" in run["poem"] and "白日" in run["poem"] and errors == []


def test_a_tune_picked_from_its_list_gives_a_ci_of_its_shape(page, studio):
    page, _, errors = page
    assert page.eval_on_selector_all("#tunes option", "os => os.length") == 49
    run = write(page, prompt="", form="", acrostic="", keywords="", tune="菩萨蛮", max_new_tokens=80)
    assert shape_of(run["poem"]) == "7。7。5。5。5。5。5。5。" and errors == []
    # the template under the poem: its 44 positions filled with the 词's characters, a ring at each
    # rhyme (菩萨蛮 changes rhyme every couplet: segments 0–3), the 下阕 after line 4
    cells = page.eval_on_selector_all("#template .cell", "cs => cs.map(c => [c.textContent, c.className])")
    assert "".join(c for c, _ in cells) == "".join(ch for ch in run["poem"] if ch not in LINE_END)
    assert all("filled" in cls for _, cls in cells) and len(cells) == 44
    rings = [cls.split()[-1] for _, cls in cells if "rhyme" in cls]
    assert rings == ["seg0", "seg0", "seg1", "seg1", "seg2", "seg2", "seg3", "seg3"]
    assert page.eval_on_selector_all("#template > div", "ds => ds.map(d => d.className)") == \
        ["thead", *["tline"] * 4, "tbreak", *["tline"] * 4]
    assert page.text_content("#template .thead").startswith("菩萨蛮 · template 1 of")
    write(page, tune="", form="wujue")  # a 诗: no template
    assert page.inner_html("#template") == ""


def test_a_head_switched_off_on_its_card_writes_the_next_poem_without_it(page, studio):
    page, _, errors = page
    _, ckpt = studio
    write(page, form="wujue", seed=3)
    pos, _ = characters(page)[4]
    page.click(f'#poem .ch[data-pos="{pos}"]')
    page.click('.mv .head .switch input[data-head="L1H0"]')
    page.click('.mv .head .switch input[data-head="L0H1"]')
    assert page.input_value('[name="ablate"]') == "L0H1 L1H0"
    assert "written with L0H1, L1H0 off (zero)" in page.inner_text("#message")
    page.click('.mv .head .switch input[data-head="L0H1"]')  # on again
    run = write(page)
    off = load_engine(ckpt, ablate=["L1H0"])
    assert run["poem"] == sample_poems(off, SamplingOptions(form="wujue", seed=3))[0]
    pos, _ = characters(page)[4]
    page.click(f'#poem .ch[data-pos="{pos}"]')
    assert "written with L1H0 off" in page.inner_text("#step-info")
    assert page.is_checked('.mv .head .switch input[data-head="L1H0"]')
    write(page, ablate="L7H0")
    assert page.inner_text("#message").startswith("error: ablate: L7H0 is not a head of this model, which has layers 0–1")
    assert errors == []


def test_the_title_plans_its_words_before_the_poem_and_the_user_edits_them(browser, tmp_path, monkeypatch):  # noqa: F811
    """A model trained with conditions: typing a title shows the words it plans (plan 立意) before anything is
    written; the words as edited are the poem's keywords."""
    from data.title_plan import TitlePlanner
    from data.tokenizer import CharTokenizer
    from data.verse.plan import plan_labels
    from data.verse.script import corpus_to_script
    from model.sampling import title_plan
    from model.training.lit import LitGPT
    from tests.conftest import POEMS

    texts = corpus_to_script(POEMS, "simplified")
    planner = TitlePlanner.build(["静夜思", "登鹳雀楼", "春晓", "江雪", "相思", "早发白帝城"] * 3, texts * 3)
    monkeypatch.setattr(title_plan, "planner", lambda script: planner)
    tok = CharTokenizer.from_texts([*texts, "静夜思"], plan_labels(segments=True))
    torch.manual_seed(0)
    lit = LitGPT(model=dict(block_size=64, n_layer=1, n_head=2, n_embd=16), optim={}, tokenizer=tok.state_dict())
    ckpt = tmp_path / "checkpoints" / "run" / "last.ckpt"
    ckpt.parent.mkdir(parents=True)
    torch.save({"hyper_parameters": dict(lit.hparams), "state_dict": lit.state_dict(),
                "conditions": {"shares": {"title": 0.25, "poet": 0.25, "keywords": 0.1}, "poets": {}}}, ckpt)
    with background(create_app(ckpt.parents[1])) as url:
        page = browser.new_page()
        page.goto(url)
        page.wait_for_function("window.studio && window.studio.ready")
        page.locator('#options [name="form"]').select_option("wujue")
        page.locator('#options [name="title"]').fill("静夜思")
        page.locator('#options [name="title"]').dispatch_event("change")
        page.wait_for_function("document.querySelector('#options [name=plan_words]').value !== ''")
        words = planner.plan("静夜思", 2)  # a 五绝: a word a couplet
        assert page.locator('#options [name="plan_words"]').input_value() == ",".join(words) and words
        shown = write(page)  # as shown: sample.py's poem for the title, which leans toward its words
        assert shown["poem"] == sample_poems(load_engine(ckpt), SamplingOptions(title="静夜思", form="wujue"))[0]
        assert shown["poem"] != sample_poems(load_engine(ckpt), SamplingOptions(title="静夜思", form="wujue",
                                                                                topic_lean=0.0))[0]
        page.locator('#options [name="plan_words"]').fill(words[-1])  # the user keeps one of them
        run = write(page)
        assert words[-1] in run["poem"], run
        page.close()
