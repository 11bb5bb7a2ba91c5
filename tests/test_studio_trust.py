"""Issue 24, item 1: only the studio's own page can drive it. Foreign Hosts (DNS rebinding) and
Origins (cross-site pages) are refused, a POST must be JSON, a page's ckpt_path stays inside the
checkpoints folder, and no request, however malformed, gets a 5xx."""
import json
import re

import pytest
from starlette.testclient import TestClient

from model.studio.server import create_app
from tests.test_attention_maps import write_checkpoint

JSON = {"content-type": "application/json"}
ENDPOINTS = [("GET", "/"), ("GET", "/options"), ("POST", "/generate"), ("GET", "/status"), ("GET", "/favicon.ico")]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("trust") / "checkpoints" / "run" / "last.ckpt")


@pytest.fixture(scope="module")
def local(ckpt):
    """A client that reaches the studio as its page does: Host 127.0.0.1:8000, no allowed_hosts."""
    return TestClient(create_app(ckpt.parents[1], device="cpu"), base_url="http://127.0.0.1:8000")


def call(client, method, path, **kw):
    if method == "POST":
        kw = {"content": json.dumps({"form": "wujue", "max_new_tokens": 30}), **kw}
        kw["headers"] = {**JSON, **kw.get("headers", {})}
    return client.request(method, path, **kw)


@pytest.mark.parametrize("method, path", ENDPOINTS)
def test_a_foreign_host_is_refused_and_loopback_names_are_served(local, method, path):
    r = call(local, method, path, headers={"host": "evil.example"})
    assert r.status_code == 403 and r.json()["error"].startswith("error: this studio answers requests for ")
    for host in ("127.0.0.1:8000", "localhost:8000", "[::1]:8000", "localhost"):
        assert call(local, method, path, headers={"host": host}).status_code in (200, 204)


def test_allowed_hosts_add_names(ckpt):
    client = TestClient(create_app(ckpt.parents[1], device="cpu", allowed_hosts=("poems.lan",)))
    assert client.get("/status", headers={"host": "poems.lan:8000"}).status_code == 200
    assert client.get("/status", headers={"host": "other.lan"}).status_code == 403


def test_cross_site_posts_are_refused(local):
    """What a form on another page can send (text/plain), and a script there (with its Origin)."""
    text = local.post("/generate", content=b'{"form": "wujue"}', headers={"content-type": "text/plain",
                                                                         "origin": "http://evil.example"})
    assert text.status_code == 403 and "Content-Type application/json" in text.json()["error"] or \
        "other pages" in text.json()["error"]
    plain = local.post("/generate", content=b'{"form": "wujue"}', headers={"content-type": "text/plain"})
    assert plain.status_code == 403 and plain.json()["error"] == (
        "error: a POST must be Content-Type application/json, not 'text/plain'")
    other = call(local, "POST", "/generate", headers={"origin": "http://evil.example"})
    assert other.status_code == 403 and other.json()["error"] == (
        "error: requests from other pages (http://evil.example) are refused; use the studio's own page")
    assert call(local, "GET", "/options", headers={"origin": "null"}).status_code == 403
    own = call(local, "POST", "/generate", headers={"origin": "http://127.0.0.1:8000"})
    assert own.status_code == 200 and "event: done" in own.text


@pytest.mark.parametrize("path", ["/etc/passwd", "/etc", "../../etc/passwd", "run/../../../etc/passwd"])
def test_a_pages_ckpt_path_stays_inside_the_checkpoints_folder(local, ckpt, path):
    said = f"error: ckpt_path={path} is outside {ckpt.parents[1]}: the studio reads checkpoints there only"
    r = call(local, "POST", "/generate", content=json.dumps({"ckpt_path": path}))
    assert r.status_code == 400 and r.json()["error"].startswith(said)
    r = local.get("/options", params={"ckpt_path": path})
    assert r.status_code == 200 and r.json()["error"].startswith(said) and "model" not in r.json()
    for fine in (str(ckpt.parent), "last"):  # a run folder inside; the newest, as on the command line
        assert call(local, "POST", "/generate", content=json.dumps({"ckpt_path": fine, "seed": 1})).status_code == 200


