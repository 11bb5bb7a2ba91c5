"""Levers toward poems as the poets write them, screened against the default at the default's steps:
rhyme of regulated poems at three sampling seeds and with a form mask alone, the mix of forms,
distinct-2, and `val/bpc` on both protocols (the poems and nanoGPT's 64-token windows).

    python benchmarks/poet_levers.py                       # every lever not yet in the JSON
    python benchmarks/poet_levers.py --only default rhyme-slots-0.1 --force
    python benchmarks/poet_levers.py --only default --default-checkpoint checkpoints/bench-fixed-time-default/last.ckpt
    python benchmarks/poet_levers.py --step-time previous-default default   # a step's cost, side by side

Every lever but `default` is set on top of the default before they landed (`PREVIOUS`, sampled
with `PREVIOUS_SAMPLING`), so each figure stays reproducible as the default moves.

Each lever: `python train.py` with its overrides (the CSV logger, no per-validation or end-of-run
callbacks: `benchmarks/train_run.QUIET`; the default's `trainer.max_steps`, so the same schedule),
then `evaluate.py sets=[free,form]` (300 poems a set) at each of SEEDS, and `val/bpc` by
`benchmarks/fixed_time.score`. Writes `benchmarks/results/poet-levers-cpu.json` after each lever
(levers already there are kept). Wall-clock seconds are recorded but compare only on a quiet
machine; a lever that adds work is timed by the fixed-time benchmark before it lands.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.fixed_time import score  # noqa: E402
from benchmarks.train_run import PREVIOUS_DEFAULT, QUIET  # noqa: E402
from model.device import commit  # noqa: E402
from model.device import describe as machine  # noqa: E402
from model.loading import load_engine  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "poet-levers-cpu.json"
PREVIOUS = PREVIOUS_DEFAULT
"""The default before issue 27's levers landed: every lever is these overrides, then its own."""
PREVIOUS_SAMPLING = ["temperature=0.8", "top_p=null"]
"""evaluate.py's sampling before the default became temperature 1.0, top_p 0.9 (top_k 200 in both)."""
SLOTS_01 = ["model.rhyme_loss_at=rhyme_slots", "model.rhyme_loss_weight=0.1"]
MID_025 = ["data.mid_poem_fraction=0.25", "model.struct_recover=true"]
LANDED = [*PREVIOUS, *MID_025, *SLOTS_01]
"""The default issue 27's first levers landed (mid-poem 0.25 with rhyme slots 0.1): the base of later levers."""
LANDED_SAMPLING = ["temperature=1.0", "top_k=200", "top_p=0.9"]
"""evaluate.py's sampling since that default landed."""
LEVERS = {
    "previous-default": (PREVIOUS, PREVIOUS_SAMPLING),
    "rhyme-slots-0.1": ([*PREVIOUS, *SLOTS_01], PREVIOUS_SAMPLING),
    "rhyme-slots-0.3": ([*PREVIOUS, "model.rhyme_loss_at=rhyme_slots", "model.rhyme_loss_weight=0.3"],
                        PREVIOUS_SAMPLING),
    "mid-poem-0.25": ([*PREVIOUS, *MID_025], PREVIOUS_SAMPLING),
    "mid-poem-0.5": ([*PREVIOUS, "data.mid_poem_fraction=0.5", "model.struct_recover=true"], PREVIOUS_SAMPLING),
    "mid-poem-0.25+rhyme-slots-0.1": ([*PREVIOUS, *MID_025, *SLOTS_01], PREVIOUS_SAMPLING),
    "landed+rhyme-slots-0.2": ([*LANDED, "model.rhyme_loss_weight=0.2"], LANDED_SAMPLING),
    "landed+block-96": ([*LANDED, "model.block_size=96", "data.batch_size=24"], LANDED_SAMPLING),
    "landed+block-128": ([*LANDED, "model.block_size=128", "data.batch_size=18"], LANDED_SAMPLING),
    "landed+plan": ([*LANDED, "data.plan_tokens=true"], LANDED_SAMPLING),
    "landed+anneal-0.1": ([*LANDED, "data.anneal_fraction=0.1", "data.anneal_mix=rhymed"], LANDED_SAMPLING),
    "landed+plan+anneal-0.1": ([*LANDED, "data.plan_tokens=true", "data.anneal_fraction=0.1", "data.anneal_mix=rhymed"],
                               LANDED_SAMPLING),
    "landed+plan+anneal-forms-0.1": ([*LANDED, "data.plan_tokens=true", "data.anneal_fraction=0.1",
                                      "data.anneal_mix=forms"], LANDED_SAMPLING),
    "landed+plan+anneal-forms-0.05": ([*LANDED, "data.plan_tokens=true", "data.anneal_fraction=0.05",
                                       "data.anneal_mix=forms"], LANDED_SAMPLING),
    "landed+depth-5": ([*LANDED, "model.n_layer=5", "trainer.max_steps=1830"], LANDED_SAMPLING),
    "landed+width-128": ([*LANDED, "model.n_embd=128", "trainer.max_steps=1570"], LANDED_SAMPLING),
    "landed+batch-48": ([*LANDED, "data.batch_size=48", "trainer.max_steps=1470"], LANDED_SAMPLING),
    "default": ([], []),
}
"""Lever name → (train.py overrides, evaluate.py sampling overrides). `rhyme-slots-w`: the auxiliary
rhyme loss (weight w) on the even lines' last characters only (`model.rhyme_loss_at`), not on every
line end. `mid-poem-f`: a share f of training windows starts at a random offset
(`data.mid_poem_fraction`), with the structure inputs read from the marks where the poem's start is
out of sight (`model.struct_recover`). `landed+…`: a lever on top of the default those two
landed as (`LANDED`, sampled at `LANDED_SAMPLING`); `block-b`: windows of b tokens, with as many
tokens a batch (batch size 2304 / b), so a long 古体 is trained with its start in sight.
`plan`: plan tokens (`data.plan_tokens`): each poem starts with its form and rhyme group, so the
model draws its form from the poets' mix and writes to the rhyme it drew. `anneal-f`: the run's
last share f of windows from poems whose even lines rhyme (`data/anneal.py`); `anneal-forms-f`: those
windows drawn so each form keeps its share of the windows that start a poem (`data.anneal_mix`). `depth-5`,
`width-128`, `batch-48`: 5 layers, n_embd 128, 48 windows a batch, each with the steps that cost
the default's training time (a step's cost against the default's: 1.20× and 1.40×, measured in one
process; 1.5× for batch 48, its tokens). `default`: today's (`landed+plan+anneal-forms-0.1`, sampled
at temperature 1.05; the plan drawn without top_k and top_p, as every plan model's is now:
`landed+plan` was sampled before that)."""
SEEDS = (1337, 1, 2)
FORMS = ("wujue", "qijue", "wulv", "qilv")
KEPT = ("regulated", "rhyme_regulated", *FORMS, "other", "alternation", "nian", "dui", "copy", "distinct_2")
"""The evaluate.py columns kept per sample set."""


