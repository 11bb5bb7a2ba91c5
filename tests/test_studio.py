"""The studio's server without a browser: Starlette's test client for each endpoint, and a real
uvicorn server in a thread (`background`) for two poems at once and for a page that closes mid-poem."""
from __future__ import annotations

import json
import re
import time

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from starlette.testclient import TestClient

import sample as sample_script
import studio as studio_script
from data.tokenizer import CharTokenizer
from data.verse.plan import plan_labels
from data.verse.script import corpus_to_script
from model.cli import USER_ERRORS
from model.inspection.attention_view import SCALE
from model.loading import load_engine
from model.sampling.poems import SamplingOptions, sample_ids, sample_poems
from model.studio.server import OPTIONS, background, create_app
from model.training.lit import LitGPT
from tests.conftest import POEMS, ROOT, write_corpus
from tests.test_attention_maps import write_checkpoint

httpx = pytest.importorskip("httpx2", reason="Starlette's test client needs httpx2: pip install -r requirements.txt")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A tiny untrained model (2 layers × 2 heads, block 32) over the test poems' characters."""
    return write_checkpoint(tmp_path_factory.mktemp("studio") / "checkpoints" / "run" / "last.ckpt")


@pytest.fixture(scope="module")
def app(ckpt):
    return create_app(ckpt.parents[1], allowed_hosts=("testserver",))  # Starlette's test client's Host


@pytest.fixture(scope="module")
def client(app):
    return TestClient(app)


def events(text: str) -> list[tuple[str, dict]]:
    """An event stream's body → [(event name, data)]."""
    return [(m[1], json.loads(m[2])) for m in re.finditer(r"event: (\w+)\ndata: (.*)\n\n", text)]


def post(client, body) -> tuple[int, str]:
    r = client.post("/generate", content=json.dumps(body), headers={"content-type": "application/json"})
    return r.status_code, r.text


def test_the_page_is_served_self_contained(client):
    html = client.get("/").text
    assert html.startswith("<!DOCTYPE html>") and "window.MingyueAttention = {mount};" in html
    assert "/* attention view" not in html  # both slots filled
    assert not re.search(r"https?:|<link|@import|url\(", html)  # nothing fetched: no CDN, style sheet or font
    assert not re.search(r"<script[^>]*\bsrc=", html)
    assert 20_000 < len(html.encode()) < 60_000  # docs/studio.md states the size


def test_options_give_every_sample_control_and_the_model(client, ckpt):
    info = client.get("/options").json()
    defaults = SamplingOptions()
    assert info["defaults"] == {f: getattr(defaults, f) for f in OPTIONS}
    assert set(OPTIONS) == {"prompt", "form", "rhyme", "meter", "acrostic", "keywords", "temperature", "top_k", "top_p",
                            "repetition_penalty", "seed", "control", "max_new_tokens", "keywords_forced", "title",
                            "title_plan", "topic_lean", "poet", "tune"}
    assert [f["name"] for f in info["forms"]] == ["wujue", "qijue", "wulv", "qilv", "wupai", "qipai"]
    assert info["forms"][4]["title"] == "五言排律" and info["controls"] == ["hard", "soft", "both"]
    assert len(info["tunes"]) == 49 and info["tunes"][:2] == ["浣溪沙", "水调歌头"]
    assert info["model"] == {"ckpt_path": str(ckpt), "plan": False, "n_layer": 2, "n_head": 2, "block_size": 32,
                             "vocab_size": load_engine(ckpt).tokenizer.vocab_size}
    assert len(info["colormap"]) == 256 * 6 and info["scale"] == SCALE
    missing = client.get("/options", params={"ckpt_path": str(ckpt.parent / "none.ckpt")}).json()
    assert missing["error"].startswith(f"error: checkpoint {ckpt.parent / 'none.ckpt'} not found")


