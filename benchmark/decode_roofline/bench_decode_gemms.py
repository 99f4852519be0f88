"""The decode step's GEMMs alone (Llama-3.1-8B shapes, bf16) vs their weight-read floor, per BLAS library.

    python benchmark/decode_roofline/bench_decode_gemms.py [--out DIR]

For each projection (qkv, o, gate_up, down; lm_head once) and batch 1 / 8 / 64, it captures 32 calls
on 32 distinct weights (as the 32 layers are, so nothing is served from L2) in a CUDA graph and times
the replay, once with torch's default BLAS (cuBLAS) and once with `preferred_blas_library("cublaslt")`.
The floor is the weight bytes over the measured copy bandwidth. A diagnostic of where the decode step's
GEMM time goes (the engine never switches BLAS libraries; where its tuned table says so it uses its own skinny
kernel instead: ``tune_decode_gemms.py``); prints a table, writes JSON + markdown.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.nn.functional as F
from bench_decode_roofline import copy_bandwidth

from sglang.test.bench_utils import cuda_graph_ms, write_results  # bench_decode_roofline put python/ on the path

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
LAYERS = 32


def time_linear(weights, batch: int) -> float:
    x = torch.randn(batch, weights[0].shape[1], device="cuda", dtype=torch.bfloat16)

    def step() -> None:
        for w in weights:
            F.linear(x, w)

    return cuda_graph_ms(step)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "gemms"))
    args = parser.parse_args()
    bw = copy_bandwidth()
    rows = []
    shapes = dict(SHAPES, lm_head=(128256, 4096))
    for name, (n, k) in shapes.items():
        layers = 1 if name == "lm_head" else LAYERS
        weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(layers)]
        floor_ms = layers * n * k * 2 / bw * 1000
        for batch in (1, 8, 64):
            row = {"gemm": name, "n": n, "k": k, "calls": layers, "batch": batch, "floor_ms": round(floor_ms, 4)}
            for lib in ("cublas", "cublaslt"):
                torch.backends.cuda.preferred_blas_library(lib)
                ms = time_linear(weights, batch)
                row[f"{lib}_ms"], row[f"{lib}_x_floor"] = round(ms, 4), round(ms / floor_ms, 3)
            torch.backends.cuda.preferred_blas_library("cublas")
            rows.append(row)
        del weights
        torch.cuda.empty_cache()
    lines = [
        f"Decode GEMMs (Llama-3.1-8B shapes, bf16, {LAYERS} distinct weights per projection, CUDA graph), "
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, copy bandwidth {bw / 1e9:.1f} GB/s",
        "",
        "| gemm | N x K | batch | floor ms | cuBLAS ms | x floor | cuBLASLt ms | x floor |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['gemm']} | {r['n']} x {r['k']} | {r['batch']} | {r['floor_ms']} | {r['cublas_ms']} | "
            f"{r['cublas_x_floor']} | {r['cublaslt_ms']} | {r['cublaslt_x_floor']} |"
        )
    for batch in (1, 8, 64):
        sel = [r for r in rows if r["batch"] == batch]
        lines.append(
            f"| all | | {batch} | {sum(r['floor_ms'] for r in sel):.4f} | {sum(r['cublas_ms'] for r in sel):.4f} | "
            f"| {sum(r['cublaslt_ms'] for r in sel):.4f} | |"
        )
    table = "\n".join(lines)
    print(table)
    write_results(
        args.out,
        {"device": torch.cuda.get_device_name(), "copy_bandwidth_GBps": round(bw / 1e9, 1), "rows": rows},
        table,
    )


if __name__ == "__main__":
    main()
