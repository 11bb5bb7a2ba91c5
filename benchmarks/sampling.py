"""Sampling speed with and without the KV cache, side by side in one process.

    python benchmarks/sampling.py                   # CPU, float32
    python benchmarks/sampling.py --device cuda     # GPU

For the `tiny` and `small` model sizes (conf/model, with the shipped corpus's vocabulary,
random weights: speed does not depend on training), batch 1 and 16: the median time to
sample block_size - 1 tokens after `<bos>` (so the cache never has to be re-filled), with
`GPT.generate(use_cache=False)` (every step recomputes the whole context, as nanoGPT does)
and with the cache. Prints a table of tokens per second (batch × new tokens ÷ seconds) and
the ratio, and writes everything to a JSON file.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from model.gpt import GPT, GPTConfig  # noqa: E402

VOCAB = 8164  # the shipped corpus's characters in simplified script, plus <bos> and <eos>
FIELDS = ("block_size", "n_layer", "n_head", "n_embd")


def model_of(name: str, device: str) -> GPT:
    """A randomly initialised GPT of conf/model/<name>.yaml's size, eval mode, on device."""
    cfg = OmegaConf.load(ROOT / "conf" / "model" / f"{name}.yaml")
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=VOCAB, **{k: cfg[k] for k in FIELDS})).to(device).eval()


def seconds(fn, device: str, repeats: int) -> float:
    """Median wall time of fn() over `repeats` calls, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--models", nargs="+", default=["tiny", "small"])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 16])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "sampling-{device}.json")
    args = ap.parse_args()

    rows = []
    print(f"{'model':6} {'batch':>5} {'tokens':>6} {'no cache tok/s':>15} {'KV cache tok/s':>15} {'ratio':>6}")
    for name in args.models:
        model = model_of(name, args.device)
        n_new = model.cfg.block_size - 1
        for batch in args.batches:
            start = torch.zeros(batch, 1, dtype=torch.long, device=args.device)
            rate = {}
            for use_cache in (False, True):
                gen = torch.Generator(device=args.device)
                run = lambda: model.generate(start, n_new, temperature=1.0, top_k=200,  # noqa: E731
                                             generator=gen.manual_seed(0), use_cache=use_cache)
                rate[use_cache] = batch * n_new / seconds(run, args.device, args.repeats)
            rows.append({"model": name, "batch": batch, "new_tokens": n_new, "no_cache_tokens_per_sec": rate[False],
                         "cache_tokens_per_sec": rate[True], "ratio": rate[True] / rate[False]})
            r = rows[-1]
            print(f"{name:6} {batch:5d} {n_new:6d} {r['no_cache_tokens_per_sec']:15.0f} "
                  f"{r['cache_tokens_per_sec']:15.0f} {r['ratio']:5.1f}×", flush=True)

    out = Path(str(args.out).format(device=args.device))
    out.parent.mkdir(parents=True, exist_ok=True)
    machine = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or platform.machine()
    meta = {"device": args.device, "machine": machine, "threads": torch.get_num_threads(), "torch": torch.__version__}
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({**meta, "rows": rows}, indent=2))
    tmp.replace(out)  # never a half-written file
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
