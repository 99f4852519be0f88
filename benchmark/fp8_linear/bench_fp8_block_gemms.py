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
  handed over   the engine's path on an activation handed over quantized (BlockFp8Activation, in the layout its
                branch takes), as the model runs qkv, gate_up and down: the RMSNorm before the first two and the
                SiLU-and-mul before down write their output quantized (o_proj's input, the attention output, is
                quantized by the kernel above).
Model TFLOP/s (2 M N K per call) and speedup over bf16 for each. The issue's target: at prefill sizes (2,048
and 8,192 rows) the engine's block-fp8 path at >= 1.5x bf16's TFLOP/s, all four projections; given twice: with
every projection quantizing its own input, and as the model runs them (three handed over, o_proj quantizing its
own) plus what handing over adds to the producers: the RMSNorm (x2) and SiLU-and-mul kernels writing quantized
output against the same kernels writing bf16 ("producers" rows, 36 calls each). Prints a table, writes JSON +
markdown.
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

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

from sglang.srt.layers import fused_elementwise  # noqa: E402
from sglang.srt.layers.decode_gemm import CUBLAS_ONLY  # noqa: E402
from sglang.srt.layers.quantization.fp8 import Fp8FusedMoEMethod  # noqa: E402
from sglang.srt.layers.quantization.fp8_block_kernels import (  # noqa: E402
    CUBLAS_K_MULTIPLE,
    GROUP,
    _has_block_scaled_mm,
    block_fp8_gemm,
    block_fp8_linear_gpu,
    cublas_block_fp8_gemm,
    input_layout,
    quantize_groups,
)
from sglang.srt.layers.quantization.fp8_block_linear import quantize_activation  # noqa: E402
from sglang.test.bench_utils import cuda_graph_ms, write_results  # noqa: E402

# Qwen3-8B: hidden 4096, 32 query and 8 KV heads of 128, intermediate 12288, 36 layers. (N, K) of each weight.
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}
HANDED_OVER = ("qkv", "gate_up", "down")  # the projections whose input the kernel before them quantizes
LAYERS = 36
# The CPU dry run: the same code on multiples of 128 small enough for the interpreter.
DRY_SHAPES = {"qkv": (384, 256), "o": (256, 256), "gate_up": (512, 256), "down": (256, 384)}
DRY_LAYERS, DRY_ROWS = 2, [1, 8, 64]
PREFILL_ROWS = 2048  # rows from which a GEMM counts as prefill-sized (the issue's 1.5x target)
MISMATCH_TOL = 2e-2  # relative error of cuBLAS's output vs the triton GEMM's above which a layout is misread

Weight = tuple[torch.Tensor, torch.Tensor]  # fp8 [N, K], scale_inv [N/128, K/128], as the checkpoint stores them


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


def _handed_over(qa, quantized: list[Weight]) -> None:
    for qw, sw in quantized:
        block_fp8_linear_gpu(qa, qw, sw, None)


def _norms(x: torch.Tensor, weight: torch.Tensor, calls: int, quantize) -> None:
    for _ in range(calls):
        fused_elementwise.rmsnorm(x, weight, 1e-6, quantize=quantize)


def _silu(x: torch.Tensor, calls: int, quantize) -> None:
    for _ in range(calls):
        fused_elementwise.silu_and_mul(x, quantize=quantize)


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


def time_shape(n: int, k: int, rows: list[int], layers: int, device: str) -> list[dict]:
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
        qa = quantize_activation(x, input_layout(quantized[0][0], CUBLAS_ONLY, m, x.dtype))
        steps["handed_over"] = functools.partial(_handed_over, qa, quantized)
        row = {"n": n, "k": k, "rows": m, "calls": layers, "cublas_note": note}
        for name, fn in steps.items():
            ms = time_ms(fn, replays=10 if m >= PREFILL_ROWS else 20)
            row[f"{name}_ms"] = ms
            row[f"{name}_tflops"] = flop / ms / 1e9
        out.append(row)
    return out


