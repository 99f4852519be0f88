"""The built-in CPU backend of KT hybrid experts: a C++ kernel (kernel.cpp) driven through ctypes."""

from sglang.srt.layers.moe.cpu_experts.engine import CpuExpertsEngine, CpuExpertsLayer, CpuExpertsStats, kernel_format

__all__ = ["CpuExpertsEngine", "CpuExpertsLayer", "CpuExpertsStats", "kernel_format"]
