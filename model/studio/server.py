"""The poem studio's server: one page, and each poem streamed to it as server-sent events.

`create_app(checkpoint_dir, ckpt_path, device, backend)` is a Starlette app (`python studio.py`
serves it with uvicorn, one process, no database):
- `GET /`: the page, `studio.html` with the attention view's style and script inlined
  (`model.inspection.attention_view.assets`): nothing comes from the network.
- `GET /options[?ckpt_path=…]`: the options' defaults (`SamplingOptions`), the forms, the
  tunes (`tune=`), the controls, the colour scale, and the checkpoint's path and model shape, or `error`: the
  one-line message why there is none.
- `POST /generate`: a JSON object of `OPTIONS`, `ckpt_path` (null: the default), `ablate` (heads
  to switch off, `["L3H1", …]`, `model.ablation`) and `ablate_mode` (zero | mean) → 400
  `{"error": "error: …"}`, the message `sample.py` prints, for bad input; else an event stream:
  `start` {tokens, texts, rows, tune: a 词's template (`template`) or null}; one `step` per drawn
  token {pos, label, text, prob, row, allowed}; `given` {pos, tokens, texts, rows} for a prompt
  that follows a drawn plan; then `done` {poem, first_ms, chars, chars_per_s} or `error` {message}.
- `GET /plan?title=…[&form=…][&tune=…][&ckpt_path=…]`: the words the title plans
  (`model.sampling.title_plan.plan_title`) → {"words": [...]} (and a `note` when it plans none),
  shown under the title before the poem is written and editable there (the page sends them as
  `keywords`), or {"error": "error: …"}.
- `GET /status`: {"generating": the number of poems being written}; `GET /favicon.ico`: 204.

Only its own page can drive it (`LocalOnly`, as local servers such as Jupyter's do): a request
whose `Host` is not a loopback name (`localhost`, `127.0.0.1`, `[::1]`, any port) or one of
`allowed_hosts` is refused (a DNS-rebinding page cannot read it), as is one whose `Origin` is not
the page's own, and a `POST` must be `application/json` (a cross-site form cannot send it). A
`ckpt_path` from a request must lie inside the checkpoints folder or one of `allowed_folders`.
Every refusal and bad input is a one-line JSON `{"error": "error: …"}`, never a 500.

Every row is one query position's attention weights, [layer][head][key] integers in units of
1/SCALE, over the keys from its `start` position on: a step's row is the one it computed for the
position that predicted its token (`Engine.steps(..., attention_rows=True)`); `rows` of `start` and
`given` are the prompt's positions that no step computes (`model.inspection.attention_view.prompt_rows`).

The response pulls the poem one step at a time, each step in a worker thread (torch releases
the GIL: two pages write at once, each with its own generator): a closed page stops its poem
after the step in flight, since no further step is asked for.
"""
from __future__ import annotations

import contextlib
import importlib.resources
import json
import threading
import time
from functools import lru_cache
from pathlib import Path

import anyio
import torch
import uvicorn
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response, StreamingResponse
from starlette.routing import Route

from data.title_plan import nothing_planned, plan_size
from data.tokenizer import StreamDecoder
from data.verse.plan import plan_ids
from data.verse.poetry import FORM_TITLES, VERSE_FORMS
from data.verse.tunes import find_tune, tunes
from model.ablation import MODES
from model.cli import USER_ERRORS
from model.engine import Engine, Step
from model.inspection.attention_view import SCALE, assets, colormap, prompt_rows, quantised
from model.loading import find_checkpoint, load_engine
from model.sampling.poems import CONTROLS, SamplingOptions, poem_steps, poem_text
from model.sampling.title_plan import plan_title

