"""The default `python train.py` against nanoGPT's CPU configuration, at 1×, 2×, 3× and 4× the time.

    python benchmarks/fixed_time.py                    # the full comparison (about 11× the default run)
    python benchmarks/fixed_time.py --quick            # 2-minute budgets, for A/B of levers
    python benchmarks/fixed_time.py --quick --variant base= --variant wd0=model.optim.weight_decay=0
    python benchmarks/fixed_time.py --check-reference  # the reference against nanoGPT's figures
    python benchmarks/fixed_time.py --overhead 300     # Lightning's cost per step against a bare loop
    python benchmarks/fixed_time.py --keep-reference   # the default only; the reference rows kept from the JSON
    python benchmarks/fixed_time.py --compare A.ckpt B.ckpt  # B against A, window by window (paired intervals)

(a) **The reference**: a plain PyTorch loop, as nanoGPT's `train.py` is (no Lightning), with
nanoGPT's README CPU configuration: its model (learned positions, tied head, GELU MLP,
LayerNorm, no bias; `model.gpt.GPT` with those options) of 4 layers × 4 heads × 128, block 64,
batch 12, random windows drawn with replacement each step from the global RNG after
`torch.manual_seed(1337)`, AdamW (lr 1e-3, β = (0.9, 0.99), weight decay 0.1 on matrices),
gradient clipping 1.0, 100 warm-up iterations (lr·(it + 1)/101), then cosine to 1e-4 — over
`max_iters` iterations, or over a wall-clock budget (the cosine follows the elapsed
fraction). `--check-reference` trains it for 3,750 and 7,500 iterations and compares with
nanoGPT's own figures on this corpus (val/loss 5.168 and 4.864, held-out `blocks` windows).

(b) **The default**: `python train.py` (as a subprocess, its whole wall-clock measured), or
with `trainer.max_time` (budget mode) in `--quick`; the reference is then trained for 1×, 2×,
3× and 4× that wall-clock on the same prepared data (1× and 2× in `--quick`).

Every model is scored the same way, through the project's `LitGPT` validation, on both
held-out protocols (`data.val_windows`): `poems` (every held-out poem from its own `<bos>`)
and `blocks` (non-overlapping 64-token windows of `val.bin`, the protocol of nanoGPT's
figures). Both count the same 145,210 held-out characters. Prints a table and writes
`benchmarks/results/fixed-time-cpu.json` (`fixed-time-reference-cpu.json`, `lightning-overhead-cpu.json`;
`--quick`: `logs/fixed-time-quick-cpu.json`, an A/B whose table goes to docs/experiments.md),
with the commit and, for each default run, its config's behaviour (`model.training.fingerprint`)
and its checkpoint's `weights_sha`: `python -m benchmarks.report --check` fails when the
default's behaviour has changed since.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import rootutils  # noqa: E402
import torch  # noqa: E402
from hydra.utils import instantiate as hydra_instantiate  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from data.datamodule import PoetryDataModule  # noqa: E402
from model.checkpoint_meta import Corpora  # noqa: E402
from model.device import commit  # noqa: E402
from model.device import describe as machine  # noqa: E402
from model.engine import Engine  # noqa: E402
from model.gpt import MODEL_FIELDS  # noqa: E402
from model.loading import load_engine, read_checkpoint  # noqa: E402
from model.training import runtime  # noqa: E402,F401  (registers the run_name resolver the configs use)
from model.training.fingerprint import fingerprint  # noqa: E402
from model.training.lit import LitGPT  # noqa: E402
from model.training.validation import validation_metrics  # noqa: E402

rootutils.setup_root(__file__, indicator=".project-root")  # PROJECT_ROOT, which conf/paths reads, as train.py
CORPUS, CACHE = ROOT / "data" / "corpus" / "tang.jsonl.xz", ROOT / "data" / "cache"
NANOGPT = {"n_layer": 4, "n_head": 4, "n_embd": 128, "block_size": 64, "batch_size": 12, "lr": 1e-3,
           "min_lr": 1e-4, "betas": (0.9, 0.99), "warmup_iters": 100, "weight_decay": 0.1, "grad_clip": 1.0}
"""nanoGPT's README CPU example (config/train_shakespeare_char.py with its command-line changes)."""
NANOGPT_FIGURES = {3750: 5.168, 7500: 4.864}
"""nanoGPT itself (3adf61e) on this corpus: val/loss on the `blocks` windows after these iterations."""
PROTOCOLS = ("poems", "blocks")


