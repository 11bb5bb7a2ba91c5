"""The GPU recipe on paper: `python train.py experiment=small_gpu` sized against its data and the
data-constrained study, and its expected time on one H200 from the FLOPs per token measured here.

    python benchmarks/gpu_recipe.py          # writes benchmarks/results/gpu-recipe.json

Composes the recipe's config, prepares its data (the Tang and Song corpora), builds its model and
counts the FLOPs of one training step (forward and backward) on real windows with PyTorch's
`FlopCounterMode` (matrix products and attention, the work that runs on tensor cores). From the
unique training tokens it gives the epochs the run sees (tokens seen ÷ unique training tokens),
set beside the earliest epoch at which one of the study's runs with the same dropout
(benchmarks/data_constrained.py: Tang, Tang+Song, the wider shape) stopped improving; and the
run's FLOPs (training, plus each validation's forward pass over the Tang and Song validation
splits) over one H200's dense bf16 peak at the model FLOPs utilisations in MFU, or at the one
`scripts/gpu_check.sh` measured (`mfu-cuda.json`) once it exists.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import rootutils  # noqa: E402
import torch  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from hydra.utils import instantiate  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from benchmarks.mfu import PEAK_TFLOPS  # noqa: E402
from model.device import commit, describe  # noqa: E402
from model.gpt import MODEL_FIELDS  # noqa: E402
from model.loading import head_for_vocabulary  # noqa: E402
from model.training.lit import LitGPT  # noqa: E402

rootutils.setup_root(__file__, indicator=".project-root")  # PROJECT_ROOT, which conf/paths reads
OUT = ROOT / "benchmarks" / "results" / "gpu-recipe.json"
STUDY = ROOT / "benchmarks" / "results" / "data-constrained-cpu.json"
OVERRIDES = ["experiment=small_gpu"]
MFU = (0.1, 0.25, 0.4)
"""Model FLOPs utilisations the time is given at until a GPU has measured one."""


def study_limit(dropout: float) -> dict | None:
    """Of the study's runs with the recipe's dropout (`model.dropout` set, or no dropout at all), the
    one whose Tang val/bpc was best earliest (in epochs): the most a recipe should repeat its data."""
    if not STUDY.exists():
        return None
    runs = json.loads(STUDY.read_text())["runs"]
    alike = {name: r for name, r in runs.items()
             if any(o.startswith("model.dropout=") for o in r["overrides"]) == (dropout > 0)
             and not any("attn_dropout" in o for o in r["overrides"])}
    if not alike:
        return None
    name = min(alike, key=lambda k: alike[k]["best"]["epochs"])
    return {"run": name, "best_epochs": alike[name]["best"]["epochs"], "best_val_bpc": alike[name]["best"]["val_bpc"],
            "runs": sorted(alike)}


def measure(overrides: list[str] = OVERRIDES, windows: int = 4) -> dict:
    """The recipe's settings, data and model sizes, and its training FLOPs per token (`FlopCounterMode`
    over forward and backward of `windows` real training windows on the CPU, sdpa attention)."""
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=[*overrides, "attention=sdpa"])
    dm = instantiate(cfg.data)
    dm.prepare_data()
    dm.setup("fit")
    shape = OmegaConf.to_container(cfg.model, resolve=True)
    model = head_for_vocabulary({**{k: shape[k] for k in MODEL_FIELDS if k in shape}, "backend": "sdpa"},
                                dm.tokenizer.vocab_size)
    gpt = LitGPT(model=model, optim=shape["optim"], tokenizer=dm.tokenizer.state_dict(), script=cfg.data.script).gpt
    x, y = (torch.stack(t) for t in zip(*(dm.train_set[i] for i in range(windows))))
    with FlopCounterMode(display=False) as counter:
        gpt.loss(x, y).backward()
    tr = cfg.trainer
    batch = cfg.data.batch_size * tr.get("accumulate_grad_batches", 1)
    steps, block = tr.max_steps, cfg.model.block_size
    val_tokens = {name: dm.meta["val" if not name else f"val_{name}"]["tokens"] for name in dm.val_names}
    return {"overrides": overrides, "n_layer": cfg.model.n_layer, "n_head": cfg.model.n_head,
            "n_embd": cfg.model.n_embd, "block_size": block, "dropout": cfg.model.dropout, "batch": batch,
            "steps": steps, "val_check_interval": tr.val_check_interval, "vocab_size": dm.tokenizer.vocab_size,
            "parameters": sum(p.numel() for p in gpt.parameters()), "unique_tokens": dm.train_tokens,
            "val_tokens": sum(val_tokens.values()), "flops_per_token": round(counter.get_total_flops() / x.numel())}


def expected_seconds(r: dict, mfu: float, peak_tflops: float = PEAK_TFLOPS["H200"]) -> float:
    """Seconds on a GPU of `peak_tflops` at utilisation `mfu`: training FLOPs (steps × batch × block ×
    FLOPs per token) plus a forward pass (a third of them) over the validation tokens at every validation."""
    train = r["steps"] * r["batch"] * r["block_size"] * r["flops_per_token"]
    validations = r["steps"] // r["val_check_interval"]
    return (train + validations * r["val_tokens"] * r["flops_per_token"] / 3) / (peak_tflops * 1e12 * mfu)


def recipe() -> dict:
    """`measure()` with the machine, tokens seen, epochs, the study's limit and H200 seconds per MFU."""
    r = {"machine": describe("cpu"), "commit": commit(), **measure()}
    r["tokens_seen"] = r["steps"] * r["batch"] * r["block_size"]
    r["epochs"] = round(r["tokens_seen"] / r["unique_tokens"], 2)
    r["study"] = study_limit(r["dropout"])
    mfu_file = ROOT / "benchmarks" / "results" / "mfu-cuda.json"
    measured = json.loads(mfu_file.read_text()).get("mfu") if mfu_file.exists() else None
    r["h200_seconds"] = {f"{m:g}": round(expected_seconds(r, m), 1) for m in ([measured] if measured else MFU)}
    r["mfu_measured"] = measured is not None
    return r


def main() -> None:
    r = recipe()
    OUT.write_text(json.dumps(r, indent=1))
    print(json.dumps(r, indent=1), f"\nwrote {OUT}", sep="\n")


if __name__ == "__main__":
    main()
