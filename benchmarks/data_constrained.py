"""When does repeating the data stop helping? Tang `val/bpc` against epochs (training tokens seen ÷
unique training tokens) for a training set small enough to repeat many times on a CPU, with and
without dropout, and against a set of the same size drawn from the 全唐诗 and the 全宋诗 together
(Muennighoff et al. 2023, "Scaling Data-Constrained Language Models": up to about 4 epochs of
repeats cost little, past that the returns fall fast). What docs/benchmarks.md sizes the GPU
recipe from.

    python benchmarks/data_constrained.py                  # every run not yet in the JSON
    python benchmarks/data_constrained.py --only tang tang-dropout --force

Each run is `python train.py` (the tiny model as the default was when the study ran: `MODEL`;
`trainer.max_steps` steps, no per-validation
callbacks, CSV logger) on whole poems drawn at random up to `--subset-tokens` tokens
(`data.train_subset_tokens`), validated on the whole Tang validation split every `--every`
steps. Writes `benchmarks/results/data-constrained-cpu.json` after each run (runs already there
are kept, so the study can be run a few runs at a time) and prints the table.
"""
from __future__ import annotations

import argparse
import csv
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.train_run import PREVIOUS_DEFAULT, QUIET  # noqa: E402
from model.device import commit  # noqa: E402
from model.device import describe as machine  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "data-constrained-cpu.json"
MODEL = PREVIOUS_DEFAULT
"""Overrides that give the default of the study's time (before benchmarks/poet_levers.py's levers landed)."""
RUNS = {  # name → train.py overrides beside the subset and the schedule
    "tang": [],
    "tang-dropout": ["model.dropout=0.1"],
    "tang-attn-dropout": ["+model.attn_dropout=0.1"],
    "tang+song": ["data=tang+song", "~data.also_validate"],
    "tang+song-dropout": ["data=tang+song", "~data.also_validate", "model.dropout=0.1"],
    "tang-wide-dropout": ["model.n_embd=192", "model.dropout=0.1"],
}
"""The study's runs: the Tang subset without dropout, with dropout everywhere (`model.dropout`:
attention weights, residual branches, embeddings), with dropout on the attention weights only
(the lessons' dropout), a subset of the same size from the Tang and Song training splits, and the
tiny shape twice as wide (`n_embd` 192: 4× the block parameters) with dropout."""
MARKS = (1, 2, 4, 8, 16, 32)
"""The epochs the table reports (the validation nearest each)."""


def curve(run_dir: Path) -> list[dict]:
    """The CSV logger's validations: [{"step", "epochs", "val_bpc"}] in step order; `epochs` at step s
    is s times the epochs per step that `train/epochs` gives (its value at step g is for g + 1 steps)."""
    (metrics,) = run_dir.glob("csv/version_*/metrics.csv")
    epochs, points = {}, []
    with open(metrics, newline="") as f:
        for row in csv.DictReader(f):
            if row.get("train/epochs"):
                epochs[int(row["step"])] = float(row["train/epochs"])
            if row.get("val/bpc"):
                points.append({"step": int(float(row["step"])), "val_bpc": float(row["val/bpc"])})
    step, value = next(iter(epochs.items()))
    for p in points:
        p["epochs"] = round(value / (step + 1) * p["step"], 4)
    return points


def run(name: str, overrides: list[str], steps: int, every: int, subset: int) -> dict:
    """One train.py run of the study (folders `bench-dc-<name>`, replaced) → its curve and wall-clock."""
    run_name = f"bench-dc-{name.replace('+', '-')}"
    for old in (ROOT / "logs" / run_name, ROOT / "checkpoints" / run_name):
        shutil.rmtree(old, ignore_errors=True)
    cmd = [sys.executable, str(ROOT / "train.py"), f"run_name={run_name}", f"trainer.max_steps={steps}",
           f"trainer.val_check_interval={every}", f"+data.train_subset_tokens={subset}", *QUIET, *MODEL, *overrides]
    print("$", " ".join(cmd[1:]), flush=True)
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    points = curve(ROOT / "logs" / run_name)
    best = min(points, key=lambda p: p["val_bpc"])
    return {"overrides": overrides, "wall_seconds": round(time.perf_counter() - start, 1), "curve": points,
            "best": best}


def at_epoch(points: list[dict], epochs: float) -> dict | None:
    """The validation nearest `epochs` (within a quarter of it), or None."""
    near = min(points, key=lambda p: abs(p["epochs"] - epochs), default=None)
    return near if near and abs(near["epochs"] - epochs) <= epochs / 4 else None


def table(result: dict) -> str:
    """Markdown: one row per run, Tang val/bpc at each of MARKS epochs, and the best and where."""
    header = "| run | " + " | ".join(f"{e} ep" for e in MARKS) + " | best (epochs) |"
    lines = [header, "|---|" + "---:|" * (len(MARKS) + 1)]
    for name, r in result["runs"].items():
        cells = [f"{p['val_bpc']:.3f}" if (p := at_epoch(r["curve"], e)) else "–" for e in MARKS]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {r['best']['val_bpc']:.3f} ({r['best']['epochs']:.1f}) |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=4000, help="training steps of every run")
    p.add_argument("--every", type=int, default=125, help="validate every this many steps")
    p.add_argument("--subset-tokens", type=int, default=288_000,
                   help="unique training tokens (whole poems; 1/10 of the Tang training split)")
    p.add_argument("--only", nargs="*", default=None, choices=list(RUNS), help="these runs only")
    p.add_argument("--force", action="store_true", help="run again what the JSON already has")
    args = p.parse_args(argv)
    settings = {"steps": args.steps, "every": args.every, "subset_tokens": args.subset_tokens}
    result = json.loads(OUT.read_text()) if OUT.exists() else {}
    if result.get("settings") != settings:  # other settings: another study
        result = {"settings": settings, "runs": {}}
    result.update(machine=machine(), commit=commit())
    for name in args.only or RUNS:
        if name in result["runs"] and not args.force:
            continue
        result["runs"][name] = run(name, RUNS[name], args.steps, args.every, args.subset_tokens)
        OUT.write_text(json.dumps(result, indent=1))
        print(table(result), flush=True)
    print(f"{result['machine']}\n\n{table(result)}\n\nwrote {OUT}")


if __name__ == "__main__":
    main()
