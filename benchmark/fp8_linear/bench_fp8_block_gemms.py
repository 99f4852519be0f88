"""Qwen3-8B's projections in bf16 vs block-scaled fp8 (a native FP8 checkpoint's format), decode to prefill sizes.

    python3 benchmark/fp8_linear/bench_fp8_block_gemms.py [--rows 1 8 64 256 2048 8192] [--out DIR]   # GPU machine
    python benchmark/fp8_linear/bench_fp8_block_gemms.py --dry-run    # CPU: tiny shapes, the triton interpreter

For each projection (qkv, o, gate_up, down) and row count M it captures 36 calls on 36 distinct weights (as the
36 layers are, so nothing is served from L2) in a CUDA graph and times the replay:
  bf16          F.linear (cuBLAS), what the engine runs for a bf16 checkpoint;
  engine        what the engine runs for a block-fp8 checkpoint (fp8_block_kernels.block_fp8_linear_gpu): the
                cuBLAS path below where this GPU and the shape allow it, else the triton path;
  triton        activations quantized per token and 128-column group (one triton kernel), then the triton
                block-scaled GEMM; "gemm alone" is that GEMM on pre-quantized activations, "quantize alone" the
                quantization kernel alone (both paths run it before their GEMM);
  cublas        the same quantization kernel (rows padded, scales column-major), then torch's block-scaled GEMM
                (F.scaled_mm, BlockWise1x128 x BlockWise128x128; cuBLAS on sm90 with CUDA >= 12.9), each output
                checked against the triton GEMM's; "-" where this GPU or torch lacks it;
  skinny        a decode-size candidate not in the engine yet (skinny_block_fp8: bf16 activations, the fp8 weight
                turned into bf16 in registers, each 128-wide K step scaled by its block's scale; no quantization
                kernel), its fastest launch config of SKINNY_CONFIGS at up to 16 rows, each checked against the
                dequantized weight's product first.
Model TFLOP/s (2 M N K per call) and speedup over bf16 for each. The issue's target: at prefill sizes (2,048
and 8,192 rows) the engine's block-fp8 path at >= 1.5x bf16's TFLOP/s. Prints a table, writes JSON + markdown.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from typing import Callable

import torch
import torch.nn.functional as F

if "--dry-run" in sys.argv and not torch.cuda.is_available():
    # The CPU check runs the triton kernels in the interpreter, which must be chosen before any kernel is defined.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402  (after TRITON_INTERPRET is chosen)
import triton.language as tl  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

from sglang.srt.layers.quantization.fp8 import Fp8FusedMoEMethod  # noqa: E402
from sglang.srt.layers.quantization.fp8_block_kernels import (  # noqa: E402
    CUBLAS_K_MULTIPLE,
    GROUP,
    _has_block_scaled_mm,
    block_fp8_gemm,
    block_fp8_linear_gpu,
    cublas_block_fp8_gemm,
    quantize_groups,
)
from sglang.srt.layers.quantization.fp8_block_linear import dequantize_blocks  # noqa: E402
from sglang.test.bench_utils import cuda_graph_ms, write_results  # noqa: E402

# Qwen3-8B: hidden 4096, 32 query and 8 KV heads of 128, intermediate 12288, 36 layers. (N, K) of each weight.
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}
LAYERS = 36
# The CPU dry run: the same code on multiples of 128 small enough for the interpreter.
DRY_SHAPES = {"qkv": (384, 256), "o": (256, 256), "gate_up": (512, 256), "down": (256, 384)}
DRY_LAYERS, DRY_ROWS = 2, [1, 8, 64]
PREFILL_ROWS = 2048  # rows from which a GEMM counts as prefill-sized (the 1.5x target)
MISMATCH_TOL = 2e-2  # relative error of cuBLAS's output vs the triton GEMM's above which a layout is misread

Weight = tuple[torch.Tensor, torch.Tensor]  # fp8 [N, K], scale_inv [N/128, K/128], as the checkpoint stores them
# The skinny candidate below: rows it is timed at, and its launch grid (columns per program, K splits, warps, stages).
SKINNY_MAX_ROWS = 16
SKINNY_CONFIGS = [(n, s, w, st) for n in (32, 64, 128) for s in (1, 2, 4, 8) for w, st in ((4, 3), (4, 5))]
DRY_SKINNY_CONFIGS = [(32, 2, 4, 1)]
SKINNY_TOL = 1e-2  # relative error against the product of the dequantized weight (no activation quantization)


@triton.jit
def _skinny_block_fp8_kernel(
    x_ptr,
    w_ptr,
    ws_ptr,
    partial_ptr,
    M,
    N,
    stride_xm,
    stride_wn,
    stride_wsn,
    K: tl.constexpr,  # static loop bounds (the interpreter needs them; the GPU pipelines the fixed trip count)
    KB_PER_SPLIT: tl.constexpr,
    GROUP_C: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, GROUP_C)
    n_mask = offs_n < N
    m_mask = offs_m < M
    # [N, M]: the weight tile is the MMA's left operand, so the few rows of x ride along padded to 16.
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for i in range(KB_PER_SPLIT):
        kb = pid_k * KB_PER_SPLIT + i
        cols = kb * GROUP_C + offs_k
        k_mask = cols < K
        w = tl.load(
            w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + cols[None, :],
            mask=n_mask[:, None] & k_mask[None, :],
            other=0.0,
        )
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + cols[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0
        )
        scale = tl.load(ws_ptr + (offs_n // GROUP_C) * stride_wsn + kb, mask=n_mask & (kb * GROUP_C < K), other=0.0)
        acc += tl.dot(w.to(x.dtype), tl.trans(x)) * scale[:, None]
    out = partial_ptr + pid_k * M * N + offs_m[None, :] * N + offs_n[:, None]
    tl.store(out, acc, mask=n_mask[:, None] & m_mask[None, :])


def skinny_block_fp8(x: torch.Tensor, qw: torch.Tensor, sw: torch.Tensor, config: tuple) -> torch.Tensor:
    """A decode-size candidate, not in the engine yet: x (bf16, unquantized) @ the block-fp8 weight, the weight's e4m3
    codes turned into x's dtype in registers (exact) and each 128-wide K step's dot times its block's scale, so no
    activation quantization kernel runs and each weight byte is read once. BLOCK_N columns a program; K split over
    `splits` programs whose fp32 partial sums add in a fixed order."""
    block_n, splits, warps, stages = config
    m, k = x.shape
    n = qw.shape[0]
    k_blocks = triton.cdiv(k, GROUP)
    per_split = triton.cdiv(k_blocks, splits)
    partial = torch.empty(splits, m, n, device=x.device, dtype=torch.float32)
    extra = {"num_warps": warps, "num_stages": stages} if x.is_cuda else {}
    _skinny_block_fp8_kernel[(triton.cdiv(n, block_n), splits)](
        x, qw, sw, partial, m, n, x.stride(0), qw.stride(0), sw.stride(0),
        K=k, KB_PER_SPLIT=per_split, GROUP_C=GROUP, BLOCK_M=max(16, triton.next_power_of_2(m)), BLOCK_N=block_n,
        **extra,
    )  # fmt: skip
    return partial.sum(0).to(x.dtype)


def quantize_weight(w: torch.Tensor) -> Weight:
    """A checkpoint's block-fp8 weight (as --load-format dummy makes it)."""
    return Fp8FusedMoEMethod().quantize(w)


