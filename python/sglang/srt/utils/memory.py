"""Device and host memory readings, all in one unit per function (the name says which).

The planner works in bytes (pool_configurator.py); the ServerArgs heuristics work in MiB like
SGLang's `get_device_memory_capacity`. Mixing them up is the classic MiB-vs-bytes bug, so every
function converts exactly once.
"""

from __future__ import annotations

import os
import subprocess
from functools import lru_cache
from typing import Optional

import torch

from sglang.srt.environ import envs

GiB = 1 << 30
MiB = 1 << 20


def _host_meminfo_bytes() -> dict[str, int]:
    out: dict[str, int] = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, rest = line.split(":", 1)
            out[key] = int(rest.split()[0]) * 1024
    return out


def host_total_memory_bytes() -> int:
    budget = envs.SGLANG_CPU_MEMORY_BUDGET_GB.get()
    if budget > 0:
        return int(budget * GiB)
    return _host_meminfo_bytes()["MemTotal"]


def host_available_memory_bytes() -> int:
    """What this process could still take: MemAvailable, capped by the budget when one is set."""
    available = _host_meminfo_bytes()["MemAvailable"]
    budget = envs.SGLANG_CPU_MEMORY_BUDGET_GB.get()
    if budget > 0:
        # The budget is the whole device: what this process already holds counts against it.
        used = _process_rss_bytes()
        available = min(available, max(int(budget * GiB) - used, 0))
    return available


def _process_rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@lru_cache(maxsize=None)
def _nvidia_smi_total_mib(index: int) -> Optional[float]:
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--id={index}", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    try:
        return float(out.stdout.strip().splitlines()[0])
    except (ValueError, IndexError):
        return None


def get_device_memory_capacity(device: str, index: int = 0) -> float:
    """Total memory of the device in MiB (the unit of the mem_fraction_static heuristic).

    On CUDA this asks nvidia-smi first, so the launcher never creates a CUDA context of its own
    (which would cost the server half a GiB on every GPU); torch is the fallback.
    """
    if device == "cuda":
        smi = _nvidia_smi_total_mib(index)
        if smi is not None:
            return smi
        return torch.cuda.get_device_properties(index).total_memory / MiB
    return host_total_memory_bytes() / MiB


def get_available_memory_bytes(device: str, index: int = 0) -> int:
    """Free memory on the device in bytes, as the planner reads it (after emptying torch's cache)."""
    if device == "cuda":
        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info(index)
        return int(free)
    return host_available_memory_bytes()
