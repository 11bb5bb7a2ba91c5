"""What a DDP training step of the default model costs with each way of handling parameters a rank did not use.

    python benchmarks/ddp_step.py                          # 2 gloo processes on the CPU, per-rank batch 32
    python benchmarks/ddp_step.py --processes 2 --batch 32 --steps 40 --rounds 3

The default model's adaptive head scores only the clusters its batch's targets fall in (and the rhyme
loss needs a rhyme slot), so a rank may leave parameters out of its step's graph; DDP's gradient
all-reduces then no longer pair up unless DDP is told (`model.training.runtime.ddp_strategy`). Three
ways, each in `--processes` gloo processes of one thread, the default model and optimizer as
`python train.py` builds them, the training windows of the default data, per-rank batch `--batch`:

- `find_unused=False`: DDP as it was before; it works only while every rank's batch reaches every
  cluster (a per-rank batch of 32 does, in the steps timed here), and hangs otherwise;
- `find_unused=True`: what `ddp_strategy` sets (DDP walks each step's graph for the unused ones);
- `all in graph`: every parameter added to the loss × 0, so each takes part in every step's graph
  (a parameter no rank used then gets a zero gradient, which AdamW and Muon apply, where one process
  leaves it untouched).

and, for scale, one process of `--processes` threads at the same per-rank batch (no DDP: the default
run). Variants alternate `--rounds` times, so a drift of the machine reaches each alike; the figure is
the median over rounds of each round's median step time (rank 0's, after `--warmup` steps). Prints a
table and writes `benchmarks/results/ddp-step-cpu.json` with the machine.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PROJECT_ROOT", str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from hydra.utils import instantiate  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from model.device import commit, describe  # noqa: E402
from model.gpt import MODEL_FIELDS  # noqa: E402
from model.loading import build_gpt, head_for_vocabulary  # noqa: E402
from model.training.lit import build_optimizer  # noqa: E402
from model.training.runtime import unique_run_name  # noqa: E402, F401  (registers the resolver the config uses)

VARIANTS = ("one process", "find_unused=False", "find_unused=True", "all in graph")


class Loss(torch.nn.Module):
    """The model's training loss as DDP sees a LightningModule: forward(x, y) → the scalar loss."""

    def __init__(self, gpt: torch.nn.Module, all_in_graph: bool):
        super().__init__()
        self.gpt, self.all_in_graph = gpt, all_in_graph

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = self.gpt.loss(x, y)
        if self.all_in_graph:
            loss = loss + 0.0 * sum(p.sum() for p in self.gpt.parameters())
        return loss


def default_parts(batch: int, overrides: tuple[str, ...] = ()):
    """The default config's (with train.py `overrides`) data module (prepared, set up, `batch` windows a batch)
    and model settings."""
    from benchmarks.fixed_time import default_config

    cfg = default_config(*overrides, f"data.batch_size={batch}", "data.num_workers=0")
    dm = instantiate(cfg.data)
    dm.prepare_data()
    dm.setup("fit")
    shape = OmegaConf.to_container(cfg.model, resolve=True)
    model = head_for_vocabulary({**{k: shape[k] for k in MODEL_FIELDS if k in shape},
                                 "backend": cfg.attention.backend}, dm.tokenizer.vocab_size)
    return cfg, dm, model, shape["optim"]


def worker(rank: int, world: int, port: int, variant: str, batch: int, steps: int, warmup: int, out: str,
           threads: int, overrides: tuple[str, ...] = ()) -> None:
    """One process of one variant: trains `warmup + steps` steps, rank 0 writes its step times (s) to `out`."""
    torch.set_num_threads(threads)
    cfg, dm, model_cfg, optim = default_parts(batch, overrides)
    torch.manual_seed(cfg.seed)
    gpt = build_gpt(model_cfg, dm.tokenizer, cfg.data.script)
    gpt.lm_head.set_token_counts(torch.from_numpy(dm.token_counts()))
    module = Loss(gpt, all_in_graph=variant == "all in graph")
    if variant != "one process":
        # find_unused=False with a parameter one rank did not use stalls the other rank's all-reduce: end, never hang
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=120))
        module = torch.nn.parallel.DistributedDataParallel(module, find_unused_parameters=variant == "find_unused=True")
    opt = build_optimizer(gpt, optim)
    loader, times = iter(dm.train_dataloader()), []
    for step in range(warmup + steps):
        for _ in range(rank + 1):  # rank r trains on every world-th batch, as a distributed sampler deals them
            x, y = next(loader)
        for _ in range(world - rank - 1):
            next(loader)
        start = time.perf_counter()
        loss = module(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(gpt.parameters(), cfg.trainer.gradient_clip_val)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step >= warmup:
            times.append(time.perf_counter() - start)
    if rank == 0:
        Path(out).write_text(json.dumps(times))
    if dist.is_initialized():
        dist.barrier()  # every rank's steps are done
    # no teardown: destroying the DDP reducer's gloo group can deadlock at exit (its worker thread waits for
    # the GIL that the joining main thread holds; seen in the test suite), and nothing is left to release
    os._exit(0)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for a process group's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(variant: str, processes: int, batch: int, steps: int, warmup: int, tmp: Path,
        overrides: tuple[str, ...] = ()) -> float:
    """Median step time (ms) of one run of `variant`."""
    out = tmp / "times.json"
    world, threads = (1, processes) if variant == "one process" else (processes, 1)
    mp.spawn(worker, args=(world, free_port(), variant, batch, steps, warmup, str(out), threads, overrides),
             nprocs=world)
    return statistics.median(json.loads(out.read_text())) * 1e3


def table(result: dict) -> str:
    """The result as a Markdown table and a line of its settings (printed, and on docs/results.md)."""
    rows = [f"| `{r['variant']}` | {r['ms_per_step']:.1f} | {', '.join(f'{t:.1f}' for t in r['runs_ms'])} | "
            f"{r['vs_find_unused_false']:.3f}× |" for r in result["rows"]]
    return "\n".join(["| variant | ms per step | rounds | vs find_unused=False |", "|---|---:|---:|---:|", *rows,
                      f"\n{result['processes']} processes, {result['batch']} windows a rank, {result['steps']} steps a "
                      f"run, {result['rounds']} rounds."])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--batch", type=int, default=32, help="windows per rank and step (the default data.batch_size)")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="a train.py override of the default model or data (repeatable)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "ddp-step-cpu.json")
    args = p.parse_args(argv)
    import tempfile

    overrides = tuple(args.override)
    default_parts(args.batch, overrides)  # prepares the data cache once, before any timing
    runs: dict[str, list[float]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for variant in VARIANTS:
                runs[variant].append(round(run(variant, args.processes, args.batch, args.steps, args.warmup,
                                               Path(tmp), overrides), 2))
                print(f"round {r + 1}: {variant}: {runs[variant][-1]} ms/step", flush=True)
    ms = {v: statistics.median(t) for v, t in runs.items()}
    reference = ms["find_unused=False"]
    rows = [{"variant": v, "ms_per_step": round(ms[v], 2), "runs_ms": runs[v],
             "vs_find_unused_false": round(ms[v] / reference, 3)} for v in VARIANTS]
    result = {"machine": describe(), "commit": commit(), "processes": args.processes, "batch": args.batch,
              "steps": args.steps, "rounds": args.rounds, "rows": rows}
    print(f"\n{result['machine']}; gloo processes of 1 thread (one process: {args.processes} threads)\n")
    print(table(result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = args.out.with_suffix(".tmp")
    tmp_out.write_text(json.dumps(result, indent=2))
    tmp_out.replace(args.out)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