def _bf16(x: torch.Tensor, weights: list[torch.Tensor]) -> None:
    for w in weights:
        F.linear(x, w)


def _engine(x: torch.Tensor, quantized: list[Weight]) -> None:
    for qw, sw in quantized:
        block_fp8_linear_gpu(x, qw, sw, None)


def _triton(x: torch.Tensor, quantized: list[Weight]) -> None:
    for qw, sw in quantized:  # one quantization per call, as each layer does
        qx, sx = quantize_groups(x)
        block_fp8_gemm(qx, sx, qw, sw, None, torch.bfloat16)


def _quantize_alone(x: torch.Tensor, calls: int) -> None:
    for _ in range(calls):
        quantize_groups(x)


def _gemm_alone(qx: torch.Tensor, sx: torch.Tensor, quantized: list[Weight]) -> None:
    for qw, sw in quantized:
        block_fp8_gemm(qx, sx, qw, sw, None, torch.bfloat16)


def _cublas(x: torch.Tensor, quantized: list[Weight]) -> None:
    for qw, sw in quantized:
        cublas_block_fp8_gemm(x, qw, sw, None)


def _skinny(x: torch.Tensor, quantized: list[Weight], config: tuple) -> None:
    for qw, sw in quantized:
        skinny_block_fp8(x, qw, sw, config)