def evaluate(ckpt: Path, seed: int, out_dir: Path, sampling: list[str]) -> dict:
    """evaluate.py's free and form-only rows of a checkpoint at `seed` with the `sampling` overrides
    (and the human row): {row: {KEPT}}."""
    subprocess.run([sys.executable, str(ROOT / "evaluate.py"), f"ckpt_path={ckpt}", "sets=[free,form]", f"seed={seed}",
                    "val_bpc=false", f"out_dir={out_dir}", *sampling], check=True, stdout=subprocess.DEVNULL)
    rows = json.loads((out_dir / "evaluate.json").read_text())["rows"]
    return {name: {k: round(row[k], 4) for k in KEPT if row.get(k) is not None} for name, row in rows.items()}


def run(name: str, overrides: list[str], sampling: list[str]) -> dict:
    """Train one lever (folders `bench-pl-<name>`, replaced), evaluate it at every seed, score it."""
    run_name = f"bench-pl-{name}"
    for old in (ROOT / "logs" / run_name, ROOT / "checkpoints" / run_name):
        shutil.rmtree(old, ignore_errors=True)
    cmd = [sys.executable, str(ROOT / "train.py"), f"run_name={run_name}", *QUIET, *overrides]
    print("$", " ".join(cmd[1:]), flush=True)
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    return {"overrides": overrides, "sampling": sampling, "wall_seconds": round(wall, 1),
            **measure(ROOT / "checkpoints" / run_name / "last.ckpt", sampling, ROOT / "logs" / run_name)}


def measure(ckpt: Path, sampling: list[str], log_dir: Path) -> dict:
    """A checkpoint evaluated at every seed (JSON under log_dir/evaluate-<seed>) and scored: {"seeds", "val"}."""
    seeds = {str(s): evaluate(ckpt, s, log_dir / f"evaluate-{s}", sampling) for s in SEEDS}
    return {"seeds": seeds, "val": score(load_engine(ckpt))}


def default_run(ckpt: Path) -> dict:
    """The `default` lever from a run of today's default that exists (e.g. the fixed-time benchmark's)
    instead of training it again."""
    return {"overrides": [], "sampling": [], "wall_seconds": None, "checkpoint": os.path.relpath(ckpt, ROOT),
            **measure(ckpt, [], ROOT / "logs" / "bench-pl-default")}


def summary(r: dict) -> dict:
    """The issue's goals of one lever: free rhyme/regulated per seed, the least form-alone rhyme, the
    mean form mix and distinct-2 of the free sets, both val/bpc protocols."""
    seeds = r["seeds"].values()
    free = [s["free"] for s in seeds]
    return {"free_rhyme": [f["rhyme_regulated"] for f in free],
            "form_rhyme": {f: min(s[f]["rhyme_regulated"] for s in seeds) for f in FORMS},
            "mix": {k: sum(f[k] for f in free) / len(free) for k in (*FORMS, "other")},
            "distinct_2": sum(f["distinct_2"] for f in free) / len(free),
            **{k: sum(f[k] for f in free) / len(free) for k in ("regulated", "alternation", "nian", "dui")},
            "poems_bpc": r["val"]["poems"]["val_bpc"], "blocks_bpc": r["val"]["blocks"]["val_bpc"]}


