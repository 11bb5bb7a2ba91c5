"""Sampling speed with and without the KV cache, and with and without forced keywords, side
by side in one process.

    python benchmarks/sampling.py                   # CPU, float32
    python benchmarks/sampling.py --device cuda     # GPU

For the `tiny` and `small` model sizes (conf/model, with a vocabulary of the shipped
corpus's size, random weights: speed does not depend on training), batch 1 and 16: the
median time to sample up to block_size - 1 tokens after `<bos>` (so the cache never has to
be re-filled) through the one sampling path (`model.sampling.poems.poem_steps`, poem rules
included), with `use_cache=False` (every step recomputes the whole context, as nanoGPT does)
and with the cache. Prints a table of tokens per second (batch × steps ÷ seconds) and the
ratio. Then the cost of forced keywords (`keywords=[明月,故乡]`, `model/sampling/keywords.py`):
for the `tiny` model with the cache, batches 16 and 300 (evaluate.py's), each poetry-control set
with and without the keywords, the two alternated `--repeats` times: tokens per second (over the
median time) and the ratio (keywords ÷ none: the median of the turns' ratios). Then the cost of
writing to a tune (`tune=`, its templates kept by `model/sampling/shape.py`, every mask on: `rhyme=true meter=true
keywords=[明月,故乡]`) for a short and two long tunes (longer than the `tiny` block: the cache is
re-filled), against free sampling of as many tokens, the same way. Writes
everything to a JSON file.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from data.tokenizer import CharTokenizer  # noqa: E402
from data.verse.poetry import LINE_END  # noqa: E402
from model.device import describe  # noqa: E402
from model.engine import Engine  # noqa: E402
from model.gpt import GPT, GPTConfig  # noqa: E402
from model.sampling.poems import SamplingOptions, poem_steps  # noqa: E402

VOCAB = 8164  # the shipped corpus's characters in simplified script, plus <bos> and <eos>
FIELDS = ("block_size", "n_layer", "n_head", "n_embd")
KEYWORDS = ["明月", "故乡"]
CONTROL_SETS = {"wujue": {"form": "wujue"}, "qilv+rhyme": {"form": "qilv", "rhyme": True},
                "wulv+meter": {"form": "wulv", "meter": True}, "qijue+acrostic": {"form": "qijue", "acrostic": "春夏明月"}}
"""The sets whose speed is compared with and without KEYWORDS."""
TUNES = ("浣溪沙", "水调歌头", "沁园春")
"""The tunes whose speed with every mask is compared with free sampling: the commonest, and two
longer than the tiny model's block (95 and 114 characters)."""


def model_of(name: str, device: str) -> Engine:
    """A randomly initialised model of conf/model/<name>.yaml's size over VOCAB ids (the line
    marks and CJK ideographs from U+4E00), eval mode, on device."""
    cfg = OmegaConf.load(ROOT / "conf" / "model" / f"{name}.yaml")
    marks = LINE_END + "、"  # 、 ends lines in some tunes' templates
    chars = marks + "".join(chr(0x4E00 + i) for i in range(VOCAB - 2 - len(marks)))
    tok = CharTokenizer(chars)
    torch.manual_seed(0)
    return Engine(GPT(GPTConfig(vocab_size=tok.vocab_size, **{k: cfg[k] for k in FIELDS})).to(device).eval(), tok)


def sample_steps(engine: Engine, opts: SamplingOptions) -> int:
    """Sample through the shared path; returns the number of steps taken."""
    _, steps, _ = poem_steps(engine, opts)
    return sum(1 for _ in steps)


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


def alternated_rates(engine: Engine, opts: dict, steps: dict, batch: int, repeats: int) -> dict:
    """Tokens per second (batch × steps ÷ median seconds) of each of `opts` (key → SamplingOptions,
    warmed up; `steps`: the steps each takes), the options timed in turn `repeats` times; under
    "ratio", the median over the turns of the last option's rate ÷ the first's, each turn's pair
    timed back to back (so a machine that slows down over the run does not tip the ratio); under
    "turn_seconds", each turn's [first, last] seconds."""
    times = {key: [] for key in opts}
    for _ in range(repeats):
        for key, o in opts.items():
            t0 = time.perf_counter()
            sample_steps(engine, o)
            times[key].append(time.perf_counter() - t0)
    first, last = list(opts)[0], list(opts)[-1]
    pairs = [steps[last] * a / (steps[first] * b) for a, b in zip(times[first], times[last])]
    return {**{key: batch * steps[key] / statistics.median(times[key]) for key in opts},
            "ratio": statistics.median(pairs), "turn_seconds": [[a, b] for a, b in zip(times[first], times[last])]}


