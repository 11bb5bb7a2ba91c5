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