MAX_ABLATED = 256
"""The most head names a request may list."""
OPTIONS = tuple(f for f in SamplingOptions.__dataclass_fields__ if f not in ("num_samples", "use_cache"))
"""The page's options: `sample.py`'s, less num_samples (one poem a page) and use_cache (always on)."""
SHOWN = 300
"""At most this many tokens are listed per step as allowed (or, when fewer are masked, as blocked)."""
MAX_NEW_TOKENS = 1024
"""The most tokens one page's poem may ask for (a page's request, unlike sample.py's, is anyone's)."""
LOOPBACK = ("localhost", "127.0.0.1", "::1")


def host_name(host: str) -> str:
    """A Host header's name without its port: `127.0.0.1:8000` → `127.0.0.1`, `[::1]:8000` → `::1`."""
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.partition(":")[0] if host.count(":") == 1 else host


class LocalOnly:
    """ASGI middleware: refuses (403, one-line JSON) a request whose Host is not one of `hosts`
    (names, any port), whose Origin, where present, is not the page's own (`http://` + its Host),
    or that is a POST without a JSON body (Content-Type application/json)."""

    def __init__(self, app, hosts: tuple[str, ...]):
        self.app, self.hosts = app, {h.lower() for h in hosts}

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and (why := self.refusal(Request(scope))):
            response = Response(json.dumps({"error": f"error: {why}"}), 403, media_type="application/json")
            return await response(scope, receive, send)
        await self.app(scope, receive, send)

    def refusal(self, request: Request) -> str | None:
        host = request.headers.get("host", "")
        if host_name(host).lower() not in self.hosts:
            return (f"this studio answers requests for {', '.join(sorted(self.hosts))}, not Host {host!r}; "
                    "start it with allowed_hosts=[…] to add a name")
        origin = request.headers.get("origin")
        if origin is not None and origin.lower() not in (f"http://{host}".lower(), f"https://{host}".lower()):
            return f"requests from other pages ({origin}) are refused; use the studio's own page"
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if request.method == "POST" and media != "application/json":
            return f"a POST must be Content-Type application/json, not {media or 'none'!r}"
        return None


def read_options(body: object) -> tuple[SamplingOptions, str | None, tuple[str, ...], str]:
    """A request's JSON → (options, ckpt_path or None, heads to switch off, ablate_mode). raises
    ValueError in one line for a body that is not an object, an unknown option, or a value of the
    wrong type (head names themselves are checked against the model when it is loaded)."""
    if not isinstance(body, dict):
        raise ValueError('the request must be a JSON object of options, e.g. {"form": "wujue", "rhyme": true}')
    body = dict(body)
    ckpt = body.pop("ckpt_path", None)
    heads, mode = body.pop("ablate", None) or [], body.pop("ablate_mode", None) or "zero"
    if unknown := sorted(set(body) - set(OPTIONS)):
        raise ValueError(f"unknown option {', '.join(unknown)}; the options are {', '.join(OPTIONS)}, ckpt_path, "
                         "ablate, ablate_mode")
    if ckpt is not None and not isinstance(ckpt, str):
        raise ValueError(f"ckpt_path must be a path or null, got {ckpt!r}")
    if not isinstance(heads, list) or not all(isinstance(h, str) for h in heads) or len(heads) > MAX_ABLATED:
        raise ValueError(f'ablate must be a list of at most {MAX_ABLATED} head names, e.g. ["L3H1"], got {heads!r:.80}')
    if mode not in MODES:
        raise ValueError(f"ablate_mode must be one of {', '.join(MODES)}, got {mode!r:.40}")
    try:
        opts = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(SamplingOptions), body))
    except OmegaConfBaseException as err:
        raise ValueError(f"{err.full_key}: {str(err).splitlines()[0]}") from None
    if not 1 <= opts.max_new_tokens <= MAX_NEW_TOKENS:
        raise ValueError(f"max_new_tokens must be 1 to {MAX_NEW_TOKENS} in the studio, got {opts.max_new_tokens}")
    if not 0 <= opts.seed < 2 ** 63:
        raise ValueError(f"seed must be 0 to 2**63 - 1, got {opts.seed}")
    return opts, ckpt or None, tuple(heads), mode


