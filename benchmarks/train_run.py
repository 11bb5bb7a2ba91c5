"""One short `python train.py` run measured and written as JSON, for the GPU check
(scripts/gpu_check.sh) and anywhere a recipe needs a figure from its own device:

    python benchmarks/train_run.py small-gpu experiment=small_gpu data=tang+song trainer.max_steps=300

Runs train.py with the overrides (a fresh run name each time, the CSV logger, no per-validation
callbacks), then writes `benchmarks/results/run-<name>-<device>.json`: machine, commit,
overrides, wall-clock, steps, median `train/tokens_per_sec`, and the last `val/loss`,
`val/bpc` (Tang) and `val/song/bpc` where logged. Exits non-zero if the run fails.
"""
from __future__ import annotations

import csv
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from model.device import commit  # noqa: E402
from model.device import describe as machine  # noqa: E402

QUIET = ["logger=csv", "~callbacks.attention_maps", "~callbacks.samples", "~callbacks.evaluation",
         "~callbacks.head_effects", "trainer.enable_progress_bar=false"]
"""train.py overrides of a measured run: the CSV logger, no per-validation or end-of-run callbacks, no bar."""


def logged(run_dir: Path) -> dict[str, list[float]]:
    """Every value the CSV logger wrote, by key, in step order."""
    values: dict[str, list[float]] = {}
    for metrics in sorted(run_dir.glob("csv/version_*/metrics.csv")):
        with open(metrics, newline="") as f:
            for row in csv.DictReader(f):
                for k, v in row.items():
                    if v not in ("", None):
                        values.setdefault(k, []).append(float(v))
    return values


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or "=" in args[0]:
        print("usage: python benchmarks/train_run.py NAME [train.py overrides ...]", file=sys.stderr)
        return 2
    name, overrides = args[0], args[1:]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    run_name = f"bench-run-{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    cmd = [sys.executable, str(ROOT / "train.py"), f"run_name={run_name}", *QUIET, *overrides]
    print("$", " ".join(cmd[1:]), flush=True)
    start = time.perf_counter()
    done = subprocess.run(cmd)
    wall = time.perf_counter() - start
    if done.returncode:
        print(f"error: train.py exited with {done.returncode}", file=sys.stderr)
        return done.returncode
    values = logged(ROOT / "logs" / run_name)
    last = {k: v[-1] for k, v in values.items() if k.startswith("val/")}
    speed = values.get("train/tokens_per_sec", [])
    result = {"machine": machine(device), "commit": commit(), "device": device, "overrides": overrides,
              "run_name": run_name, "wall_seconds": round(wall, 1), "steps": int(max(values.get("step", [0]))),
              "tokens_per_sec": round(statistics.median(speed)) if speed else None, **last}
    out = ROOT / "benchmarks" / "results" / f"run-{name}-{device}.json"
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1), f"\nwrote {out}", sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
