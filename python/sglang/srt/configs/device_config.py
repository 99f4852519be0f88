"""The device a server runs on: probed once at start-up, or described (plan_memory, tests).

Everything the resolve step (engine_config.py) needs to know about the machine is read here and nowhere
else: which device, its total memory, the CPUs this process may use, and (lazily, only when post-capture
sizing is asked for) whether CUDA virtual memory works.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from sglang.srt.configs.errors import ServerArgsError


@dataclass(frozen=True)
class DeviceConfig:
    kind: str  # "cuda" or "cpu"
    memory_mib: float  # total memory, MiB like nvidia-smi (on the CPU: MemTotal or SGLANG_CPU_MEMORY_BUDGET_GB)
    usable_cpus: int  # CPUs this process may run on
    # A described device (plan_memory, tests) says whether VMM would work; a probed one asks the driver
    # when post-capture sizing is requested (vmm_problem()).
    described: bool = False
    described_vmm_problem: Optional[str] = None

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_mib * (1 << 20))

    def vmm_problem(self, gpu_id: int) -> Optional[str]:
        """Why CUDA VMM would not work on this device (None: it works)."""
        if self.described:
            return self.described_vmm_problem
        from sglang.srt.mem_cache.vmm import vmm_supported

        ok, why = vmm_supported(gpu_id)
        return None if ok else why


def described_device(kind: str, memory_mib: float, vmm_problem: Optional[str] = None) -> DeviceConfig:
    """A device planned for rather than probed (python -m sglang.plan_memory, tests)."""
    return DeviceConfig(
        kind=kind,
        memory_mib=memory_mib,
        usable_cpus=len(os.sched_getaffinity(0)),
        described=True,
        described_vmm_problem=vmm_problem,
    )


def probe_device(device_flag: Optional[str], gpu_id: int) -> DeviceConfig:
    """The machine's device for --device (None: cuda when a GPU is visible). Reads nvidia-smi for the
    memory, so the launcher creates no CUDA context of its own."""
    import torch

    from sglang.srt.utils.memory import get_device_memory_capacity

    cuda_visible = torch.cuda.is_available()
    kind = device_flag or ("cuda" if cuda_visible else "cpu")
    if kind == "cuda" and not cuda_visible:
        raise ServerArgsError("--device cuda was given but no CUDA GPU is visible")
    return DeviceConfig(
        kind=kind, memory_mib=get_device_memory_capacity(kind, gpu_id), usable_cpus=len(os.sched_getaffinity(0))
    )