def table(result: dict) -> str:
    """Markdown: one row per lever (free rhyme/regulated at each seed, the least form-alone rhyme,
    the mix of forms 五绝 / 七绝 / 五律 / 七律 / other, distinct-2, regulated, alternation / 黏 / 对
    of the free poems (means over the seeds), val/bpc poems and 64-token blocks)."""
    lines = ["| lever | free rhy/reg " + " / ".join(map(str, SEEDS)) + " | least form-alone rhy/reg "
             "| 五绝 / 七绝 / 五律 / 七律 / other | distinct-2 | regulated | alt / 黏 / 对 | val/bpc poems "
             "| val/bpc blocks |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in result["runs"].items():
        s = summary(r)
        mix = " / ".join(f"{100 * s['mix'][k]:.1f}" for k in (*FORMS, "other"))
        lines.append(f"| {name} | " + " / ".join(f"{v:.1%}" for v in s["free_rhyme"])
                     + f" | {min(s['form_rhyme'].values()):.1%} | {mix} | {s['distinct_2']:.3f} "
                       f"| {s['regulated']:.1%} | {s['alternation']:.1%} / {s['nian']:.1%} / {s['dui']:.1%} "
                       f"| {s['poems_bpc']:.3f} | {s['blocks_bpc']:.3f} |")
    return "\n".join(lines)


def step_times(names: list[str], steps: int = 40) -> dict:
    """Each lever's training step (loss and backward of a new model on a batch of its own windows;
    no optimizer, no data loader), alternated in one process over `steps` batches after 3 warm-up
    rounds: {"steps_each", "ms": {name: median}, "ratio": {name: median / the first's}}."""
    import hydra
    import rootutils
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from model.loading import build_gpt

    rootutils.setup_root(__file__, indicator=".project-root")  # PROJECT_ROOT, which conf/paths reads
    arms = {}
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        for name in names:
            cfg = compose("train", overrides=LEVERS[name][0])
            dm = hydra.utils.instantiate(cfg.data)
            dm.prepare_data()
            dm.setup("fit")
            model = {k: v for k, v in OmegaConf.to_container(cfg.model, resolve=True).items() if k not in ("name", "optim")}
            arms[name] = (build_gpt({**model, "backend": cfg.attention.backend}, dm.tokenizer, cfg.data.script).train(),
                          dm.train_set, cfg.data.batch_size)
    order = torch.Generator().manual_seed(0)
    times = {name: [] for name in names}
    for i in range(steps + 3):
        for name, (gpt, windows, batch) in arms.items():
            x, y = map(torch.stack, zip(*(windows[j] for j in torch.randint(len(windows), (batch,), generator=order))))
            start = time.perf_counter()
            gpt.loss(x, y).backward()
            gpt.zero_grad(set_to_none=True)
            if i >= 3:
                times[name].append(time.perf_counter() - start)
    ms = {name: 1000 * statistics.median(t) for name, t in times.items()}
    return {"steps_each": steps, "ms": {k: round(v, 2) for k, v in ms.items()},
            "ratio": {k: round(v / ms[names[0]], 3) for k, v in ms.items()}}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="*", default=None, choices=list(LEVERS), help="these levers only")
    p.add_argument("--force", action="store_true", help="run again what the JSON already has")
    p.add_argument("--default-checkpoint", type=Path, default=None,
                   help="measure this checkpoint of today's default as `default` instead of training it")
    p.add_argument("--step-time", nargs="+", default=None, choices=list(LEVERS), metavar="LEVER",
                   help="only time these levers' training steps against the first's, in one process")
    args = p.parse_args(argv)
    if args.step_time:
        timed = {"machine": machine(), "commit": commit(), **step_times(args.step_time)}
        save(step_time=timed)
        print(json.dumps(timed, indent=1), f"\nwrote {OUT}")
        return
    done = read()["runs"]
    for name in args.only or LEVERS:
        if name in done and not args.force:
            continue
        lever = default_run(args.default_checkpoint.resolve()) \
            if name == "default" and args.default_checkpoint else run(name, *LEVERS[name])
        result = save({name: lever}, machine=machine(), commit=commit(), seeds=list(SEEDS))
        print(table(result), flush=True)
    print(f"{machine()}\n\n{table(read())}\n\nwrote {OUT}")


def read() -> dict:
    """The JSON as it is on disk now ({"runs": {}} before the first lever)."""
    return json.loads(OUT.read_text()) if OUT.exists() else {"runs": {}}


def save(runs: dict | None = None, **fields) -> dict:
    """Add `runs` (lever name → result) and top-level `fields` to the JSON as it is on disk now and
    write it back, so a lever another run of this script finished meanwhile is kept."""
    result = read()
    result.update(fields)
    result["runs"].update(runs or {})
    OUT.write_text(json.dumps(result, indent=1, ensure_ascii=False))
    return result


if __name__ == "__main__":
    main()
