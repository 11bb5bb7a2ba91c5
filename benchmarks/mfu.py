"""Training throughput and model FLOPs utilisation (MFU) of a model configuration on this device.

    python benchmarks/mfu.py                                   # experiment=small_gpu's model, on CUDA
    python benchmarks/mfu.py --model tiny --device cpu --batch 32

Times `--steps` training steps (forward, backward, optimizer step, after `--warmup`) of the
model of `conf/model/<model>.yaml` (with `experiment=small_gpu`'s recipe for `small`), with
random token ids, in bf16 autocast on CUDA and float32 on the CPU, and reports tokens/s and MFU
= achieved FLOP/s ÷ the device's peak. FLOPs per token: 6 × parameters in matrix products plus
the attention's 6 · n_layer · block_size · n_embd (Kaplan et al. 2020 / PaLM appendix B; the
adaptive softmax's output layer counts the clusters a token actually uses, at the training
data's frequencies). The vocabulary is the trained one: the corpus's characters, `<bos>`, `<eos>`
and the 36 plan tokens. Writes `benchmarks/results/mfu-<device>.json` with the machine and its
CPU time other processes used when the timing started (`model.device.machine_load`): a figure taken beside another busy
process is refused, as the first CPU figure (20,121.8 ms a step, 160× slow) was not.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from data.verse.plan import plan_labels  # noqa: E402
from model.device import describe, machine_load  # noqa: E402
from model.gpt import GPT, GPTConfig  # noqa: E402
from model.training.lit import build_optimizer  # noqa: E402

PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0, "RTX 4090": 165.0}
"""Dense bf16 tensor-core peaks (vendor data sheets, without sparsity), by a substring of the GPU name."""
VOCAB = {name: chars + 2 + len(plan_labels()) for name, chars in (("tiny", 8162), ("small", 11658))}
"""Trained vocabularies: the characters of data=tang (the default's) or data=tang+song (small_gpu's),
`<bos>`, `<eos>` and the plan tokens (data/corpus/README.md)."""
HEAD_SHARE = (0.949, 0.044, 0.007)  # training tokens in the adaptive head, first and second tail cluster


BUSY = 0.2
"""The share of CPU time other processes may use when a CPU timing starts (`machine_load`)."""


def model_config(name: str) -> tuple[GPTConfig, dict]:
    """GPTConfig and optimizer settings of conf/model/<name>.yaml as train.py composes it; `small` with
    experiment=small_gpu's recipe."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        model = OmegaConf.to_container(compose("train", ["experiment=small_gpu"] if name == "small" else
                                               [f"model={name}"]).model)
    optim = model.pop("optim")
    model.pop("name")
    return GPTConfig(vocab_size=VOCAB[name], **model), optim


def flops_per_token(cfg: GPTConfig) -> float:
    """Training FLOPs per token: 6 × matrix-product parameters used per token + attention scores."""
    d, blocks = cfg.n_embd, cfg.n_layer * 12 * cfg.n_embd ** 2  # q, k, v, output, MLP 4×
    if cfg.head == "adaptive":
        c = list(cfg.head_cutoffs) + [cfg.vocab_size]
        head = d * (c[0] + len(c) - 1)
        for k, share in enumerate(HEAD_SHARE[1:len(c)], start=1):
            width = int(d // 4.0 ** k)  # each tail cluster 4 times narrower (model/gpt.py)
            head += share * (d * width + width * (c[k] - c[k - 1]))
    else:
        head = d * cfg.vocab_size
    return 6 * (blocks + head) + 6 * cfg.n_layer * cfg.block_size * d


def peak_flops(device: str) -> float | None:
    """The device's dense bf16 peak in FLOP/s, if known (CUDA GPUs in PEAK_TFLOPS)."""
    if device != "cuda":
        return None
    name = torch.cuda.get_device_name()
    return next((t * 1e12 for k, t in PEAK_TFLOPS.items() if k in name), None)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="small")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch", type=int, default=128)  # experiment=small_gpu's data.batch_size
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--out", type=Path, default=None, help="the JSON (default: benchmarks/results/mfu-<device>.json)")
    args = p.parse_args(argv)
    load = machine_load()
    if args.device == "cpu" and load is not None and load > BUSY:
        raise SystemExit(f"error: other processes used {load:.0%} of this machine's CPU time just now; a CPU timing "
                         "beside them measures them too. Run it on a quiet machine")
    cfg, optim = model_config(args.model)
    if args.device != "cuda":
        cfg.backend = "sdpa"
    torch.manual_seed(0)
    gpt = GPT(cfg).to(args.device).train()
    opt = build_optimizer(gpt, optim)
    idx = torch.randint(0, cfg.vocab_size, (args.batch, cfg.block_size + 1), device=args.device)
    x, y = idx[:, :-1], idx[:, 1:]
    autocast = torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.device == "cuda")
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            if args.device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
        with autocast:
            loss = gpt.loss(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    if args.device == "cuda":
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / args.steps
    tokens_per_sec = args.batch * cfg.block_size / seconds
    achieved = tokens_per_sec * flops_per_token(cfg)
    peak = peak_flops(args.device)
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    result = {"machine": describe(args.device), "others_cpu_share": load, "model": args.model, "device": device,
              "batch": args.batch, "block_size": cfg.block_size, "vocab_size": cfg.vocab_size,
              "ms_per_step": round(seconds * 1e3, 2), "tokens_per_sec": round(tokens_per_sec),
              "flops_per_token": round(flops_per_token(cfg)), "achieved_tflops": round(achieved / 1e12, 3),
              "mfu": None if peak is None else round(achieved / peak, 4)}
    print(json.dumps(result, indent=2))
    out = args.out or ROOT / "benchmarks" / "results" / f"mfu-{args.device}.json"
    out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
