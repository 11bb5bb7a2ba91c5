"""Attention backends side by side: time and peak memory of one layer, and one training step.

    python benchmarks/attention.py                      # CPU: float32, T = 64 … 4096
    python benchmarks/attention.py --dtype bfloat16     # GPU: bf16, e.g. --seq-lens 64 … 8192

For each backend that can run here, each sequence length T and each dropout: the median
time of forward and of forward+backward of one attention layer (a one-block `GPT`'s) in
training mode (warm-up first), and its peak memory (CPU: each case in a fresh process, the growth of its
peak RSS, VmHWM; GPU: the CUDA allocator's peak). Then one full training step
(forward, backward, AdamW) of the `tiny` and `small` models per backend. Prints tables with
ratios to `naive` and writes everything to a JSON file.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.markdown import n, table  # noqa: E402
from model.attention import BACKENDS  # noqa: E402
from model.device import check_backend, describe  # noqa: E402
from model.gpt import GPT, GPTConfig  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MODELS = {  # the conf/model sizes, with the vocabulary of the shipped corpus
    "tiny": dict(n_layer=4, n_head=4, n_embd=96, block_size=64, batch=8),
    "small": dict(n_layer=6, n_head=6, n_embd=384, block_size=128, batch=16),
}
VOCAB = 8164


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def median_time(fn, device: str, repeats: int, warmup: int = 2) -> float:
    """Median wall time of fn() in seconds, after `warmup` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def layer_case(backend, T, dropout, args):
    """The attention layer of a one-block GPT and its input for one case (training mode, so dropout is active)."""
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=VOCAB, n_layer=1, n_head=args.n_head, n_embd=args.n_embd, block_size=T, dropout=dropout,
                    backend=backend)
    layer = GPT(cfg).blocks[0].attn.to(args.device, DTYPES[args.dtype])
    x = torch.randn(args.batch, T, args.n_embd, device=args.device, dtype=DTYPES[args.dtype], requires_grad=True)
    return layer.train(), x


def fwd_bwd(layer, x):
    layer(x).sum().backward()