def test_a_poem_streams_in_order_with_each_steps_own_attention_and_masks(client, ckpt):
    status, text = post(client, {"form": "wujue", "rhyme": True, "seed": 3})
    assert status == 200
    evs = events(text)
    names = [name for name, _ in evs]
    assert names == ["start", *["step"] * (len(evs) - 2), "done"]
    engine = load_engine(ckpt, backend="naive")
    [poem] = sample_poems(engine, SamplingOptions(form="wujue", rhyme=True, seed=3))
    done = evs[-1][1]
    assert done["poem"] == poem and done["chars"] == 24 and done["first_ms"] > 0 and done["chars_per_s"] > 0
    steps = [d for name, d in evs if name == "step"]
    assert [d["pos"] for d in steps] == list(range(1, 26))  # 24 characters and <eos>
    assert "".join(d["text"] for d in steps) == poem and steps[-1]["label"] == "<eos>"
    ids = engine.tokenizer.encode(poem, bos=True)
    with torch.no_grad():
        full = torch.stack(engine.model.attention_maps(torch.tensor([ids])))[:, 0].numpy()  # (L, H, T, T)
    for d in steps:  # the step's row: the position before its token, over every position so far
        n = d["pos"]
        assert d["row"]["start"] == 0
        w = np.asarray(d["row"]["w"]) / SCALE  # (L, H, n)
        np.testing.assert_allclose(w, full[:, :, n - 1, :n], atol=0.6 / SCALE)
    allowed = [d["allowed"] for d in steps]
    assert all(a["of"] == engine.tokenizer.vocab_size and a["count"] >= 1 for a in allowed)
    assert allowed[5] == {"count": 1, "of": allowed[5]["of"], "allowed": ["，"], "more": 0}  # a 五言 line ends at 5
    rhyme = allowed[22]  # the last character: one of the rhyme group, not the 2nd line's rhyme again
    assert steps[22]["text"] in rhyme["allowed"] and steps[10]["text"] not in rhyme["allowed"]
    assert allowed[24]["allowed"] == ["<eos>"]


def test_a_poem_with_keywords_is_sample_pys_and_holds_them(client, ckpt):
    status, text = post(client, {"form": "wujue", "keywords": "明月,白日", "seed": 4})
    [poem] = sample_poems(load_engine(ckpt), SamplingOptions(form="wujue", keywords=["明月", "白日"], seed=4))
    assert status == 200 and events(text)[-1][1]["poem"] == poem and "明月" in poem and "白日" in poem


def test_a_prompts_rows_come_with_the_start(client, ckpt):
    status, text = post(client, {"prompt": "床前明月光", "max_new_tokens": 3})
    start = events(text)[0][1]
    assert start["tokens"] == ["<bos>", *"床前明月光"] and start["texts"] == ["", *"床前明月光"]
    assert [r["pos"] for r in start["rows"]] == [0, 1, 2, 3, 4]  # the first step computes position 5's
    engine = load_engine(ckpt)
    idx, _ = engine.encode_line("床前明月光")
    full = torch.stack(engine.model.attention_maps(idx))[:, 0].numpy()
    for r in start["rows"]:
        np.testing.assert_allclose(np.asarray(r["w"]) / SCALE, full[:, :, r["pos"], : r["pos"] + 1], atol=0.6 / SCALE)


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_a_poem_with_heads_switched_off_is_sample_pys_and_the_others_keep_every_head(tmp_path, ckpt, mode):
    corpus = write_corpus(tmp_path / "tang.jsonl.xz")
    client = TestClient(create_app(ckpt.parents[1], allowed_hosts=("testserver",), corpus_path=corpus))
    opts = {"form": "wujue", "seed": 5}
    evs = events(post(client, {**opts, "ablate": ["L1H0", "L0H1"], "ablate_mode": mode})[1])
    intact_evs = events(post(client, opts)[1])
    off, intact = evs[-1][1]["poem"], intact_evs[-1][1]["poem"]
    probs = [[d["prob"] for name, d in e if name == "step"] for e in (evs, intact_evs)]
    options = SamplingOptions(form="wujue", seed=5)
    assert off == sample_poems(load_engine(ckpt, ablate=["L1H0", "L0H1"], ablate_mode=mode, corpus_path=corpus),
                               options)[0]
    assert intact == sample_poems(load_engine(ckpt), options)[0]
    assert probs[0][0] != probs[1][0]  # the model's probabilities moved; the other poem kept every head


def sample_error(ckpt, **options) -> str:
    """The message `sample.py` exits with for these options."""
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("sample", overrides=[f"ckpt_path={ckpt}", "num_samples=1"])
    cfg.update(options)
    with pytest.raises(USER_ERRORS) as err:
        sample_script.sample(cfg)
    return f"error: {err.value}"