def best_skinny(x: torch.Tensor, quantized: list[Weight], configs: list[tuple], replays: int) -> tuple[float, str]:
    """(ms, config label) of the fastest skinny config, each checked against the dequantized product first."""
    qw, sw = quantized[0]
    if not x.is_cuda:  # the interpreter's bf16 dots are wrong (numpy has no bf16); fp32 checks the same code
        x = x.float()
    exact = x.float() @ dequantize_blocks(qw, sw).t()
    best = (float("inf"), "")
    for cfg in configs:
        got = skinny_block_fp8(x, qw, sw, cfg).float()
        err = ((got - exact).norm() / exact.norm().clamp(min=1e-30)).item()
        if err > SKINNY_TOL:
            raise AssertionError(f"skinny candidate {cfg} on {tuple(qw.shape)} at {x.shape[0]} rows: {err:.3g} off")
        ms = time_ms(functools.partial(_skinny, x, quantized, cfg), replays)
        best = min(best, (ms, "n{}s{}w{}st{}".format(*cfg)))
    return best


def time_ms(step: Callable[[], None], replays: int) -> float:
    """One CUDA graph's replay on the GPU (launch gaps included, as the engine's decode step); wall time per call
    on the CPU (the dry run: only that the code runs)."""
    if torch.cuda.is_available():
        return cuda_graph_ms(step, replays=replays)
    step()
    t = time.perf_counter()
    step()
    return (time.perf_counter() - t) * 1000


def cublas_note(x: torch.Tensor, quantized: list[Weight]) -> str:
    """ "" where cuBLAS's block-scaled GEMM runs this shape and agrees with the triton GEMM; else why not (a
    disagreement fails the run: it would mean the engine's cuBLAS branch misreads a layout)."""
    qw, sw = quantized[0]
    if not _has_block_scaled_mm(x.device):
        return "cuBLAS block scaling unavailable here"
    if qw.shape[0] % GROUP or qw.shape[1] % CUBLAS_K_MULTIPLE:
        return "shape not taken"
    qx, sx = quantize_groups(x)
    want = block_fp8_gemm(qx, sx, qw, sw, None, torch.bfloat16).float()
    got = cublas_block_fp8_gemm(x, qw, sw, None).float()
    err = ((got - want).norm() / want.norm().clamp(min=1e-30)).item()
    if err > MISMATCH_TOL:
        raise AssertionError(f"cuBLAS block GEMM {tuple(qw.shape)} at {x.shape[0]} rows: {err:.3g} off triton's")
    return ""


def time_shape(n: int, k: int, rows: list[int], layers: int, device: str, skinny_configs: list[tuple]) -> list[dict]:
    weights = [torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02 for _ in range(layers)]
    quantized = [quantize_weight(w) for w in weights]
    out = []
    for m in rows:
        x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        qx, sx = quantize_groups(x)
        flop = 2 * layers * m * n * k
        note = cublas_note(x, quantized)
        steps = {
            "bf16": functools.partial(_bf16, x, weights),
            "engine": functools.partial(_engine, x, quantized),
            "triton": functools.partial(_triton, x, quantized),
            "gemm_alone": functools.partial(_gemm_alone, qx, sx, quantized),
            "quantize_alone": functools.partial(_quantize_alone, x, layers),
        }
        if not note:
            steps["cublas"] = functools.partial(_cublas, x, quantized)
        row = {"n": n, "k": k, "rows": m, "calls": layers, "cublas_note": note}
        for name, fn in steps.items():
            ms = time_ms(fn, replays=10 if m >= PREFILL_ROWS else 20)
            row[f"{name}_ms"] = ms
            row[f"{name}_tflops"] = flop / ms / 1e9
        if m <= SKINNY_MAX_ROWS:
            row["skinny_ms"], row["skinny_config"] = best_skinny(x, quantized, skinny_configs, replays=20)
        out.append(row)
    return out


def _fmt(r: dict, key: str, spec: str = ".3f") -> str:
    return "-" if r.get(key) is None else format(r[key], spec)