def datamodule(val_windows: str = "poems", block_size: int = 64, plan_tokens: bool = False,
               conditions: dict | None = None, corpora: Corpora = Corpora()) -> PoetryDataModule:
    """The default data (simplified script, characters), prepared, with the given validation windows
    (and plan tokens, condition shares and corpora, a checkpoint's `CheckpointMeta.corpora`, for a
    model trained with them: the Tang validation stays the reference)."""
    dm = PoetryDataModule(str(CORPUS), str(CACHE), block_size=block_size, batch_size=64, val_windows=val_windows,
                          plan_tokens=plan_tokens, conditions=conditions, **corpora.options(CORPUS.parent))
    dm.prepare_data()
    return dm


def score(engine: Engine, protocols=PROTOCOLS) -> dict:
    """`val/loss` and `val/bpc` (and `val/bpc_text` for a model with plan tokens) of a model on each
    held-out protocol, through `LitGPT`'s own validation (`validation_metrics`), on data framed as
    it was trained: `poems` with the model's block_size, `blocks` always in nanoGPT's 64-token windows;
    with `bpc_interval_95`, the 95 % interval of its `val_bpc` over the held-out windows (`bpc_interval`)."""
    out = {}
    for protocol in protocols:
        block = engine.model.cfg.block_size if protocol == "poems" else NANOGPT["block_size"]  # blocks: nanoGPT's
        dm = datamodule(protocol, block, bool(engine.tokenizer.plan), engine.meta.conditions, engine.meta.corpora)
        metrics = validation_metrics(engine, dm)
        out[protocol] = {k.replace("/", "_"): round(v, 4) for k, v in metrics.items()}
        out[protocol]["bpc_interval_95"] = [round(b, 4) for b in bpc_interval(*window_sums(engine, dm))]
    return out


@torch.no_grad()
def window_sums(engine: Engine, dm: PoetryDataModule) -> tuple[np.ndarray, np.ndarray]:
    """Each held-out window's nats and poem characters, the two sums `val/bpc` divides (`LitGPT`'s
    validation): (n_windows,) float64 each, in the data module's validation order."""
    dm.setup("validate")
    counts = torch.tensor(engine.tokenizer.char_counts, device=engine.device)  # (vocab_size,) characters per token
    model, nats, chars = engine.model.eval(), [], []
    for x, y in dm.val_dataloader():  # (B, T) each
        x, y = x.to(engine.device), y.to(engine.device)
        nats.append(model.nats(x, y).double().sum(1))  # (B,)
        chars.append(torch.where(y >= 0, counts[y.clamp(min=0)], 0).sum(1))  # (B,)
    return torch.cat(nats).cpu().numpy(), torch.cat(chars).cpu().numpy().astype(np.float64)


def compare(base: Path, others: list[Path], resamples: int = 1000) -> dict:
    """Each checkpoint in `others` against `base` on both protocols, window by window (the same
    windows: models of one block_size): {checkpoint: {protocol: {"val_bpc", "delta", "delta_interval_95"}}},
    delta = its bpc − base's, the interval a paired percentile bootstrap over the windows (`bpc_interval`
    of the per-window differences, seed 0).
    raises ValueError for models whose `poems` windows differ (another block_size)."""
    engines = {str(c): load_engine(c) for c in [base, *others]}
    sizes = {e.model.cfg.block_size for e in engines.values()}
    if len(sizes) > 1:
        raise ValueError(f"the checkpoints have block sizes {sorted(sizes)}: their poems windows differ; compare one size")
    (size,) = sizes
    out = {}
    for protocol in PROTOCOLS:
        block = size if protocol == "poems" else NANOGPT["block_size"]
        sums = {name: window_sums(e, datamodule(protocol, block, bool(e.tokenizer.plan), e.meta.conditions,
                                                e.meta.corpora)) for name, e in engines.items()}
        n0, chars = sums[str(base)]
        for name, (n1, _) in sums.items():  # Δ bpc is the bpc of the per-window differences: the same bootstrap
            out.setdefault(name, {})[protocol] = {
                "val_bpc": round(float(n1.sum() / chars.sum() / math.log(2)), 4),
                "delta": round(float((n1 - n0).sum() / chars.sum() / math.log(2)), 4),
                "delta_interval_95": [round(q, 4) for q in bpc_interval(n1 - n0, chars, resamples)]}
    return out