def event(name: str, data: dict) -> str:
    """One server-sent event (JSON escapes every non-ASCII character, lone surrogates included)."""
    return f"event: {name}\ndata: {json.dumps(data)}\n\n"


def template(tune: str) -> dict:
    """What the page shows of a tune while a 词 streams: {name, variants: [{lines: [[length, mark]],
    stanza, rhymes, segments, tones}], commonest first} (`data.verse.tunes.Variant`)."""
    return {"name": tune, "variants": [{"lines": v.lines, "stanza": v.stanza, "rhymes": v.rhymes,
                                        "segments": v.segments, "tones": v.tones} for v in tunes()[tune]]}


class Poem:
    """One page's poem: the engine's steps (`poem_steps` with attention rows) as the page's events.
    raises as `poem_steps` when made, before the first step."""

    def __init__(self, engine: Engine, opts: SamplingOptions, received: float):
        self.engine, self.tok, self.received = engine, engine.tokenizer, received
        start, self.steps, decision = poem_steps(engine, opts, attention_rows=True)
        self.tune = next(iter(decision.tunes), None)  # a 词's tune, or None
        self.seq: list[int] = start[0].tolist()
        ids = plan_ids(self.tok)
        self.given = ids.segment_mask(self.seq) if ids else [False] * len(self.seq)  # the segment: no text
        self.text = StreamDecoder(self.tok)
        self.first: float | None = None  # when the first character was sent, perf_counter seconds
        self.last, self.chars = 0.0, 0

    def chunk(self, ids: list[int]) -> dict:
        """Given tokens (a prompt, not drawn) appended: their labels, texts, and the rows of the
        positions no step computes (the chunk's, less its last, and the one before it)."""
        first, hidden = max(0, len(self.seq) - 1), self.given[len(self.seq):]
        self.seq += ids
        rows = prompt_rows(self.engine.model, self.seq, first)
        texts = [self.text.feed([i]) if k >= len(hidden) or not hidden[k] else "" for k, i in enumerate(ids)]
        return {"tokens": [self.tok.label(i) for i in ids], "texts": texts, "rows": rows}

    def start_event(self) -> str:
        seq, self.seq = self.seq, []
        return event("start", {**self.chunk(seq), "tune": None if self.tune is None else template(self.tune)})

    def allowed(self, mask: torch.Tensor) -> dict:
        """A step's mask, (V,) bool → {count, of, and `allowed` or `blocked`: labels, the shorter
        list, at most SHOWN of them (`more`: how many were left out)}."""
        count, label = int(mask.sum()), self.tok.label
        kind, ids = ("allowed", mask) if count <= mask.numel() - count else ("blocked", ~mask)
        listed = ids.nonzero()[:, 0].tolist()
        return {"count": count, "of": mask.numel(), kind: [label(i) for i in listed[:SHOWN]],
                "more": max(0, len(listed) - SHOWN)}

    def step_event(self, step: Step) -> str:
        i, n = int(step.ids[0, 0]), len(self.seq)
        rows = torch.stack(step.attention_rows)[:, 0]  # (n_layer, n_head, L): the row of position n - 1
        self.seq.append(i)
        text = self.text.feed([i])
        if text:
            self.last = time.perf_counter()
            self.first = self.first or self.last
            self.chars += len(text)
        return event("step", {"pos": n, "label": self.tok.label(i), "text": text, "prob": round(float(step.prob[0]), 6),
                              "row": {"start": n - rows.size(-1), "w": quantised(rows)},
                              "allowed": None if step.allowed is None else self.allowed(step.allowed[0])})

    def next_event(self) -> str | None:
        """The next event, None after `done` or `error` (a user error while drawing, e.g. a step where the
        masks allow nothing, becomes an `error` event)."""
        if self.steps is None:
            return None
        try:
            item = next(self.steps, None)
        except USER_ERRORS as err:
            self.steps = None
            return event("error", {"message": f"error: {err}"})
        if isinstance(item, Step):
            return self.step_event(item)
        if item is not None:  # a prompt after the drawn plan
            return event("given", {"pos": len(self.seq), **self.chunk(item[0].tolist())})
        self.steps = None
        first_ms = None if self.first is None else 1000 * (self.first - self.received)
        rate = (self.chars - 1) / (self.last - self.first) if self.chars > 1 and self.last > self.first else None
        return event("done", {"poem": poem_text(self.tok, torch.tensor(self.seq)), "first_ms": first_ms,
                              "chars": self.chars, "chars_per_s": rate})


