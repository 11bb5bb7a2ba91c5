"""Start-up decisions made from the machine rather than the config: precision, wandb mode,
and the attention backend check. Kept apart so `train.py` only wires."""
from __future__ import annotations

import netrc
import os
from urllib.parse import urlparse

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, open_dict

from model.attention import check_backend


def resolve_precision(precision: str, accelerator: str) -> str:
    """'auto' → 'bf16-mixed' where a CUDA GPU supports bfloat16 (and the accelerator
    allows a GPU), else '32-true'. Any other value is returned unchanged."""
    if precision != "auto":
        return precision
    gpu_allowed = accelerator in ("auto", "gpu", "cuda")
    if gpu_allowed and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return "bf16-mixed"
    return "32-true"


def compute_dtype(precision: str) -> torch.dtype:
    """The dtype attention runs in under a Lightning precision string ('bf16-mixed' → bfloat16)."""
    if "bf16" in precision:
        return torch.bfloat16
    if precision.startswith("16"):
        return torch.float16
    return torch.float32


def wandb_logged_in() -> bool:
    """True when wandb has credentials here (WANDB_API_KEY or a netrc entry for its host).
    Reads local files only: never prompts and never touches the network."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def instantiate_loggers(cfg: DictConfig | None) -> list:
    """Loggers from the `logger` config group. A logger with `offline: auto` runs online
    when wandb has credentials and offline otherwise (WANDB_MODE, if set, wins)."""
    loggers = []
    for lg_cfg in (cfg or {}).values():
        if lg_cfg is None:
            continue
        if lg_cfg.get("offline") == "auto":
            with open_dict(lg_cfg):
                lg_cfg.offline = os.environ.get("WANDB_MODE", "") == "offline" or not wandb_logged_in()
        loggers.append(instantiate(lg_cfg))
    return loggers


def check_attention_backend(trainer, backend: str, dropout: float, d_k: int) -> None:
    """Raise BackendUnavailableError now, before any data or training work, if `backend`
    cannot run on the trainer's device in its precision with this dropout."""
    device_type = trainer.strategy.root_device.type
    check_backend(backend, device_type, compute_dtype(str(trainer.precision)), dropout, d_k)



def cpu_has_bf16_units() -> bool:
    """Whether this CPU multiplies bfloat16 matrices natively (AMX-BF16 or AVX-512 BF16), per
    `torch.cpu.get_capabilities` (False where this torch cannot tell)."""
    caps = getattr(torch.cpu, "get_capabilities", lambda: {})()
    return bool(caps.get("amx_bf16") or caps.get("avx512_bf16"))


def step_seconds(model: torch.nn.Module, idx: torch.Tensor, dtype: torch.dtype, steps: int = 3) -> float:
    """Median seconds of a training step (forward, backward) of `model` on idx: (B, T) int64
    under CPU autocast to `dtype` (float32: no autocast), after one warm-up step."""
    import time

    times = []
    for i in range(steps + 1):
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            _, loss = model(idx, idx)
        loss.backward()
        model.zero_grad(set_to_none=True)
        if i:
            times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def choose_cpu_precision(make_model, batch_size: int, block_size: int, vocab_size: int, log=print) -> str:
    """'bf16-mixed' where the CPU has bfloat16 matrix units *and* a few timed training steps of
    this model run faster in bfloat16 autocast than in float32, else '32-true'; says which and
    why through `log`. make_model: () → a fresh model (its weights do not matter)."""
    if not cpu_has_bf16_units():
        log("precision: 32-true (this CPU has no bfloat16 matrix units: AMX-BF16 / AVX-512 BF16)")
        return "32-true"
    model = make_model().train()
    idx = torch.randint(0, vocab_size, (batch_size, block_size))
    fp32, bf16 = step_seconds(model, idx, torch.float32), step_seconds(model, idx, torch.bfloat16)
    choice = "bf16-mixed" if bf16 < fp32 else "32-true"
    log(f"precision: {choice} (bfloat16 units present; a training step takes {fp32 * 1e3:.0f} ms in float32, "
        f"{bf16 * 1e3:.0f} ms in bfloat16 autocast)")
    return choice


def compile_or_eager(module: torch.nn.Module, log=print) -> bool:
    """Compile `module` in place with `torch.compile` (`nn.Module.compile`: the state_dict keys stay
    the eager ones, so checkpoints are interchangeable) if a trial compilation works here;
    otherwise keep it eager and say why through `log`. Returns whether it was compiled."""
    try:
        torch.compile(lambda x: x * 2 + 1)(torch.ones(2))  # needs a C++ compiler for the CPU backend
    except Exception as err:  # noqa: BLE001 — any failure of the toolchain means: stay eager
        log(f"compile: unavailable here ({type(err).__name__}: {str(err).splitlines()[0][:200]}); running eagerly")
        return False
    module.compile()
    log("compile: the model runs through torch.compile")
    return True