def time_producers(hidden: int, intermediate: int, rows: list[int], layers: int, device: str) -> list[dict]:
    """The kernels that hand the projections their input: RMSNorm [M, hidden] (twice a layer) and SiLU-and-mul
    [M, 2 x intermediate], writing bf16 or quantized in the layout of the GEMM branch for M rows."""
    out = []
    weight = torch.rand(hidden, device=device, dtype=torch.bfloat16) + 0.5
    probe = torch.empty(GROUP, CUBLAS_K_MULTIPLE, device=device, dtype=torch.float8_e4m3fn)  # a shape cuBLAS takes
    for m in rows:
        layout = input_layout(probe, CUBLAS_ONLY, m, torch.bfloat16)
        x = torch.randn(m, hidden, device=device, dtype=torch.bfloat16)
        h = torch.randn(m, 2 * intermediate, device=device, dtype=torch.bfloat16)
        row = {"rows": m, "calls": layers, "layout": "cuBLAS's" if layout.column_major_scales else "row-major"}
        for name, fn in {
            "norm_bf16": functools.partial(_norms, x, weight, 2 * layers, None),
            "norm_quantized": functools.partial(_norms, x, weight, 2 * layers, layout),
            "silu_bf16": functools.partial(_silu, h, layers, None),
            "silu_quantized": functools.partial(_silu, h, layers, layout),
        }.items():
            row[f"{name}_ms"] = time_ms(fn, replays=10 if m >= PREFILL_ROWS else 20)
        row["extra_ms"] = (
            row["norm_quantized_ms"] + row["silu_quantized_ms"] - row["norm_bf16_ms"] - row["silu_bf16_ms"]
        )
        out.append(row)
    return out


def model_path_ms(results: list[dict], producers: list[dict], m: int) -> float:
    """The four projections as the model runs them at M rows: qkv, gate_up and down handed over, o quantizing its
    own input, plus what handing over adds to the producers."""
    sel = {r["gemm"]: r for r in results if r["rows"] == m}
    extra = next(p["extra_ms"] for p in producers if p["rows"] == m)
    return sum(r["handed_over_ms"] if name in HANDED_OVER else r["engine_ms"] for name, r in sel.items()) + extra


def _fmt(r: dict, key: str, spec: str = ".3f") -> str:
    return "-" if r.get(key) is None else format(r[key], spec)


def table(results: list[dict], producers: list[dict], rows: list[int], header: str) -> str:
    lines = [
        header,
        "",
        "| gemm | rows | bf16 ms | TFLOP/s | engine fp8 ms | TFLOP/s | engine speedup | handed over ms | triton ms "
        "| gemm alone ms | quantize alone ms | cublas ms | TFLOP/s | note |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['gemm']} | {r['rows']} | {r['bf16_ms']:.3f} | {r['bf16_tflops']:.0f} | {r['engine_ms']:.3f} | "
            f"{r['engine_tflops']:.0f} | {r['bf16_ms'] / r['engine_ms']:.2f} | {r['handed_over_ms']:.3f} | "
            f"{r['triton_ms']:.3f} | {r['gemm_alone_ms']:.3f} | {r['quantize_alone_ms']:.3f} | {_fmt(r, 'cublas_ms')} | "
            f"{_fmt(r, 'cublas_tflops', '.0f')} | {r['cublas_note']} |"
        )
    for m in rows:
        sel = [r for r in results if r["rows"] == m]
        total = {key: sum(r[f"{key}_ms"] for r in sel) for key in ("bf16", "engine", "triton")}
        flop = sum(r["bf16_tflops"] * r["bf16_ms"] for r in sel)  # TFLOP/s x ms: the same work for every path
        cublas = [r.get("cublas_ms") for r in sel]
        cublas_ms = f"{sum(cublas):.3f}" if None not in cublas else "-"
        cublas_tf = f"{flop / sum(cublas):.0f}" if None not in cublas else "-"
        lines.append(
            f"| all four | {m} | {total['bf16']:.3f} | {flop / total['bf16']:.0f} | {total['engine']:.3f} | "
            f"{flop / total['engine']:.0f} | {total['bf16'] / total['engine']:.2f} | | {total['triton']:.3f} | | | "
            f"{cublas_ms} | {cublas_tf} | |"
        )
        if len(sel) == len(SHAPES) and any(p["rows"] == m for p in producers):
            model = model_path_ms(results, producers, m)
            lines.append(
                f"| as the model runs them | {m} | {total['bf16']:.3f} | {flop / total['bf16']:.0f} | {model:.3f} | "
                f"{flop / model:.0f} | {total['bf16'] / model:.2f} | | | | | | | qkv, gate_up, down handed over; "
                "o quantizes; producers' extra included |"
            )
    if producers:
        lines += [
            "",
            f"The producers ({producers[0]['calls']} layers: RMSNorm x {2 * producers[0]['calls']} calls [M, hidden], "
            f"SiLU-and-mul x {producers[0]['calls']} [M, 2 x intermediate]), ms; extra = quantized - bf16, both:",
            "",
            "| rows | layout | norm bf16 | norm quantized | silu bf16 | silu quantized | extra |",
            "|---:|---|---:|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {p['rows']} | {p['layout']} | {p['norm_bf16_ms']:.3f} | {p['norm_quantized_ms']:.3f} | "
            f"{p['silu_bf16_ms']:.3f} | {p['silu_quantized_ms']:.3f} | {p['extra_ms']:.3f} |"
            for p in producers
        ]
    return "\n".join(lines)