def error_response(message: str) -> Response:
    return Response(json.dumps({"error": message}), 400, media_type="application/json")


def inside(path: Path, folders: list[Path]) -> bool:
    """Whether path, its links followed, lies inside one of folders."""
    path = path.resolve()
    return any(path.is_relative_to(f.resolve()) for f in folders)


class Engines:
    """The studio's engines: `engines(ckpt, ablate, mode)` → (engine, its checkpoint file), loaded
    once per file, its time (a rewritten checkpoint is read again) and heads switched off (each
    combination an engine of its own, so poems being written keep theirs; the last 8 kept).
    ckpt: a request's ckpt_path (None: the studio's own `ckpt_path`; `last`: the newest in
    `checkpoint_dir`); folders: checkpoint_dir and `allowed_folders`, the only ones read.
    raises ValueError for a checkpoint outside the folders, or a head the model does not have."""

    def __init__(self, checkpoint_dir: str | Path, ckpt_path: str | None, device: str, backend: str | None,
                 allowed_folders: tuple[str, ...], corpus_path: str | Path | None):
        self.checkpoint_dir, self.ckpt_path = checkpoint_dir, ckpt_path
        self.folders = [Path(checkpoint_dir), *map(Path, allowed_folders)]
        self.load = lru_cache(maxsize=8)(lambda path, mtime_ns, ablate, mode: load_engine(
            path, checkpoint_dir, device, backend, ablate, mode, corpus_path))

    def __call__(self, ckpt: str | None, ablate: tuple[str, ...] = (), mode: str = "zero") -> tuple[Engine, Path]:
        outside = ValueError(f"ckpt_path={ckpt} is outside {', '.join(map(str, self.folders))}: the studio reads "
                             "checkpoints there only (studio.py allowed_folders=[…] adds a folder)")
        if ckpt and ckpt != "last" and not inside(Path(ckpt), self.folders):
            raise outside  # before a file outside is even looked for
        path = find_checkpoint(ckpt or self.ckpt_path, self.checkpoint_dir)
        if ckpt:  # the file that will be opened (a run folder's last.ckpt, links followed) is the one checked
            path = path.resolve()
            if not inside(path, self.folders):
                raise outside
        return self.load(str(path), path.stat().st_mtime_ns, ablate, mode if ablate else "zero"), path


async def no_icon(request: Request) -> Response:
    """What a browser asks for first: nothing."""
    return Response(status_code=204)


def options_info(engine_for: Engines, ckpt: str | None) -> dict:
    """What `/options` answers: the sampling defaults, tunes, forms, controls, the colour scale, and the
    model of `ckpt` (its settings, or an `error` line where it cannot be loaded)."""
    defaults = SamplingOptions()
    info = {"defaults": {f: getattr(defaults, f) for f in OPTIONS}, "tunes": list(tunes()),
            "forms": [{"name": f, "title": FORM_TITLES.get(f, "")} for f in VERSE_FORMS],
            "controls": list(CONTROLS), "colormap": colormap(), "scale": SCALE}
    try:
        engine, path = engine_for(ckpt)
    except USER_ERRORS as err:
        return {**info, "error": f"error: {err}"}
    cfg = engine.model.cfg
    info["model"] = {"ckpt_path": str(path), "plan": plan_ids(engine.tokenizer) is not None, "n_layer": cfg.n_layer,
                     "n_head": cfg.n_head, "block_size": cfg.block_size, "vocab_size": cfg.vocab_size}
    return info