def test_a_link_inside_the_folder_to_a_file_outside_is_refused_before_it_is_read(local, ckpt, monkeypatch, tmp_path):
    """Issue 36, item 4: a run folder inside whose last.ckpt links outside (or a file link, or `last`
    when that run is the newest): refused as outside; torch never opens the file."""
    secret = tmp_path / "secret"  # outside the checkpoints folder, newer than every checkpoint in it
    secret.write_bytes(b"not yours")
    import model.studio.server as server

    opened = []
    real = server.load_engine
    monkeypatch.setattr(server, "load_engine", lambda path, *a: opened.append(path) or real(path, *a))
    run = ckpt.parents[1] / "linked"
    run.mkdir()
    (run / "last.ckpt").symlink_to(secret)
    (ckpt.parents[1] / "passwd.ckpt").symlink_to(secret)
    try:
        for path in (str(run), str(run / "last.ckpt"), str(ckpt.parents[1] / "passwd.ckpt"), "last"):
            r = call(local, "POST", "/generate", content=json.dumps({"ckpt_path": path}))
            assert r.status_code == 400, path
            assert r.json()["error"].startswith(f"error: ckpt_path={path} is outside {ckpt.parents[1]}: ")
        assert opened == []
    finally:
        (run / "last.ckpt").unlink()
        run.rmdir()
        (ckpt.parents[1] / "passwd.ckpt").unlink()


def test_allowed_folders_add_folders(ckpt, tmp_path):
    other = write_checkpoint(tmp_path / "elsewhere" / "run" / "last.ckpt")
    client = TestClient(create_app(ckpt.parents[1], device="cpu", allowed_folders=(str(tmp_path / "elsewhere"),)),
                        base_url="http://localhost:8000")
    assert client.get("/options", params={"ckpt_path": str(other)}).json()["model"]["ckpt_path"] == str(other)


BODIES = [b"", b"null", b"1", b'"wujue"', b"[1, 2]", b"{", b"\xff\xfe", b'{"prompt": {"a": 1}}', b'{"rhyme": "yes"}',
          b'{"form": 5}', b'{"acrostic": ["a"]}', b'{"seed": -1}', b'{"seed": 1e400}', b'{"seed": 12345678901234567890123}',
          b'{"max_new_tokens": 1000000000000}', b'{"max_new_tokens": 0}', b'{"max_new_tokens": -3}',
          b'{"temperature": NaN}', b'{"temperature": Infinity}', b'{"temperature": -1}', b'{"temperature": 1e308}',
          b'{"top_k": 1000000000000}', b'{"top_k": -5}', b'{"top_p": 0}', b'{"top_p": -Infinity}',
          b'{"temperature": 1e-40}', b'{"temperature": 1e-320}', b'{"repetition_penalty": 0}',
          b'{"repetition_penalty": 1e308}', b'{"control": "firm"}', b'{"form": "qilv"}',
          b'{"prompt": "' + "床".encode() * 5000 + b'"}', b'{"ckpt_path": ""}', b'{"ckpt_path": "\\u0000"}',
          b'{"ckpt_path": "' + b"a/" * 3000 + b'"}', b'{"a": ' * 2000 + b"1" + b"}" * 2000]


@pytest.mark.parametrize("body", BODIES, ids=range(len(BODIES)))
def test_no_request_gets_a_5xx(local, body):
    r = local.post("/generate", content=body, headers=JSON)
    assert r.status_code < 500 and (r.status_code == 200 or "\n" not in r.json()["error"])
    if r.status_code == 200:  # accepted: the stream ends with its poem or a one-line error
        assert re.findall(r"^event: (\w+)$", r.text, re.M)[-1] in ("done", "error")


@pytest.mark.parametrize("query", ["ckpt_path=%00", "ckpt_path=" + "a" * 5000, "ckpt_path=/dev/zero",
                                   "ckpt_path=.", "x=1&ckpt_path=run"])
def test_no_options_query_gets_a_5xx(local, query):
    r = local.get("/options?" + query)
    assert r.status_code == 200 and ("model" in r.json() or "\n" not in r.json()["error"])
