"""What switching heads off costs, side by side in one process.

    python benchmarks/ablation.py                   # CPU, float32

The default model's shape (conf/model/tiny.yaml, with a vocabulary of the shipped corpus's
size, random weights: speed does not depend on training), the per-token nats of a
validation-sized batch (`GPT.nats`, 32 windows of block_size tokens, eval mode; what validation
and the causal figures run): nothing ablated, one head off, a whole
layer off, and every head off (`model.ablation.ablate`, zero mode; mean mode replaces by
another constant, at the same cost). The variants alternate, round after round, so a drift of
the machine reaches them all; the median per variant and its ratio to the unablated forward
are printed and written to `benchmarks/results/ablation-cpu.json`.
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
from model.ablation import ablate  # noqa: E402
from model.device import commit, describe  # noqa: E402
from model.engine import Engine  # noqa: E402
from model.gpt import GPT, MODEL_FIELDS, GPTConfig  # noqa: E402

VOCAB = 8164  # the shipped corpus's characters in simplified script, plus <bos> and <eos>


def default_engine() -> Engine:
    """A randomly initialised model of conf/model/tiny.yaml's options over VOCAB ids, eval mode."""
    cfg = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "model" / "tiny.yaml"))
    tok = CharTokenizer(chr(0x4E00 + i) for i in range(VOCAB - 2))
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=VOCAB, **{k: cfg[k] for k in MODEL_FIELDS if k in cfg})).eval()
    return Engine(gpt, tok)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--rounds", type=int, default=61)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "ablation-cpu.json")
    args = p.parse_args(argv)
    engine = default_engine()
    cfg = engine.model.cfg
    last = cfg.n_layer - 1
    variants = {"none": [], f"one head (L{last}H1)": [f"L{last}H1"],
                f"a layer (L{last}H0–H{cfg.n_head - 1})": [f"L{last}H{h}" for h in range(cfg.n_head)],
                "every head": [f"L{ly}H{h}" for ly in range(cfg.n_layer) for h in range(cfg.n_head)]}
    idx = torch.randint(0, VOCAB, (args.batch, cfg.block_size), generator=torch.Generator().manual_seed(1))
    times: dict[str, list[float]] = {name: [] for name in variants}
    with torch.no_grad():
        for r in range(args.rounds + 1):  # the first round warms up
            for name, heads in variants.items():
                ablate(engine, heads)
                start = time.perf_counter()
                engine.model.nats(idx, idx)
                if r:
                    times[name].append(time.perf_counter() - start)
    base = statistics.median(times["none"])
    rows = [{"ablated": name, "heads": len(heads), "median_ms": round(statistics.median(times[name]) * 1e3, 2),
             "ratio": round(statistics.median(times[name]) / base, 3)} for name, heads in variants.items()]
    result = {"machine": describe("cpu"), "commit": commit(), "threads": torch.get_num_threads(),
              "model": "tiny", "batch": args.batch, "block_size": cfg.block_size, "rounds": args.rounds, "rows": rows}
    print(result["machine"])
    for row in rows:
        print(f"{row['ablated']:<24} {row['median_ms']:>8.2f} ms  {row['ratio']:.3f}×")
    args.out.write_text(json.dumps(result, indent=2, ensure_ascii=False))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