def json_body(raw: bytes) -> dict:
    """A request's body as JSON. raises ValueError in one line: not JSON in UTF-8, or nested too deep."""
    try:
        return json.loads(raw)
    except ValueError as err:  # not JSON, or not UTF-8
        raise ValueError(f"the request is not JSON in UTF-8: {err}") from None
    except RecursionError:
        raise ValueError("the request nests too deep; send a flat JSON object of options") from None


def create_app(checkpoint_dir: str | Path, ckpt_path: str | None = None, device: str = "auto",
               backend: str | None = None, allowed_hosts: tuple[str, ...] = (),
               allowed_folders: tuple[str, ...] = (), corpus_path: str | Path | None = None) -> Starlette:
    """The studio's app (module docstring). ckpt_path: the default checkpoint (None: the newest
    `checkpoint_dir/*/last.ckpt` when a poem is asked for); device, backend: as `sample.py`'s;
    allowed_hosts: Host names served besides the loopback ones; allowed_folders: folders a
    request's ckpt_path may name besides checkpoint_dir; corpus_path: the corpus whose training
    poems give the heads' means (ablate_mode=mean). Nothing is loaded here:
    `app.state.engine_for(None)` loads the default ahead of the first poem."""
    engine_for = Engines(checkpoint_dir, ckpt_path, device, backend, allowed_folders, corpus_path)
    style, script = assets()
    page = importlib.resources.files(__package__).joinpath("studio.html").read_text(encoding="utf-8")
    page = page.replace("/* attention view style */", style).replace("/* attention view script */", script)

    async def index(request: Request) -> HTMLResponse:
        return HTMLResponse(page)

    async def options(request: Request) -> Response:
        info = await anyio.to_thread.run_sync(options_info, engine_for, request.query_params.get("ckpt_path"))
        return Response(json.dumps(info), media_type="application/json")

    async def generate(request: Request) -> Response:
        received = time.perf_counter()
        try:
            opts, ckpt, ablate, mode = read_options(json_body(await request.body()))
            poem = await anyio.to_thread.run_sync(lambda: Poem(engine_for(ckpt, ablate, mode)[0], opts, received))
        except USER_ERRORS as err:
            return error_response(f"error: {err}")
        return StreamingResponse(stream(poem), media_type="text/event-stream", headers={"Cache-Control": "no-store"})

    async def stream(poem: Poem):
        app.state.generating += 1
        try:
            yield poem.start_event()
            while (item := await anyio.to_thread.run_sync(poem.next_event)) is not None:
                yield item
        finally:
            app.state.generating -= 1

    async def plan(request: Request) -> Response:
        q = request.query_params
        try:
            engine = (await anyio.to_thread.run_sync(engine_for, q.get("ckpt_path") or None))[0]
            echo, tune = q.get("title_plan") == "echo", q.get("tune", "")
            size = plan_size(q.get("form") or None, find_tune(tune) if tune else "", echo)
            words = await anyio.to_thread.run_sync(plan_title, engine, q.get("title", ""), size, echo)
        except USER_ERRORS as err:
            return error_response(f"error: {err}")
        note = {"note": nothing_planned(q["title"])} if not words and q.get("title") else {}
        return Response(json.dumps({"words": words, **note}, ensure_ascii=False), media_type="application/json")

    async def status(request: Request) -> Response:
        return Response(json.dumps({"generating": app.state.generating}), media_type="application/json")

    app = Starlette(routes=[Route("/", index), Route("/options", options), Route("/generate", generate, methods=["POST"]),
                            Route("/plan", plan), Route("/status", status), Route("/favicon.ico", no_icon)],
                    middleware=[Middleware(LocalOnly, hosts=(*LOOPBACK, *allowed_hosts))])
    app.state.generating = 0
    app.state.engine_for = engine_for
    return app


@contextlib.contextmanager
def background(app: Starlette):
    """The app on a uvicorn server in a thread, on a free port of 127.0.0.1, while the block runs:
    yields its address (for tests and benchmarks/studio.py)."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
