"""KTransformers-style hybrid MoE settings (the --kt-* flags), resolved once at start-up."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

# Tokens one CPU step takes at least (its host buffers); longer prefills go through in slices of this size.
MIN_STEP_CAPACITY_TOKENS = 1024


@dataclass(frozen=True)
class KTConfig:
    method: str
    weight_path: Optional[str]
    cpu_threads: int  # --kt-cpuinfer, by default the usable CPUs shared out over the tensor-parallel ranks
    num_gpu_experts: int
    gpu_prefill_token_threshold: Optional[int]
    # Tokens one CPU step takes (its host buffers): at least the largest captured decode batch, so a graph
    # replay is one step; longer prefills go through in slices of this many tokens.
    step_capacity_tokens: int = MIN_STEP_CAPACITY_TOKENS
    # INT8 CPU experts quantize their activations to int8 too (W8A8, as KTransformers' AMXINT8) where the CPU
    # has AVX512-VNNI: 1.3-1.6x faster decode on the H200 host (benchmark/kt_decode/). Tests and benchmarks
    # set False to compare with fp32 activations.
    cpu_int8_activations: bool = True

    @property
    def full_gpu_prefill_enabled(self) -> bool:
        return bool(self.gpu_prefill_token_threshold)
