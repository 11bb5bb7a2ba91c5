"""The device a script runs on (`resolve_device`), whether an attention backend can run there
(`check_backend`: the FlashAttention kernel's rules), and what a result's JSON records of where
it came from: the machine, as one line for it and for docs/results.md (`describe`), and the commit."""
from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from model.attention import BACKENDS


class BackendUnavailableError(RuntimeError):
    """The chosen attention backend cannot run on this device / dtype / dropout."""


def flash_unavailable_reason(device_type: str, dtype: torch.dtype, dropout: float, d_k: int) -> str | None:
    """Why the FlashAttention kernel cannot run here, or None if it can.

    device_type: 'cpu' | 'cuda' | ...; dtype: the dtype q, k, v will have (under autocast,
    the autocast dtype); dropout: the attention dropout that will be used (0 in eval);
    d_k: head size. The rules are PyTorch's (sdp_utils): the CPU flash kernel has no
    dropout; the CUDA one needs float16/bfloat16, compute capability ≥ 8.0 and
    d_k a multiple of 8 up to 256. A short trial call confirms the verdict.
    """
    if device_type == "cpu":
        if dropout > 0:
            return (f"the CPU FlashAttention kernel has no dropout, and dropout={dropout}. "
                    "Use attention=sdpa or attention=naive, or set model.dropout=0")
    elif device_type == "cuda":
        if dtype not in (torch.float16, torch.bfloat16):
            return (f"FlashAttention on CUDA needs float16 or bfloat16, not {dtype}. "
                    "Use trainer.precision=bf16-mixed (or 16-mixed), or attention=sdpa")
        if torch.cuda.get_device_capability() < (8, 0):
            return (f"FlashAttention needs a GPU of compute capability 8.0 or newer; this one is "
                    f"{'.'.join(map(str, torch.cuda.get_device_capability()))}. Use attention=sdpa")
        if d_k % 8 or d_k > 256:
            return (f"FlashAttention needs a head size d_k that is a multiple of 8 and at most 256, not {d_k}. "
                    "Use attention=sdpa")
    else:
        return f"this project's FlashAttention backend supports cpu and cuda, not {device_type}. Use attention=sdpa"
    try:  # the rules above are PyTorch's today; a trial call catches what they miss
        q = torch.zeros(1, 1, 8, d_k, device=device_type, dtype=dtype, requires_grad=dropout > 0)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            F.scaled_dot_product_attention(q, q, q, dropout_p=dropout, is_causal=True)
    except RuntimeError as err:
        return f"PyTorch has no FlashAttention kernel for this case ({err}). Use attention=sdpa"
    return None


def check_backend(backend: str, device_type: str, dtype: torch.dtype, dropout: float, d_k: int) -> None:
    """Raise before any long work if `backend` cannot run here.

    raises ValueError for an unknown backend name, BackendUnavailableError (with the
    reason and the backend to use instead) if `flash` has no kernel on this device.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "flash" and (reason := flash_unavailable_reason(device_type, dtype, dropout, d_k)):
        raise BackendUnavailableError(f"attention=flash cannot run here: {reason}.")



def machine_load(seconds: float = 1.0) -> float | None:
    """The share of the machine's CPU time (0–1, all cores) that other processes used over the next
    `seconds` while this one sleeps, from /proc/stat; None where there is no /proc/stat. A timing
    taken when this is well above 0 measures the other work as much as its own."""
    def ticks() -> tuple[int, int]:
        values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        return sum(values), values[3] + values[4]  # all, idle + iowait

    try:
        total0, idle0 = ticks()
        time.sleep(seconds)
        total1, idle1 = ticks()
    except (OSError, ValueError, IndexError):
        return None
    return round(1 - (idle1 - idle0) / max(total1 - total0, 1), 3)


def describe(device: str = "cpu") -> str:
    """e.g. 'AMD EPYC (2 cores, 2 threads), torch 2.13.0+cpu', or on CUDA
    'NVIDIA H100 80GB HBM3, CUDA 12.4, torch 2.6.0': the CPU model from /proc/cpuinfo (else
    `platform`), its cores and torch's threads; for a CUDA device the GPU's name."""
    if torch.device(device).type == "cuda":
        return f"{torch.cuda.get_device_name()}, CUDA {torch.version.cuda}, torch {torch.__version__}"
    model = platform.processor() or platform.machine()
    try:
        model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    threads = torch.get_num_threads()
    return f"{model} ({os.cpu_count()} cores, {threads} thread{'s' * (threads != 1)}), torch {torch.__version__}"


def commit() -> str | None:
    """The git commit of the project's checkout (`git rev-parse HEAD`), or None outside a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parents[1],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def resolve_device(device: str) -> str:
    """`auto` → `cuda` where torch sees a CUDA GPU, else `cpu`; any other device name unchanged.
    raises ValueError for a name torch does not know, or a CUDA device on a machine (or torch build) without one."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        kind = torch.device(device).type
    except RuntimeError:
        raise ValueError(f"device={device} is not a device torch knows; use device=auto, cpu or cuda") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device} but this machine has no CUDA GPU (or this torch build has no CUDA); "
                         "use device=cpu or device=auto")
    return device
