"""No-op markers that register a test file with a CI suite, as SGLang does.

``test/run_suite.py`` reads these calls from the source text (it never imports the file), so the
arguments must be literals. At run time they do nothing.
"""

from __future__ import annotations

CPU_SUITE = "per-commit-cpu"
CUDA_SUITE = "per-commit-cuda"
CUDA_2_GPU_SUITE = "per-commit-2-gpu"  # the nvidia-h200-x2 machine


def register_cpu_ci(est_time: float, suite: str = CPU_SUITE) -> None:
    """Run this file in the CPU suite (CI, every submission)."""


def register_cuda_ci(est_time: float, suite: str = CUDA_SUITE) -> None:
    """Run this file in the CUDA suite (the GPU machine)."""
