"""The device a script runs on (`resolve_device`), and what a result's JSON records of where it
came from: the machine, as one line for it and for docs/results.md (`describe`), and the commit."""
from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path

import torch


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
