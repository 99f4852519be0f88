"""The Llama-3.1-8B projections in bf16 vs fp8 (``--quantization fp8``), decode to prefill sizes.

    python benchmark/fp8_linear/bench_fp8_gemms.py [--rows 1 8 64 256 2048 8192] [--out DIR]   # GPU machine

For each projection (qkv, o, gate_up, down) and row count M it captures 32 calls on 32 distinct weights (as
the 32 layers are, so nothing is served from L2) in a CUDA graph and times the replay:
  bf16      F.linear (cuBLAS), what the engine runs without quantization at prefill sizes;
  fp8       per-token activation quantization (one triton kernel) + torch._scaled_mm with row-wise scales;
  fp8 mm    torch._scaled_mm alone on pre-quantized activations (what the quantization kernel costs is the
            difference);
  engine    what the engine runs for fp8 weights: the quantization kernel, then the skinny kernel on fp8
            operands where this GPU's tuned table has an ``N x K:fp8`` entry for the row count, else _scaled_mm;
and reports each as x the weight-read floor (weight bytes / measured copy bandwidth) and model TFLOP/s.
Prints a table, writes JSON + markdown.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "benchmark", "decode_roofline"))

from bench_decode_roofline import copy_bandwidth  # noqa: E402

from sglang.srt.layers.decode_gemm import CUBLAS_ONLY, GemmPlan, load_device_table, plan_for_shape  # noqa: E402
from sglang.srt.layers.quantization.fp8_activation_kernel import quantize_activations  # noqa: E402
from sglang.srt.layers.quantization.fp8_linear import fp8_linear, quantize_rows  # noqa: E402
from sglang.test.bench_utils import cuda_graph_ms, write_results  # noqa: E402

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
LAYERS = 32


def _bf16(x: torch.Tensor, weights: list[torch.Tensor]) -> None:
    for w in weights:
        F.linear(x, w)


def _fp8(x: torch.Tensor, quantized: list[tuple[torch.Tensor, torch.Tensor]], plan: GemmPlan) -> None:
    for qw, sw in quantized:
        fp8_linear(x, qw, sw, None, plan)


def _fp8_mm(qx: torch.Tensor, sx: torch.Tensor, quantized: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    for qw, sw in quantized:
        torch._scaled_mm(qx, qw.t(), scale_a=sx, scale_b=sw.view(1, -1), out_dtype=torch.bfloat16)


def time_shape(n: int, k: int, rows: list[int], bw: float, plan: GemmPlan) -> list[dict]:
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5 for _ in range(LAYERS)]
    quantized = [quantize_rows(w) for w in weights]
    out = []
    for m in rows:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        qx, sx = quantize_activations(x)
        row = {"n": n, "k": k, "rows": m, "calls": LAYERS, "engine_config": str(plan.config_for(m))}
        row["floor_bf16_ms"] = LAYERS * n * k * 2 / bw * 1000
        row["floor_fp8_ms"] = LAYERS * n * k / bw * 1000
        flop = 2 * LAYERS * m * n * k
        steps = {
            "bf16": functools.partial(_bf16, x, weights),
            "fp8": functools.partial(_fp8, x, quantized, CUBLAS_ONLY),
            "engine": functools.partial(_fp8, x, quantized, plan),
            "fp8_mm": functools.partial(_fp8_mm, qx, sx, quantized),
        }
        for name, fn in steps.items():
            ms = cuda_graph_ms(fn, replays=10 if m >= 2048 else 20)
            row[f"{name}_ms"] = ms
            row[f"{name}_tflops"] = flop / ms / 1e9
        out.append(row)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64, 256, 2048, 8192])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "gemms"))
    args = parser.parse_args()
    bw = copy_bandwidth()
    plans = load_device_table(torch.cuda.get_device_name())
    results = []
    for name, (n, k) in SHAPES.items():
        for r in time_shape(n, k, args.rows, bw, plan_for_shape(plans, n, k, fp8=True)):
            results.append({"gemm": name, **r})
        torch.cuda.empty_cache()
    lines = [
        f"Llama-3.1-8B projections, {LAYERS} distinct weights each, one CUDA graph; {torch.cuda.get_device_name()}, "
        f"torch {torch.__version__}, copy bandwidth {bw / 1e9:.1f} GB/s",
        "",
        "| gemm | rows | bf16 ms | x bf16 floor | TFLOP/s | fp8 ms | x fp8 floor | TFLOP/s | fp8 mm alone ms "
        "| engine fp8 ms | x fp8 floor | engine / bf16 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['gemm']} | {r['rows']} | {r['bf16_ms']:.3f} | {r['bf16_ms'] / r['floor_bf16_ms']:.2f} | "
            f"{r['bf16_tflops']:.0f} | {r['fp8_ms']:.3f} | {r['fp8_ms'] / r['floor_fp8_ms']:.2f} | "
            f"{r['fp8_tflops']:.0f} | {r['fp8_mm_ms']:.3f} | {r['engine_ms']:.3f} | "
            f"{r['engine_ms'] / r['floor_fp8_ms']:.2f} | {r['engine_ms'] / r['bf16_ms']:.2f} |"
        )
    for m in args.rows:
        sel = [r for r in results if r["rows"] == m]
        bf16, fp8 = sum(r["bf16_ms"] for r in sel), sum(r["fp8_ms"] for r in sel)
        engine = sum(r["engine_ms"] for r in sel)
        lines.append(f"| all four | {m} | {bf16:.3f} | | | {fp8:.3f} | | | | {engine:.3f} | | {engine / bf16:.2f} |")
    table = "\n".join(lines)
    print(table)
    write_results(args.out, {"copy_bandwidth_bytes_per_s": bw, "results": results}, table)


if __name__ == "__main__":
    main()