def keyword_costs(engine: Engine, batches: list[int], repeats: int) -> list[dict]:
    """Tokens per second of each CONTROL_SETS set with and without KEYWORDS (KV cache, seed 0),
    the two timed in turn `repeats` times after a warm-up; prints a row per set and batch."""
    rows = []
    print(f"\n{'set':15} {'batch':>5} {'tokens/s':>9} {'+keywords':>10} {'ratio':>6}")
    for batch in batches:
        for name, fields in CONTROL_SETS.items():
            opts = {kw: SamplingOptions(num_samples=batch, seed=0, keywords=KEYWORDS if kw else (), **fields)
                    for kw in (False, True)}
            steps = {kw: sample_steps(engine, o) for kw, o in opts.items()}  # warm-up, and the steps taken
            rate = alternated_rates(engine, opts, steps, batch, repeats)
            rows.append({"set": name, "batch": batch, "tokens_per_sec": rate[False],
                         "keywords_tokens_per_sec": rate[True], "ratio": rate["ratio"],
                         "turn_seconds": rate["turn_seconds"]})
            print(f"{name:15} {batch:5d} {rate[False]:9.0f} {rate[True]:10.0f} {rows[-1]['ratio']:5.2f}×", flush=True)
    return rows


def tune_costs(engine: Engine, batches: list[int], repeats: int) -> list[dict]:
    """Tokens per second of each of TUNES with `rhyme`, `meter` and KEYWORDS (KV cache, seed 0) and of free
    sampling of as many tokens, the two timed in turn `repeats` times after a warm-up; prints a row
    per tune and batch."""
    rows = []
    print(f"\n{'tune':15} {'batch':>5} {'tokens':>6} {'free tok/s':>10} {'tune tok/s':>10} {'ratio':>6}")
    for batch in batches:
        for tune in TUNES:
            masked = SamplingOptions(num_samples=batch, seed=0, tune=tune, rhyme=True, meter=True, keywords=KEYWORDS)
            n = sample_steps(engine, masked)  # warm-up, and the tokens the 词 takes
            opts = {False: SamplingOptions(num_samples=batch, seed=0, max_new_tokens=n), True: masked}
            steps = {False: sample_steps(engine, opts[False]), True: n}
            rate = alternated_rates(engine, opts, steps, batch, repeats)
            rows.append({"tune": tune, "masks": f"rhyme=true meter=true keywords=[{','.join(KEYWORDS)}]",
                         "batch": batch, "tokens": n, "free_tokens_per_sec": rate[False],
                         "tune_tokens_per_sec": rate[True], "ratio": rate["ratio"],
                         "turn_seconds": rate["turn_seconds"]})
            print(f"{tune:15} {batch:5d} {n:6d} {rate[False]:10.0f} {rate[True]:10.0f} {rows[-1]['ratio']:5.2f}×",
                  flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--models", nargs="+", default=["tiny", "small"])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 16])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--keyword-batches", nargs="+", type=int, default=[16, 300])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "sampling-{device}.json")
    args = ap.parse_args()

    rows = []
    print(f"{'model':6} {'batch':>5} {'tokens':>6} {'no cache tok/s':>15} {'KV cache tok/s':>15} {'ratio':>6}")
    for name in args.models:
        engine = model_of(name, args.device)
        n_new = engine.model.cfg.block_size - 1
        for batch in args.batches:
            rate = {}
            for use_cache in (False, True):
                opts = SamplingOptions(num_samples=batch, max_new_tokens=n_new, temperature=1.0, top_k=200,
                                       seed=0, use_cache=use_cache)
                n_steps = sample_steps(engine, opts)  # a poem may end early: count the steps taken
                rate[use_cache] = batch * n_steps / seconds(lambda: sample_steps(engine, opts), args.device,
                                                            args.repeats)
            rows.append({"model": name, "batch": batch, "new_tokens": n_new, "no_cache_tokens_per_sec": rate[False],
                         "cache_tokens_per_sec": rate[True], "ratio": rate[True] / rate[False]})
            r = rows[-1]
            print(f"{name:6} {batch:5d} {n_new:6d} {r['no_cache_tokens_per_sec']:15.0f} "
                  f"{r['cache_tokens_per_sec']:15.0f} {r['ratio']:5.1f}×", flush=True)

    keyword_rows = keyword_costs(model_of("tiny", args.device), args.keyword_batches, args.repeats)
    tune_rows = tune_costs(model_of("tiny", args.device), args.keyword_batches, args.repeats)
    out = Path(str(args.out).format(device=args.device))
    out.parent.mkdir(parents=True, exist_ok=True)
    machine = describe(args.device)
    meta = {"device": args.device, "machine": machine, "threads": torch.get_num_threads(), "torch": torch.__version__}
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({**meta, "rows": rows, "keywords": KEYWORDS, "keyword_rows": keyword_rows,
                               "tune_rows": tune_rows}, indent=2))
    tmp.replace(out)  # never a half-written file
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