def reason_unavailable(backend, dropout, args) -> str | None:
    try:
        check_backend(backend, args.device, DTYPES[args.dtype], dropout, args.n_embd // args.n_head)
    except RuntimeError as err:
        return str(err)
    return None


def peak_memory_mb(backend, T, dropout, args) -> float:
    """Peak memory of forward+backward, in MiB: CUDA allocator peak, or a child process's RSS growth."""
    if args.device == "cuda":
        layer, x = layer_case(backend, T, dropout, args)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fwd_bwd(layer, x)
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    cmd = [sys.executable, __file__, "--memory-case", backend, str(T), str(dropout),
           "--batch", str(args.batch), "--n-embd", str(args.n_embd), "--n-head", str(args.n_head),
           "--dtype", args.dtype, "--device", "cpu"]
    return float(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status (Linux only)")


def memory_case(backend, T, dropout, args) -> None:
    """Child process: print the peak RSS growth (MiB) of one forward+backward. Writing 5 to
    /proc/self/clear_refs resets the peak (VmHWM) to the current RSS (Linux ≥ 4.0)."""
    layer, x = layer_case(backend, T, dropout, args)
    Path("/proc/self/clear_refs").write_text("5")
    before = _status_kib("VmRSS")
    fwd_bwd(layer, x)
    print((_status_kib("VmHWM") - before) / 1024)


def train_step_ms(name, backend, args) -> float | str:
    spec = dict(MODELS[name])
    batch = spec.pop("batch")
    if reason := reason_unavailable(backend, 0.0, args):
        return reason
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=VOCAB, backend=backend, **spec)).to(args.device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    idx = torch.randint(0, VOCAB, (batch, spec["block_size"]), device=args.device)
    amp = torch.autocast(args.device, dtype=DTYPES[args.dtype], enabled=args.dtype != "float32")

    def step():
        with amp:
            loss = model.loss(idx, idx)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return 1000 * median_time(step, args.device, args.repeats)


def tables(result: dict) -> str:
    """The layer table (ms with the speed-up over naive, peak MiB) and the training-step table, Markdown
    (printed, and on docs/results.md)."""
    m = result["meta"]

    def cell(row: dict, b: str, key: str) -> str:
        r, ref = row[b], row["naive"]
        if "unavailable" in r or r.get(key) is None:
            return "n/a"
        return n(r[key], 1) + (f" ({ref[key] / r[key]:.1f}×)" if b != "naive" and key.endswith("_ms") else "")

    layer = table(["T", "dropout", *(f"{b} {what}" for what in ("fwd ms", "fwd+bwd ms", "MiB") for b in BACKENDS)],
                  [[n(row["T"]), f"{row['dropout']:g}", *(cell(row, b, k) for k in ("forward_ms", "forward_backward_ms",
                                                                                   "peak_mib") for b in BACKENDS)]
                   for row in result["layer"]])
    steps = table(["model", *BACKENDS], [[name, *("n/a" if isinstance(v[b], str) else n(v[b], 1) for b in BACKENDS)]
                                         for name, v in result["train_step_ms"].items()])
    return "\n\n".join([layer, f"Batch {m['batch']}, n_embd {m['n_embd']}, {m['n_head']} heads, {m['dtype']}, median "
                                 f"of {m['repeats']}. One training step (forward, backward, AdamW), ms:", steps])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq-lens", type=int, nargs="+", default=[64, 128, 256, 512, 1024, 2048, 4096])
    p.add_argument("--dropouts", type=float, nargs="+", default=[0.0, 0.1])
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=DTYPES, default="float32")
    p.add_argument("--models", nargs="*", choices=MODELS, default=list(MODELS), help="the training-step table's models")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurements")
    p.add_argument("--out", type=Path, default=None, help="JSON file (default: benchmarks/results/attention-<device>.json)")
    p.add_argument("--memory-case", nargs=3, metavar=("BACKEND", "T", "DROPOUT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.memory_case:
        b, T, d = args.memory_case
        return memory_case(b, int(T), float(d), args)

    machine = describe(args.device)
    rows = []
    for dropout in args.dropouts:
        for T in args.seq_lens:
            row = {"T": T, "dropout": dropout}
            for b in BACKENDS:
                if reason := reason_unavailable(b, dropout, args):
                    row[b] = {"unavailable": reason}
                    continue
                try:
                    layer, x = layer_case(b, T, dropout, args)
                    fwd = median_time(lambda: layer(x), args.device, args.repeats)
                    both = median_time(lambda: fwd_bwd(layer, x), args.device, args.repeats)
                    mem = None if args.no_memory else peak_memory_mb(b, T, dropout, args)
                    row[b] = {"forward_ms": 1000 * fwd, "forward_backward_ms": 1000 * both, "peak_mib": mem}
                except (RuntimeError, subprocess.CalledProcessError) as err:  # out of memory
                    row[b] = {"unavailable": f"failed: {str(err).splitlines()[0][:120]}"}
            rows.append(row)
            print(f"T {T}, dropout {dropout:g}: measured", flush=True)
    steps = {name: {b: train_step_ms(name, b, args) for b in BACKENDS} for name in args.models}

    out = args.out or ROOT / "benchmarks" / "results" / f"attention-{args.device}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"device": args.device, "machine": machine, "torch": torch.__version__, "dtype": args.dtype,
            "batch": args.batch, "n_embd": args.n_embd, "n_head": args.n_head, "repeats": args.repeats,
            "threads": torch.get_num_threads()}
    result = {"meta": meta, "layer": rows, "train_step_ms": steps}
    out.write_text(json.dumps(result, indent=2))
    print(f"\n{machine}, torch {torch.__version__}\n\n{tables(result)}\n\nwrote {out}")


if __name__ == "__main__":
    main()