@pytest.mark.parametrize("options", [
    {"prompt": "床前明月光abc"},  # characters outside the vocabulary
    {"prompt": "床前明月光疑", "form": "wujue"},  # breaks the form
    {"prompt": "床\ud800"},  # a lone surrogate
    {"acrostic": "床前明月", "form": "wulv"},  # an acrostic of 4 lines for an 8-line form
    {"acrostic": "，", "form": "wujue"},  # a mark cannot start a line
    {"keywords": "明月x"}, {"keywords": "床前明月光疑", "form": "wujue"},  # outside the vocabulary; longer than a line
    {"ckpt_path": "missing/last.ckpt"},
    {"top_p": 1.5}, {"form": "ci"}, {"max_new_tokens": 10, "form": "qilv"},
    {"ablate": ["L9H0"]}, {"ablate": ["L0H0", "head 1"]},  # a head the model lacks, a malformed name
])
def test_bad_input_gets_sample_pys_one_line_message_and_the_server_keeps_serving(client, ckpt, options):
    if "ckpt_path" in options:  # inside the checkpoints folder, the only one a page may name
        options = {**options, "ckpt_path": str(ckpt.parents[1] / options["ckpt_path"])}
    status, text = post(client, options)
    message = json.loads(text)["error"]
    assert status == 400 and message == sample_error(ckpt, **options) and "\n" not in message
    assert post(client, {"form": "wujue", "max_new_tokens": 30})[0] == 200