def prefill_verdict(results: list[dict], producers: list[dict]) -> dict:
    """The issue's target at prefill sizes: block-fp8 TFLOP/s over bf16's, all four projections, each quantizing its
    own input ("engine") and as the model runs them ("model", where the producers were measured)."""
    verdict = {}
    for m in sorted({r["rows"] for r in results if r["rows"] >= PREFILL_ROWS}):
        sel = [r for r in results if r["rows"] == m]
        bf16 = sum(r["bf16_ms"] for r in sel)
        speedup = bf16 / sum(r["engine_ms"] for r in sel)
        verdict[m] = {"engine_over_bf16_tflops": round(speedup, 3), "meets_1_5x": speedup >= 1.5}
        if len(sel) == len(SHAPES) and any(p["rows"] == m for p in producers):
            model = bf16 / model_path_ms(results, producers, m)
            verdict[m].update(model_over_bf16_tflops=round(model, 3), model_meets_1_5x=model >= 1.5)
    return verdict


def report(results: list[dict], producers: list[dict], rows: list[int], header: str) -> str:
    """The table, then the prefill target's verdict (the four projections' rows measured so far)."""
    done = [m for m in rows if any(r["rows"] == m for r in results)]
    text = table(results, producers, done, header)
    verdict = prefill_verdict(results, producers)
    if verdict:
        text += "\n\nPrefill target (block-fp8 >= 1.5x bf16 TFLOP/s, all four): " + ", ".join(
            f"{m} rows {v['engine_over_bf16_tflops']:.2f}x each quantizing its input ({_met(v['meets_1_5x'])})"
            + (
                f", {v['model_over_bf16_tflops']:.2f}x as the model runs them ({_met(v['model_meets_1_5x'])})"
                if "model_over_bf16_tflops" in v
                else ""
            )
            for m, v in verdict.items()
        )
    return text


def _met(ok: bool) -> str:
    return "met" if ok else "not met"


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
    results, producers = [], []
    for name, (n, k) in [*shapes.items(), ("producers", (0, 0))]:
        if name == "producers":  # hidden = o's N, intermediate = down's K
            producers = time_producers(shapes["o"][0], shapes["down"][1], args.rows, layers, device)
        else:
            results += [{"gemm": name, **r} for r in time_shape(n, k, args.rows, layers, device)]
        if device == "cuda":
            torch.cuda.empty_cache()
        # Written after every step: a run cut short keeps what it measured.
        text = report(results, producers, args.rows, header)
        data = {"device": gpu, "torch": torch.__version__, "layers": layers, "results": results}
        write_results(args.out, {**data, "producers": producers, "prefill": prefill_verdict(results, producers)}, text)
    print(text)
    print("results in", args.out)


if __name__ == "__main__":
    main()
