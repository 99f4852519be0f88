"""Which GEMM serves a projection at a given batch size: the tuned table, and the pure choice from it.

A table is measured per GPU model by ``benchmark/decode_roofline/tune_decode_gemms.py`` and shipped in
``configs/<device name>.json`` (SGLang ships its fused-MoE tile configs the same way); tables tuned for other
models can live in a directory of their own (``SGLANG_DECODE_GEMM_CONFIG_DIR``). For each weight
shape ``N x K`` it lists tuned batch sizes, each with the skinny kernel's tiles or ``null`` where cuBLAS
measured faster. A tuned batch size ``m_t`` covers the batches above the previous tuned size up to
``m_t`` (decode is weight-bound there, so a tile that is best for 16 rows is best for 9..16); batches
above the largest tuned size, shapes not in the table and GPUs without a table use cuBLAS.
fp8 weights (``--quantization fp8``) have entries of their own, keyed ``N x K:fp8``; for them the skinny
kernel runs on fp8 operands and "cuBLAS" means ``torch._scaled_mm``. A block-fp8 checkpoint's weights (a
scale per 128x128 block) have ``N x K:fp8block``: the skinny kernel with a scale block per K step (BLOCK_K
128) against cuBLAS's block-scaled GEMM, both after the per-group activation quantization. A merged gate_up
projection has a second entry keyed ``N x K:silu`` (``N x K:fp8:silu``): the skinny kernel with SiLU-and-mul
in its epilogue, against the projection's own plan followed by the activation kernel (``null``: that pair).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Mapping, Optional

if TYPE_CHECKING:
    import torch

CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
# The split-K sum kernel with the add-norm after it holds a whole row in one program (a hidden size: 16k fp32
# values are 64 registers a thread at 8 warps).
MAX_ADD_NORM_COLUMNS = 16384


@dataclass(frozen=True)
class GemmConfig:
    """Tiles of the skinny kernel (``kernel.py``)."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    split_k: int = 1
    pdl: bool = False  # launched with programmatic dependent launch where the GPU has it (../pdl.py)

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"GemmConfig.{name} must be a power of two >= 16, got {value}")
        if self.num_warps < 1 or self.num_stages < 1 or self.split_k < 1:
            raise ValueError(f"GemmConfig needs num_warps, num_stages and split_k >= 1, got {self}")

    def to_json(self) -> dict:
        return asdict(self)

    def k_split(self, k: int) -> tuple[int, int]:
        """(splits, K per split) for a K-long sum: each split a whole number of K tiles (only the last one can
        be ragged), and no more splits than tiles."""
        splits = max(1, min(self.split_k, math.ceil(k / self.block_k)))
        per_split = math.ceil(math.ceil(k / splits) / self.block_k) * self.block_k
        return math.ceil(k / per_split), per_split


def add_norm_refusal(
    config: GemmConfig,
    m: int,
    k: int,
    n: int,
    residual: "torch.Tensor",
    norm_weight: "torch.Tensor",
    scaled: bool = False,
    silu_and_mul: bool = False,
    addend: Optional["torch.Tensor"] = None,
) -> Optional[str]:
    """Why the split-K sum kernel cannot do the residual add and RMSNorm after this [m, k] x [n, k] GEMM, or
    None when it can: it needs partial sums to add (a config that splits this K), no per-channel fp8 scales
    (``scaled``: that path does not pass them through; block-scaled partials are summed as they are), no
    SiLU-and-mul, a row it can hold (N <= MAX_ADD_NORM_COLUMNS), a row-contiguous [m, n] residual (and addend, if
    any) and an [n] norm weight. One rule for the caller that falls back (``linear_add_rmsnorm``) and the kernel
    that raises."""
    if config.k_split(k)[0] == 1 or scaled or silu_and_mul or n > MAX_ADD_NORM_COLUMNS:
        return (
            f"add_norm needs a split-K config, no per-channel scales, no silu_and_mul and N <= "
            f"{MAX_ADD_NORM_COLUMNS}, got {config} for K={k}, N={n}"
        )
    if tuple(residual.shape) != (m, n) or residual.stride(1) != 1 or tuple(norm_weight.shape) != (n,):
        return f"add_norm needs a row-contiguous [{m}, {n}] residual and a [{n}] norm weight"
    if addend is not None and (tuple(addend.shape) != (m, n) or addend.stride(1) != 1):
        return f"add_norm needs a row-contiguous [{m}, {n}] addend, got {tuple(addend.shape)}"
    return None


@dataclass(frozen=True)
class GemmPlan:
    """One weight shape's choices, ascending by batch size: ``(max_batch, config or None for cuBLAS)``."""

    by_batch: tuple[tuple[int, Optional[GemmConfig]], ...] = ()

    def config_for(self, batch: int) -> Optional[GemmConfig]:
        for max_batch, config in self.by_batch:
            if batch <= max_batch:
                return config
        return None

    @property
    def uses_skinny_kernel(self) -> bool:
        return any(config is not None for _, config in self.by_batch)


CUBLAS_ONLY = GemmPlan()


def shape_key(n: int, k: int, fp8: bool = False, silu_and_mul: bool = False, block_fp8: bool = False) -> str:
    return f"{n}x{k}" + (":fp8block" if block_fp8 else ":fp8" if fp8 else "") + (":silu" if silu_and_mul else "")


def device_table_path(device_name: str, config_dir: str = "") -> str:
    return os.path.join(config_dir or CONFIG_DIR, device_name.replace(" ", "_") + ".json")


def parse_table(raw: Mapping) -> dict[str, GemmPlan]:
    """The ``shapes`` section of a table file -> a plan per shape key; a malformed entry raises ValueError."""
    plans = {}
    for key, entries in raw.get("shapes", {}).items():
        by_batch = []
        for batch, config in entries.items():
            if int(batch) < 1:
                raise ValueError(f"decode GEMM table: batch sizes must be >= 1, got {batch!r} for {key}")
            by_batch.append((int(batch), None if config is None else GemmConfig(**config)))
        plans[key] = GemmPlan(tuple(sorted(by_batch, key=lambda entry: entry[0])))
    return plans


def load_device_table(device_name: str, config_dir: str = "") -> dict[str, GemmPlan]:
    """The table for this GPU model (in ``config_dir``, default the shipped ones), or no plans (cuBLAS
    everywhere) when none was tuned."""
    path = device_table_path(device_name, config_dir)
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return parse_table(json.load(f))


def plan_for_shape(
    plans: Mapping[str, GemmPlan],
    n: int,
    k: int,
    fp8: bool = False,
    silu_and_mul: bool = False,
    block_fp8: bool = False,
) -> GemmPlan:
    return plans.get(shape_key(n, k, fp8, silu_and_mul, block_fp8), CUBLAS_ONLY)


def update_table_file(path: str, device: str, model: str, shapes: Mapping[str, dict], **provenance) -> None:
    """Add (or replace) ``shapes`` (the file's ``shapes`` format) in the table at ``path``, recording the model
    they were tuned for; shapes tuned for other models stay. The result must parse (``parse_table``)."""
    table = {"device": device, "models": [], "shapes": {}}
    if os.path.exists(path):
        with open(path) as f:
            table = json.load(f)
        if table.get("device") != device:
            raise ValueError(f"{path} holds a table for {table.get('device')!r}, not {device!r}")
    table.update(provenance)
    table["models"] = sorted(set(table.get("models", [])) | {model})
    table["shapes"] = {**table.get("shapes", {}), **shapes}
    parse_table(table)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(table, f, indent=1)
        f.write("\n")