@pytest.mark.parametrize("body, said", [
    ({"temperature": "hot"}, "error: temperature: Value 'hot' of type 'str' could not be converted to Float"),
    ({"num_samples": 3}, "error: unknown option num_samples; the options are prompt,"),
    ([], "error: the request must be a JSON object of options"),
    ({"ckpt_path": 3}, "error: ckpt_path must be a path or null, got 3"),
    ({"ablate": "L0H0"}, "error: ablate must be a list of at most 256 head names, e.g. [\"L3H1\"], got 'L0H0'"),
    ({"ablate": [[1]]}, "error: ablate must be a list of at most 256 head names"),
    ({"ablate": ["L0H0"] * 257}, "error: ablate must be a list of at most 256 head names"),
    ({"ablate": ["L0H0"], "ablate_mode": "half"}, "error: ablate_mode must be one of zero, mean, got 'half'"),
])
def test_malformed_requests_get_a_one_line_message(client, body, said):
    status, text = post(client, body)
    assert status == 400 and json.loads(text)["error"].startswith(said)
    r = client.post("/generate", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"].startswith("error: the request is not JSON in UTF-8: ")


def test_the_studio_script_binds_localhost_and_serves_without_a_checkpoint(tmp_path, monkeypatch, capsys):
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("studio", overrides=[f"paths.checkpoint_dir={tmp_path}"])
    served = {}
    monkeypatch.setattr(studio_script.uvicorn, "run", lambda app, **kw: served.update(app=app, **kw))
    studio_script.serve(cfg)
    assert (served["host"], served["port"], cfg.ckpt_path) == ("127.0.0.1", 8000, None)
    assert f"error: no checkpoint under {tmp_path}" in capsys.readouterr().err
    info = TestClient(served["app"], base_url="http://127.0.0.1:8000").get("/options").json()  # as its page asks
    assert info["error"].startswith(f"error: no checkpoint under {tmp_path}") and "model" not in info
    cfg.host, cfg.allowed_hosts = "0.0.0.0", ["poems.lan"]
    studio_script.serve(cfg)
    out = capsys.readouterr().out
    assert ("studio: host=0.0.0.0 listens beyond this machine, with no login: any client that reaches port 8000 and "
            f"names it as one of localhost, 127.0.0.1, ::1, poems.lan can write poems and read the checkpoints under "
            f"{tmp_path}; add the names other machines use with allowed_hosts=[…]") in out
    assert "studio: http://127.0.0.1:8000/" in out  # an address that answers
    assert TestClient(served["app"], base_url="http://poems.lan:8000").get("/status").status_code == 200


@pytest.fixture
def slow(app, monkeypatch):
    """Every forward of the model takes 20 ms more (a sleep, which releases the GIL) while
    `slow.delay` is; `slow.calls`: the times they started."""
    engine = app.state.engine_for(None)[0]
    forward, calls = engine.model.forward, []

    def slowed(*args, **kwargs):
        calls.append(time.perf_counter())
        time.sleep(slowed.delay)
        return forward(*args, **kwargs)

    slowed.delay, slowed.calls = 0.02, calls

    monkeypatch.setattr(engine.model, "forward", slowed)
    return slowed


@pytest.fixture(scope="module")
def served(app):
    with background(app) as url:
        yield url


def read_events(lines, until: str) -> list[tuple[str, dict]]:
    """Events from a streamed response's lines, up to and including the first named `until`."""
    out, name = [], None
    for line in lines:
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            out.append((name, json.loads(line[6:])))
            if name == until:
                return out
    raise AssertionError(f"the stream ended before {until}: {out[-1:]}")


def test_two_pages_write_at_once_each_its_own_poem(served, app, slow):
    bodies = [{"form": "wujue", "seed": s} for s in (1, 2)]
    with httpx.Client(base_url=served, timeout=30) as http:
        with http.stream("POST", "/generate", json=bodies[0]) as a, http.stream("POST", "/generate", json=bodies[1]) as b:
            lines = [a.iter_lines(), b.iter_lines()]
            firsts = [read_events(lines[i], "step") for i in (0, 1)]  # both started before either ended
            assert http.get("/status").json() == {"generating": 2}
            dones = [read_events(lines[i], "done")[-1][1] for i in (0, 1)]
    assert all(f[0][0] == "start" for f in firsts)
    engine = app.state.engine_for(None)[0]
    assert [d["poem"] for d in dones] == [sample_poems(engine, SamplingOptions(**o))[0] for o in bodies]
    assert dones[0]["poem"] != dones[1]["poem"]
    assert http_status(served) == 0


def http_status(served: str) -> int:
    """The number of poems the server is writing, once it settles (within 5 s)."""
    for _ in range(50):
        n = httpx.get(served + "/status").json()["generating"]
        if n == 0:
            return n
        time.sleep(0.1)
    return n


def test_a_closed_page_stops_its_poem(served, app, slow):
    body = {"max_new_tokens": 200, "seed": 5}
    slow.delay = 0.0
    assert sample_ids(app.state.engine_for(None)[0], SamplingOptions(**body)).size(1) > 100  # a long poem, left alone
    slow.delay = 0.02
    del slow.calls[:]
    with httpx.Client(base_url=served, timeout=30) as http:
        with http.stream("POST", "/generate", json=body) as r:
            lines = r.iter_lines()
            read_events(lines, "step")
            read_events(lines, "step")
        # leaving the block closes the connection mid-poem
    assert http_status(served) == 0
    drawn = len(slow.calls)
    time.sleep(0.5)
    assert len(slow.calls) == drawn < 10  # no step after the close (200 were allowed, 20 ms each)


def test_a_plan_model_draws_its_plan_then_reads_the_prompt(tmp_path):
    """A model with plan tokens: `<bos> <form>`, the rhyme token drawn, the prompt given, then the poem."""
    tok = CharTokenizer.from_texts(corpus_to_script(POEMS, "simplified"), plan_labels())
    torch.manual_seed(0)
    lit = LitGPT(dict(block_size=40, n_layer=1, n_head=2, n_embd=16), {}, tok.state_dict())
    ckpt = tmp_path / "run" / "last.ckpt"
    ckpt.parent.mkdir()
    torch.save({"hyper_parameters": dict(lit.hparams), "state_dict": lit.state_dict()}, ckpt)
    client = TestClient(create_app(tmp_path, allowed_hosts=("testserver",)))
    assert client.get("/options").json()["model"]["plan"] is True
    options = {"prompt": "床前明月光", "form": "wujue", "control": "both", "seed": 2}
    status, text = post(client, options)
    evs = events(text)
    assert [name for name, _ in evs[:4]] == ["start", "step", "given", "step"] and evs[-1][0] == "done"
    start, rhyme, given = evs[0][1], evs[1][1], evs[2][1]
    assert start["tokens"] == ["<bos>", "<五绝>"] and [r["pos"] for r in start["rows"]] == [0]
    assert rhyme["pos"] == 2 and rhyme["text"] == "" and rhyme["label"] in plan_labels()
    assert given["pos"] == 3 and given["texts"] == list("床前明月光")
    assert [r["pos"] for r in given["rows"]] == [2, 3, 4, 5, 6]  # the last plan token's, and the prompt's but the last
    assert evs[3][1]["pos"] == 8 and evs[3][1]["row"]["start"] == 0 and len(evs[3][1]["row"]["w"][0][0]) == 8
    engine = load_engine(ckpt)
    assert evs[-1][1]["poem"] == sample_poems(engine, SamplingOptions(**options))[0]