def bpc_interval(nats: np.ndarray, chars: np.ndarray, resamples: int = 1000, seed: int = 0) -> tuple[float, float]:
    """The 95 % percentile-bootstrap interval of bits per character Σ nats ÷ Σ chars ÷ ln 2 over
    windows drawn with replacement (nats, chars (n,) each, `window_sums`), seeded."""
    draw = np.random.default_rng(seed).integers(0, len(nats), (resamples, len(nats)))  # (resamples, n)
    bpc = nats[draw].sum(1) / chars[draw].sum(1) / math.log(2)  # (resamples,)
    low, high = np.percentile(bpc, [2.5, 97.5])
    return float(low), float(high)


def nanogpt_reference(max_iters: int | None = None, seconds: float | None = None, seed: int = 1337,
                      log_every: int = 250) -> dict:
    """Train the reference (module docstring) for `max_iters` iterations or `seconds` of wall-clock.

    returns {"iterations", "train_seconds", "tokens_per_sec", "poems": {...}, "blocks": {...}}.
    raises ValueError unless exactly one of max_iters and seconds is given.
    """
    if (max_iters is None) == (seconds is None):
        raise ValueError("give max_iters or seconds")
    c = NANOGPT
    dm = datamodule("blocks")
    data = dm.tokens("train")
    torch.manual_seed(seed)
    cfg = {k: c[k] for k in ("n_layer", "n_head", "n_embd", "block_size")}
    lit = LitGPT(model={**cfg, "dropout": 0.0, "bias": False, "backend": "sdpa"}, optim={},
                 tokenizer=dm.tokenizer.state_dict())
    gpt = lit.gpt
    groups = [{"params": [p for p in gpt.parameters() if p.dim() >= 2], "weight_decay": c["weight_decay"]},
              {"params": [p for p in gpt.parameters() if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=c["lr"], betas=c["betas"])
    T, B, warmup = c["block_size"], c["batch_size"], c["warmup_iters"]

    def lr_at(it: int, elapsed: float, warm_end: float) -> float:
        if it < warmup:
            return c["lr"] * (it + 1) / (warmup + 1)
        if max_iters is not None:
            ratio = (it - warmup) / (max_iters - warmup)
        else:
            ratio = (elapsed - warm_end) / max(1e-9, seconds - warm_end)
        coeff = 0.5 * (1.0 + math.cos(math.pi * min(1.0, ratio)))
        return c["min_lr"] + coeff * (c["lr"] - c["min_lr"])

    gpt.train()
    it, start, warm_end = 0, time.perf_counter(), 0.0
    while True:
        elapsed = time.perf_counter() - start
        if (max_iters is not None and it >= max_iters) or (seconds is not None and elapsed >= seconds):
            break
        if it == warmup:
            warm_end = elapsed
        for group in opt.param_groups:
            group["lr"] = lr_at(it, elapsed, warm_end)
        ix = torch.randint(len(data) - T, (B,))  # nanoGPT's get_batch: with replacement, global RNG
        x = torch.stack([torch.from_numpy(data[i:i + T].astype("int64")) for i in ix.tolist()])  # (B, T)
        y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + T].astype("int64")) for i in ix.tolist()])  # (B, T)
        loss = gpt.loss(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(gpt.parameters(), c["grad_clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        it += 1
        if log_every and it % log_every == 0:
            print(f"  reference iter {it}: loss {loss.item():.3f}, {time.perf_counter() - start:.0f} s", flush=True)
    train_seconds = time.perf_counter() - start
    gpt.eval()
    return {"iterations": it, "train_seconds": round(train_seconds, 1),
            "tokens_per_sec": round(it * B * T / train_seconds), **score(lit.engine)}


def default_run(name: str, overrides: list[str], quick: bool = False) -> dict:
    """`python train.py` with `overrides`, as a subprocess: its wall-clock, steps and scores.
    Its run folders are `bench-fixed-time-<name>` (`bench-fixed-time-quick-<name>` in --quick),
    replaced by the next run of that name."""
    run_name = f"bench-fixed-time-{'quick-' if quick else ''}{name}"
    paths = default_config(*overrides).paths  # logs/ and checkpoints/, unless the overrides move them
    logs, checkpoints = Path(paths.log_dir), Path(paths.checkpoint_dir)
    for old in (logs / run_name, checkpoints / run_name):
        shutil.rmtree(old, ignore_errors=True)
    cmd = [sys.executable, str(ROOT / "train.py"), f"run_name={run_name}", *overrides]
    print("$", " ".join(cmd[1:]), flush=True)
    start = time.perf_counter()
    subprocess.run(cmd, check=True)
    wall = time.perf_counter() - start
    peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB on Linux; the largest child so far
    ckpt = checkpoints / run_name / "last.ckpt"
    engine = load_engine(ckpt)
    steps = read_checkpoint(ckpt)["global_step"]
    cfg = OmegaConf.load(logs / run_name / ".hydra" / "config.yaml")
    tokens = steps * cfg.data.batch_size * cfg.model.block_size
    return {"overrides": overrides, "wall_seconds": round(wall, 1), "steps": steps, "tokens_per_sec": round(tokens / wall),
            "peak_rss_mib": round(peak_mib), "fingerprint": fingerprint(default_config(*overrides)),
            "weights_sha": engine.meta.weights_sha,
            "checkpoint": str(ckpt.relative_to(ROOT) if ckpt.is_relative_to(ROOT) else ckpt), **score(engine)}


def default_config(*overrides: str):
    """The composed `python train.py` config with `overrides`, as Hydra would give it (run folder under logs/)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", return_hydra_config=True, overrides=list(overrides))
    HydraConfig().set_config(cfg)
    with open_dict(cfg):
        cfg.paths.output_dir = str(Path(cfg.paths.log_dir) / cfg.run_name)
        del cfg.hydra
    return cfg


def lightning_overhead(steps: int = 300, rounds: int = 2, overrides: tuple[str, ...] = ()) -> dict:
    """Median time between training steps of the default model: through train.py's Lightning run
    (progress bar and logging as configured, validation and callbacks off) and in a bare PyTorch
    loop with the same model, batches, optimizer, schedule and clipping. The runs alternate, bare
    first and last (`rounds` Lightning runs between `rounds + 1` bare ones), so a drift of the
    machine reaches both; the overhead compares the medians over runs. Skips the first 20 steps
    of each run. `overrides`: train.py overrides of both (e.g. a smaller model or corpus)."""
    import statistics

    import train as train_script
    from model.training.lit import build_optimizer, lr_factor

    def bare() -> float:
        cfg = default_config(*overrides, f"trainer.max_steps={steps}")
        dm = hydra_instantiate(cfg.data)
        dm.prepare_data()
        dm.setup("fit")
        torch.manual_seed(cfg.seed)
        shape = OmegaConf.to_container(cfg.model, resolve=True)
        lit = LitGPT({**{k: shape[k] for k in MODEL_FIELDS if k in shape}, "backend": cfg.attention.backend},
                     shape["optim"], dm.tokenizer.state_dict())
        lit.gpt.lm_head.set_token_counts(torch.from_numpy(dm.token_counts()))
        opt = build_optimizer(lit.gpt, shape["optim"])
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: lr_factor(s, shape["optim"]["warmup_steps"], shape["optim"]["min_lr_ratio"], s / steps))
        times, last = [], time.perf_counter()
        for step, (x, y) in zip(range(steps), dm.train_dataloader()):
            loss = lit.gpt.loss(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(lit.gpt.parameters(), cfg.trainer.gradient_clip_val)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            now = time.perf_counter()
            times.append(now - last)
            last = now
        return statistics.median(times[20:])

    def lightning() -> float:  # the project's own train/tokens_per_sec: time from one training step to the next
        cfg = default_config(*overrides, f"trainer.max_steps={steps}", "trainer.limit_val_batches=0",
                             "trainer.num_sanity_val_steps=0",
                             "logger=csv", "~callbacks.attention_maps", "~callbacks.samples", "~callbacks.evaluation",
                             "run_name=bench-overhead")
        logs = Path(cfg.paths.log_dir) / "bench-overhead"
        for old in (Path(cfg.paths.checkpoint_dir) / "bench-overhead", logs):
            shutil.rmtree(old, ignore_errors=True)
        train_script.train(cfg)
        (metrics,) = (logs / "csv").glob("version_*/metrics.csv")
        rows = [r for r in csv.DictReader(metrics.open()) if r.get("train/tokens_per_sec") and int(r["step"]) >= 20]
        tokens = cfg.data.batch_size * cfg.model.block_size
        return statistics.median(tokens / float(r["train/tokens_per_sec"]) for r in rows)

    bare_runs, lightning_runs = [bare()], []
    for _ in range(rounds):  # interleaved, so a drift of the machine hits both alike
        lightning_runs.append(lightning())
        bare_runs.append(bare())
    reference, through = statistics.median(bare_runs), statistics.median(lightning_runs)
    return {"steps": steps, "bare_ms": round(reference * 1e3, 2), "bare_runs_ms": [round(t * 1e3, 2) for t in bare_runs],
            "lightning_ms": round(through * 1e3, 2), "lightning_runs_ms": [round(t * 1e3, 2) for t in lightning_runs],
            "overhead": round(through / reference - 1, 4)}


def check_reference(iterations=None) -> dict:
    """The reference after nanoGPT's iteration counts (all, or those in `iterations`), against
    nanoGPT's figures (within 0.03). raises ValueError for a count nanoGPT published no figure for."""
    if unknown := set(iterations or ()) - set(NANOGPT_FIGURES):
        raise ValueError(f"no nanoGPT figure for {sorted(unknown)} iterations; choose from {sorted(NANOGPT_FIGURES)}")
    out = {}
    for iters, expected in NANOGPT_FIGURES.items():
        if iterations and iters not in iterations:
            continue
        print(f"reference, {iters} iterations (cosine over {iters})", flush=True)
        r = nanogpt_reference(max_iters=iters)
        got = r["blocks"]["val_loss"]
        r.update(nanogpt_val_loss=expected, difference=round(got - expected, 4), faithful=abs(got - expected) <= 0.03)
        out[str(iters)] = r
        print(f"  val/loss {got:.4f} vs nanoGPT {expected:.3f}: {'faithful' if r['faithful'] else 'NOT faithful'}")
    return out


def table(rows: list[tuple[str, dict]]) -> str:
    head = ("| run | steps | wall-clock s | tokens/s (whole run) | poems val/loss | poems val/bpc | blocks val/loss "
            "| blocks val/bpc |")
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in rows:
        steps = r.get("steps", r.get("iterations"))
        wall = r.get("wall_seconds", r.get("train_seconds"))
        lines.append(f"| {name} | {steps:,} | {wall} | {r.get('tokens_per_sec', '')} | {r['poems']['val_loss']:.3f} | "
                     f"{r['poems']['val_bpc']:.3f} | {r['blocks']['val_loss']:.3f} | {r['blocks']['val_bpc']:.3f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="budget mode: every default variant gets --seconds of "
                   "training (trainer.max_time), the reference 1× and 2× the first variant's wall-clock")
    p.add_argument("--seconds", type=int, default=120, help="the --quick budget of each default variant")
    p.add_argument("--variant", action="append", default=None, metavar="NAME=OVERRIDES",
                   help="a default variant: a name and space-separated train.py overrides (repeatable)")
    p.add_argument("--no-reference", action="store_true", help="only the default variants")
    p.add_argument("--keep-reference", action="store_true", help="train the default only and keep the JSON's "
                   "reference rows and their budgets: a quick look, not a claim against nanoGPT (the machine's "
                   "speed moves between days; docs/benchmarks.md)")
    p.add_argument("--check-reference", nargs="*", type=int, default=None, metavar="ITERS",
                   help="only the reference against nanoGPT's figures (all counts, or the ITERS given)")
    p.add_argument("--overhead", type=int, default=0, metavar="STEPS",
                   help="only Lightning's overhead against a bare loop, over this many steps of the default model")
    p.add_argument("--compare", nargs="+", default=None, metavar="CKPT",
                   help="only score checkpoints against the first, window by window: Δ val/bpc with a paired "
                   "95 %% interval on both protocols (logs/fixed-time-compare-cpu.json)")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="a train.py override of every default run (repeatable; e.g. a smaller model or corpus)")
    p.add_argument("--out", type=Path, default=None,
                   help="the folder of the JSON (default: benchmarks/results; logs with --quick)")
    args = p.parse_args(argv)
    out_dir = args.out or ROOT / ("logs" if args.quick or args.compare else "benchmarks/results")
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {"machine": machine(), "commit": commit()}
    if not other_measure(args, out_dir, result):
        fixed_time(args, out_dir, result)


def other_measure(args: argparse.Namespace, out_dir: Path, result: dict) -> bool:
    """--compare, --overhead or --check-reference, into `result` and its JSON; False for none of them."""
    if args.compare:
        result["compare"] = r = compare(Path(args.compare[0]), [Path(c) for c in args.compare[1:]])
        for name, row in r.items():
            print(name, "  ".join(f"{p} {v['val_bpc']:.4f} Δ {v['delta']:+.4f} [{v['delta_interval_95'][0]:+.4f}, "
                                  f"{v['delta_interval_95'][1]:+.4f}]" for p, v in row.items()))
        (out_dir / "fixed-time-compare-cpu.json").write_text(json.dumps(result, indent=2, ensure_ascii=False))
    elif args.overhead:
        result["lightning_overhead"] = r = lightning_overhead(args.overhead, overrides=tuple(args.override))
        print(f"{result['machine']}\nbare loop {r['bare_ms']} ms/step (runs {r['bare_runs_ms']}), Lightning "
              f"{r['lightning_ms']} ms/step (runs {r['lightning_runs_ms']}): overhead {r['overhead']:+.1%}")
        (out_dir / "lightning-overhead-cpu.json").write_text(json.dumps(result, indent=2))
    elif args.check_reference is not None:
        path = out_dir / "fixed-time-reference-cpu.json"
        previous = json.loads(path.read_text())["reference"] if path.exists() else {}
        result["reference"] = {**previous, **check_reference(args.check_reference)}  # keeps counts not rerun
        path.write_text(json.dumps(result, indent=2))
    return bool(args.compare or args.overhead or args.check_reference is not None)


def fixed_time(args: argparse.Namespace, out_dir: Path, result: dict) -> None:
    """The default variants, then nanoGPT's configuration at 1× to 4× the first one's wall-clock (1×
    and 2× in --quick; the JSON's rows with --keep-reference), into `result`: the table and its JSON."""
    variants = [v.partition("=")[::2] for v in (args.variant or ["default="])]
    budget = [f"trainer.max_time=00:00:{args.seconds // 60:02d}:{args.seconds % 60:02d}",
              "trainer.max_steps=-1"] if args.quick else []
    rows = []
    for name, overrides in variants:
        r = default_run(name, [*args.override, *budget, *overrides.split()], quick=args.quick)
        rows.append((f"default: {name}" if name != "default" else "default", r))
    if args.keep_reference:
        kept = json.loads((out_dir / "fixed-time-cpu.json").read_text())
        rows += [(name, r) for name, r in kept["runs"].items() if name.startswith("nanoGPT")]
        result["reference_commit"] = kept.get("reference_commit", kept["commit"])
    elif not args.no_reference:
        wall = rows[0][1]["wall_seconds"]
        for k in (1, 2) if args.quick else (1, 2, 3, 4):
            print(f"reference, {k}× {wall:.0f} s", flush=True)
            rows.append((f"nanoGPT configuration, {k}× the time", nanogpt_reference(seconds=k * wall)))
    result["runs"] = {name: r for name, r in rows}
    if args.keep_reference or not args.no_reference:
        references = [r for name, r in rows if name.startswith("nanoGPT")]
        for name, r in rows[:-len(references)]:
            for k, ref in enumerate(references, 1):
                r[f"beats_{k}x_reference"] = {pr: r[pr]["val_bpc"] <= ref[pr]["val_bpc"] for pr in PROTOCOLS}
    print(f"\n{result['machine']}\n\n{table(rows)}")
    name = "fixed-time-quick-cpu.json" if args.quick else "fixed-time-cpu.json"
    (out_dir / name).write_text(json.dumps(result, indent=2, ensure_ascii=False))
    print(f"\nwrote {out_dir / name}")


if __name__ == "__main__":
    main()
