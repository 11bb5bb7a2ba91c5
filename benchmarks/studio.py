"""The studio's speed as a page sees it: first-character latency and characters per second.

    python benchmarks/studio.py                       # the newest checkpoints/*/last.ckpt
    python benchmarks/studio.py --ckpt checkpoints/<run>/last.ckpt

Serves the studio (`model.studio.server`) on uvicorn in this process, as `python studio.py`
does, and asks it for `--poems` poems of each option set below, one at a time, with HTTP
streaming as the page uses it. For each: the first character's latency measured by the
server (request received → the first character's event handed to the server, the `done`
event's `first_ms`) and by the client (request sent → that event read), and characters per
second while streaming (first to last character). Medians, after a first 七律 with meter
whose latency (the tables it builds once) is recorded apart; also the page's size and the
studio's lines. Writes everything to a JSON file.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import httpx2 as httpx
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from model.device import describe  # noqa: E402
from model.loading import find_checkpoint, read_checkpoint  # noqa: E402
from model.studio.server import background, create_app  # noqa: E402

CASES = {  # name → options
    "free": {},
    "wujue, rhyme": {"form": "wujue", "rhyme": True},
    "qijue, acrostic 明月清风": {"form": "qijue", "acrostic": "明月清风"},
    "qilv, meter": {"form": "qilv", "meter": True},
}


def one_poem(http: httpx.Client, options: dict) -> dict:
    """Stream one poem: {client_first_ms, client_chars_per_s, and the `done` event's figures}."""
    sent, first, last, chars = time.perf_counter(), None, None, 0
    with http.stream("POST", "/generate", json=options) as r:
        r.raise_for_status()
        name = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: ") and name in ("step", "done", "error"):
                data = json.loads(line[6:])
                if name == "error":
                    raise RuntimeError(data["message"])
                if name == "done":
                    rate = (chars - 1) / (last - first) if chars > 1 else None
                    return {"client_first_ms": 1000 * (first - sent), "client_chars_per_s": rate, **data}
                if data["text"]:
                    last = time.perf_counter()
                    first = first or last
                    chars += len(data["text"])
    raise RuntimeError("the stream ended without a done event")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ckpt", type=Path, default=None, help="default: the newest checkpoints/*/last.ckpt")
    ap.add_argument("--poems", type=int, default=5, help="poems per option set (seeds 0, 1, …)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "studio-cpu.json")
    args = ap.parse_args()

    ckpt = find_checkpoint(args.ckpt, ROOT / "checkpoints")
    app = create_app(ROOT / "checkpoints", str(ckpt), device="cpu")
    engine, _ = app.state.engine_for(None)  # loaded before the first poem, as studio.py does
    cfg = engine.model.cfg
    rows = []
    with background(app) as url, httpx.Client(base_url=url, timeout=120) as http:
        page = http.get("/")
        cold = one_poem(http, {"form": "qilv", "meter": True, "seed": 0})  # the first poem builds the rhyme and tone tables
        print(f"{'options':26} {'server first ms':>15} {'client first ms':>15} {'chars/s':>8} {'chars':>6}")
        for name, options in CASES.items():
            runs = [one_poem(http, {**options, "seed": seed}) for seed in range(args.poems)]
            row = {"options": name, "poems": len(runs), **{k: statistics.median(r[k] for r in runs) for k in (
                "first_ms", "client_first_ms", "chars_per_s", "client_chars_per_s", "chars")},
                   "max_first_ms": max(r["first_ms"] for r in runs)}
            rows.append(row)
            print(f"{name:26} {row['first_ms']:15.0f} {row['client_first_ms']:15.0f} {row['chars_per_s']:8.0f} "
                  f"{row['chars']:6.0f}", flush=True)
    template = ROOT / "model" / "studio" / "studio.html"
    lines = {p: len(p.read_text(encoding="utf-8").splitlines()) for p in (ROOT / "model" / "studio" / "server.py",
                                                                          ROOT / "studio.py", template)}
    meta = {"device": "cpu", "machine": describe("cpu"), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "ckpt": str(ckpt.resolve().relative_to(ROOT)) if ckpt.resolve().is_relative_to(ROOT) else str(ckpt),
            "ckpt_step": read_checkpoint(ckpt).get("global_step"),
            "model": {k: getattr(cfg, k) for k in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")},
            "cold_first_ms": cold["first_ms"], "page_bytes": len(page.content), "template_bytes": template.stat().st_size,
            "lines": {str(p.relative_to(ROOT)): n for p, n in lines.items()}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps({**meta, "rows": rows}, indent=2, ensure_ascii=False))
    tmp.replace(args.out)  # never a half-written file
    print(f"page {meta['page_bytes']:,} bytes; wrote {args.out}")


if __name__ == "__main__":
    main()
