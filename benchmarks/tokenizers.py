"""Character versus BPE tokens on the shipped corpus, and what each buys in a fixed time.

    python -m data.bpe                                   # once: data/cache/tang-bpe-1024.tiktoken
    python benchmarks/tokenizers.py                      # tables + logs/tokenizers-cpu.json
    python benchmarks/tokenizers.py --minutes 0 --encodings cl100k_base o200k_base gpt2   # counts only

1. Counts, from the prepared arrays (`PoetryDataModule`, simplified script) of each
   tokenizer: characters of the poems, tokens (without `<bos>`/`<eos>`), tokens per
   character, and the vocabulary used (ids, `<bos>`/`<eos>` included). Named tiktoken
   encodings that are neither cached nor downloadable here are listed as unavailable.
2. Unless `--minutes 0`: two training runs of `train.py` with the same model (`tiny`), seed,
   batch and wall-clock budget (`trainer.max_time`), one with characters and one with the
   ranks file, each followed by one full validation; the learning rate stays constant after
   warm-up because the runs end by time, not by step count. Reports `val/bpc` (total nats
   over the held-out poems ÷ their characters ÷ ln 2) and `val/loss` (nats per token).
"""
from __future__ import annotations

import argparse
import csv
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from data.datamodule import PoetryDataModule  # noqa: E402
from data.tokenizer import EncodingUnavailableError  # noqa: E402
from model.device import describe  # noqa: E402
from model.loading import read_checkpoint  # noqa: E402

CORPUS = ROOT / "data" / "corpus" / "tang.jsonl.xz"


def counts(tokenizer: dict, corpus: Path = CORPUS, cache: Path = ROOT / "data" / "cache") -> dict:
    """Characters, tokens and vocabulary of the prepared arrays for one tokenizer config."""
    dm = PoetryDataModule(str(corpus), str(cache), tokenizer=tokenizer)
    meta = dm.meta
    chars = meta["train"]["characters"] + meta["val"]["characters"]
    poems = meta["train"]["poems"] + meta["val"]["poems"]
    tokens = meta["train"]["tokens"] + meta["val"]["tokens"] - 2 * poems
    return {"characters": chars, "tokens": tokens, "tokens_per_char": tokens / chars, "vocab_used": meta["vocab_size"],
            "val_characters": meta["val"]["characters"], "val_tokens": meta["val"]["tokens"]}


def train_run(name: str, overrides: list[str], minutes: float) -> dict:
    """Run train.py for `minutes` of training, then one validation; its final logged metrics."""
    run_name = f"bench-tokenizers-{name}"
    m, s = divmod(round(minutes * 60), 60)
    cmd = [sys.executable, str(ROOT / "train.py"), *overrides, f"run_name={run_name}", "trainer=cpu",
           "trainer.max_steps=1000000", f"trainer.max_time=00:00:{m:02d}:{s:02d}", "trainer.val_check_interval=200000",
           "model.optim.min_lr_ratio=1.0", "logger=csv", "~callbacks.attention_maps", "~callbacks.samples",
           "trainer.enable_progress_bar=false"]
    log_dir, ckpt = ROOT / "logs" / run_name, ROOT / "checkpoints" / run_name / "last.ckpt"
    for old in (log_dir, ckpt.parent):  # this run's folders from an earlier call
        shutil.rmtree(old, ignore_errors=True)
    start = time.perf_counter()
    subprocess.run(cmd, check=True)
    wall = time.perf_counter() - start
    (metrics,) = (log_dir / "csv").glob("version_*/metrics.csv")
    rows = list(csv.DictReader(metrics.open()))
    val = [r for r in rows if r.get("val/bpc")]
    if not val:
        raise RuntimeError(f"{metrics} has no validation row")
    steps = read_checkpoint(ckpt)["global_step"]
    speed = statistics.median(float(r["train/tokens_per_sec"]) for r in rows if r.get("train/tokens_per_sec"))
    return {"val_bpc": float(val[-1]["val/bpc"]), "val_loss": float(val[-1]["val/loss"]), "steps": steps,
            "tokens_per_sec_median": round(speed),  # a low value flags a run slowed by other work here
            "wall_s": round(wall, 1), "checkpoint": str(ckpt.relative_to(ROOT))}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=Path, default=ROOT / "data" / "cache" / "tang-bpe-1024.tiktoken",
                   help="the .tiktoken ranks file of the BPE run (python -m data.bpe makes the default)")
    p.add_argument("--encodings", nargs="*", default=["cl100k_base", "o200k_base", "gpt2"],
                   help="named tiktoken encodings to count, where available")
    p.add_argument("--corpus", type=Path, default=CORPUS, help="the corpus the counts are taken on")
    p.add_argument("--cache", type=Path, default=ROOT / "data" / "cache", help="its prepared arrays' folder")
    p.add_argument("--minutes", type=float, default=4.0, help="training budget of each run; 0: counts only")
    p.add_argument("--out", type=Path, default=ROOT / "logs" / "tokenizers-cpu.json",
                   help="the JSON (a study: its table goes to docs/experiments.md)")
    args = p.parse_args(argv)
    if not args.ranks.is_file():
        raise SystemExit(f"error: ranks file {args.ranks} not found; make it with `python -m data.bpe`")

    tokenizers = {"char": {"kind": "char"}, args.ranks.name: {"kind": "tiktoken", "encoding": str(args.ranks)}}
    tokenizers |= {name: {"kind": "tiktoken", "encoding": name} for name in args.encodings}
    table = {}
    for name, cfg in tokenizers.items():
        try:
            table[name] = counts(cfg, args.corpus, args.cache)
        except EncodingUnavailableError as err:
            table[name] = {"unavailable": str(err).split(" (")[0]}

    runs = {}
    if args.minutes > 0:
        runs["char"] = train_run("char", ["tokenizer=char"], args.minutes)
        runs[args.ranks.name] = train_run("bpe", ["tokenizer=tiktoken", f"tokenizer.encoding={args.ranks}"],
                                          args.minutes)

    print("| tokenizer | characters | tokens | tokens/char | vocabulary used | val/bpc | val/loss (nats/token) "
          "| steps | tokens/s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, c in table.items():
        if "unavailable" in c:
            print(f"| {name} | not available here | | | | | | | |")
            continue
        r = runs.get(name, {})
        run = (f"{r['val_bpc']:.3f} | {r['val_loss']:.3f} | {r['steps']:,} | {r['tokens_per_sec_median']:,}" if r
               else " | | | ")
        print(f"| {name} | {c['characters']:,} | {c['tokens']:,} | {c['tokens_per_char']:.3f} | {c['vocab_used']:,} "
              f"| {run} |")

    meta = {"machine": describe(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "model": "tiny", "minutes_per_run": args.minutes,
            "ranks_file": args.ranks.name}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "counts": table, "runs": runs}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