def table(results: list[dict], rows: list[int], header: str) -> str:
    lines = [
        header,
        "",
        "| gemm | rows | bf16 ms | TFLOP/s | engine fp8 ms | TFLOP/s | engine speedup | triton ms | gemm alone ms "
        "| quantize alone ms | cublas ms | TFLOP/s | skinny ms | skinny config | note |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['gemm']} | {r['rows']} | {r['bf16_ms']:.3f} | {r['bf16_tflops']:.0f} | {r['engine_ms']:.3f} | "
            f"{r['engine_tflops']:.0f} | {r['bf16_ms'] / r['engine_ms']:.2f} | {r['triton_ms']:.3f} | "
            f"{r['gemm_alone_ms']:.3f} | {r['quantize_alone_ms']:.3f} | {_fmt(r, 'cublas_ms')} | {_fmt(r, 'cublas_tflops', '.0f')} | "
            f"{_fmt(r, 'skinny_ms')} | {r.get('skinny_config', '')} | {r['cublas_note']} |"
        )
    for m in rows:
        sel = [r for r in results if r["rows"] == m]
        total = {key: sum(r[f"{key}_ms"] for r in sel) for key in ("bf16", "engine", "triton")}
        flop = sum(r["bf16_tflops"] * r["bf16_ms"] for r in sel)  # TFLOP/s x ms: the same work for every path
        cublas = [r.get("cublas_ms") for r in sel]
        cublas_ms = f"{sum(cublas):.3f}" if None not in cublas else "-"
        cublas_tf = f"{flop / sum(cublas):.0f}" if None not in cublas else "-"
        skinny = [r.get("skinny_ms") for r in sel]
        skinny_ms = f"{sum(skinny):.3f}" if None not in skinny else "-"
        lines.append(
            f"| all four | {m} | {total['bf16']:.3f} | {flop / total['bf16']:.0f} | {total['engine']:.3f} | "
            f"{flop / total['engine']:.0f} | {total['bf16'] / total['engine']:.2f} | {total['triton']:.3f} | | | "
            f"{cublas_ms} | {cublas_tf} | {skinny_ms} | | |"
        )
    return "\n".join(lines)


def prefill_verdict(results: list[dict]) -> dict:
    """The issue's target at prefill sizes: the engine's block-fp8 TFLOP/s over bf16's, all four projections."""
    verdict = {}
    for m in sorted({r["rows"] for r in results if r["rows"] >= PREFILL_ROWS}):
        sel = [r for r in results if r["rows"] == m]
        speedup = sum(r["bf16_ms"] for r in sel) / sum(r["engine_ms"] for r in sel)
        verdict[m] = {"engine_over_bf16_tflops": round(speedup, 3), "meets_1_5x": speedup >= 1.5}
    return verdict


def report(results: list[dict], rows: list[int], header: str) -> str:
    """The table, then the prefill target's verdict (the four projections' rows measured so far)."""
    done = [m for m in rows if any(r["rows"] == m for r in results)]
    text = table(results, done, header)
    verdict = prefill_verdict(results)
    if verdict:
        text += "\n\nPrefill target (engine block-fp8 >= 1.5x bf16 TFLOP/s, all four): " + ", ".join(
            f"{m} rows {v['engine_over_bf16_tflops']:.2f}x ({'met' if v['meets_1_5x'] else 'not met'})"
            for m, v in verdict.items()
        )
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64, 256, 2048, 8192])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "block_gemms"))
    parser.add_argument("--dry-run", action="store_true", help="CPU check: tiny shapes, the triton interpreter")
    args = parser.parse_args()
    shapes, layers, device = SHAPES, LAYERS, "cuda"
    if args.dry_run:
        shapes, layers, args.rows = DRY_SHAPES, DRY_LAYERS, DRY_ROWS
        device = "cuda" if torch.cuda.is_available() else "cpu"
    elif not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (--dry-run checks the script on the CPU)")
    gpu = torch.cuda.get_device_name() if device == "cuda" else "CPU (dry run)"
    header = (
        f"{'Qwen3-8B' if not args.dry_run else 'Tiny'} projections, {layers} distinct weights each, one CUDA graph; "
        f"{gpu}, torch {torch.__version__}; speedup = bf16 ms / engine ms (= the TFLOP/s ratio)"
    )
    results = []
    for name, (n, k) in shapes.items():
        skinny_configs = DRY_SKINNY_CONFIGS if args.dry_run else SKINNY_CONFIGS
        results += [{"gemm": name, **r} for r in time_shape(n, k, args.rows, layers, device, skinny_configs)]
        if device == "cuda":
            torch.cuda.empty_cache()
        # Written after every projection: a run cut short keeps what it measured.
        text = report(results, args.rows, header)
        data = {"device": gpu, "torch": torch.__version__, "layers": layers, "results": results}
        write_results(args.out, {**data, "prefill": prefill_verdict(results)}, text)
    print(text)
    print("results in", args.out)


if __name__ == "__main__":
    main()
