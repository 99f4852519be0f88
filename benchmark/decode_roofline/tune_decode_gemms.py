"""Tune the skinny decode GEMM (``srt/layers/decode_gemm``) against cuBLAS and write the device's table.

    python benchmark/decode_roofline/tune_decode_gemms.py [--model Llama-3.1-8B] [--tp-size 1]
        [--batches 1 4 8 16 32 64] [--fp8 | --fp8-block] [--silu] [--only NAME ...] [--out DIR] [--table FILE]

For each projection of the model (qkv, o and, dense models, gate_up and down; MLA models their query, latent KV,
o, dense and shared-expert MLP projections; the shapes one tensor-parallel rank holds: ``decode_gemm/shapes.py``) and batch size it times, as one CUDA graph
over 32 distinct weights (the 32 layers; nothing is served from L2): cuBLAS (torch's default) and every
skinny-kernel tile config of the sweep (split-K 1 first, then split-K 1 / 2 / 4 / 8, each with and without
programmatic dependent launch, for the four best tiles and the best tile of each BLOCK_N: a wide tile has few
programs, so it only pays with split-K and would never make the four best at split 1). Each projection runs after an RMSNorm that
writes its input, as in the model (with PDL the GEMM may start while the norm drains); the norms alone
are timed too and subtracted.
Every config's output is checked against ``F.linear``; a config that fails to compile or to match is
skipped and counted. The fastest skinny config goes into the table where it beats cuBLAS by more than
``--margin`` (else the entry is ``null``: cuBLAS). With ``--fp8`` the weights are quantized as
``--quantization fp8`` stores them, both sides quantize the activation per token first (one kernel), and
the skinny kernel on fp8 operands competes with ``torch._scaled_mm``; the entries go under ``N x K:fp8``
(default output dir ``gemm_tuning_fp8``). With ``--silu`` it tunes only the gate_up projection with SiLU-and-mul
in the kernel's epilogue (split-K 1: the activation needs whole sums) against what the engine runs without it,
the table's gate_up plan followed by the activation kernel; entries ``N x K:silu`` / ``N x K:fp8:silu``
(output dir ``gemm_tuning_silu`` / ``gemm_tuning_fp8_silu``). With ``--fp8-block`` the weights are a block-fp8
checkpoint's (e4m3, a scale per 128x128 block), both sides quantize the activation per token and 128-column group
(one kernel) and the skinny kernel (BLOCK_K 128: one scale block a K step) competes with cuBLAS's block-scaled GEMM
(``F.scaled_mm``); entries ``N x K:fp8block`` (output dir ``gemm_tuning_fp8_block``). Updates this GPU's table (in $SGLANG_DECODE_GEMM_CONFIG_DIR
if set, else the package's ``configs/``; other shapes in it stay) that the engine reads at load time, writes a
table + JSON of the measurements to ``--out``, and prints the table. ``--only`` tunes the named projections alone
(names of ``decode_gemm/shapes.py``, e.g. ``q_kv_a``: one changed shape, without the device time of the others).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time

import torch
from bench_decode_gemms import LAYERS
from bench_decode_roofline import ROOT, copy_bandwidth

from sglang.srt.environ import envs
from sglang.srt.layers.activation import silu_and_mul
from sglang.srt.layers.decode_gemm import CUBLAS_ONLY, GemmPlan, linear, parse_table, plan_for_shape
from sglang.srt.layers.decode_gemm.kernel import skinny_linear
from sglang.srt.layers.decode_gemm.shapes import projection_shapes
from sglang.srt.layers.decode_gemm.table import GemmConfig, device_table_path, shape_key, update_table_file
from sglang.srt.layers.fused_elementwise import rmsnorm
from sglang.srt.layers.quantization.fp8 import Fp8FusedMoEMethod
from sglang.srt.layers.quantization.fp8_block_kernels import block_fp8_linear_gpu
from sglang.srt.layers.quantization.fp8_linear import fp8_linear, fp8_linear_silu_and_mul, quantize_rows
from sglang.test.bench_utils import cuda_graph_ms, write_results


def block_m_for(batch: int) -> int:
    return min(64, max(16, 1 << (batch - 1).bit_length()))


def tile_sweep(batch: int, fp8: bool = False, silu: bool = False, block_fp8: bool = False) -> list[GemmConfig]:
    """Split-K 1 tiles for this batch's row block; shared memory bounded by what the H200 gives a block.
    fp8 tiles are half the bytes, so they go one K step deeper; BLOCK_N >= 64 keeps them on fp8 wgmma.
    silu: each stage holds a gate and an up tile, so BLOCK_N (per half) goes one step narrower. block_fp8: one
    scale block a K step (BLOCK_K 128), so more stages keep the same bytes in flight."""
    block_m = block_m_for(batch)
    block_ks = (128, 256, 512) if block_m == 16 else (64, 128, 256)
    stages = (4, 6) if block_m == 16 else (3, 5)
    block_ns = (16, 32, 64) if silu else (32, 64, 128, 256)
    if fp8:
        block_ks, block_ns = tuple(2 * k for k in block_ks), (64, 128)
    if block_fp8:
        block_ks, block_ns, stages = (128,), (32, 64, 128), (4, 6, 8) if block_m == 16 else (3, 5, 7)
    fp8 = fp8 or block_fp8
    elem_bytes = 1 if fp8 else 2
    weight_tiles = 2 if silu else 1
    configs = []
    for block_n, block_k, warps, num_stages in itertools.product(block_ns, block_ks, (4, 8), stages):
        if num_stages * (weight_tiles * block_n + block_m) * block_k * elem_bytes > 220 * 1024:
            continue
        configs.append(GemmConfig(block_m, block_n, block_k, warps, num_stages))
    return configs


class LayerChain:
    """What runs before each projection in the model: an RMSNorm writes its input (and, with PDL, releases
    it early). Timed with the norms, reported without them (the norms alone are timed once)."""

    def __init__(
        self,
        weights,
        batch: int,
        fp8: bool = False,
        silu: bool = False,
        plan: GemmPlan = CUBLAS_ONLY,
        block_fp8: bool = False,
    ) -> None:
        """fp8: ``weights`` are ``quantize_rows`` pairs and every GEMM is ``fp8_linear`` (activation
        quantization included); its reference is the product of the dequantized operands. block_fp8: ``weights``
        are (e4m3, 128x128 block scales) pairs and every GEMM is ``block_fp8_linear_gpu`` (the per-group
        activation quantization included; CUBLAS_ONLY: cuBLAS's block-scaled GEMM). silu: the GEMM's result goes
        through SiLU-and-mul. plan: the baseline's (the engine's path without the candidate)."""
        self.fp8, self.silu, self.plan, self.block_fp8 = fp8, silu, plan, block_fp8
        self.weights = weights
        k = (weights[0][0] if fp8 or block_fp8 else weights[0]).shape[1]
        self.src = torch.randn(batch, k, device="cuda", dtype=torch.bfloat16)
        self.norm_weight = torch.rand(k, device="cuda", dtype=torch.bfloat16) + 0.5
        self.x = torch.empty_like(self.src)
        self.norms_ms = cuda_graph_ms(lambda: self.run(lambda x, w: None))

    def run(self, gemm) -> None:
        for w in self.weights:
            rmsnorm(self.src, self.norm_weight, 1e-6, out=self.x)
            gemm(self.x, w)

    def gemm_ms(self, gemm) -> float:
        return cuda_graph_ms(lambda: self.run(gemm)) - self.norms_ms

    def baseline(self, x, w, plan: GemmPlan | None = None) -> torch.Tensor:
        """The GEMM as ``plan`` (default: the chain's) runs it, then SiLU-and-mul if the chain has it."""
        plan = self.plan if plan is None else plan
        # CUBLAS_ONLY: cuBLAS's block-scaled GEMM (block fp8) / torch._scaled_mm (fp8) / F.linear
        if self.block_fp8:
            return block_fp8_linear_gpu(x, *w, None, plan)
        y = fp8_linear(x, *w, None, plan) if self.fp8 else linear(x, w, None, plan)
        return silu_and_mul(y) if self.silu else y

    def skinny(self, config: GemmConfig):
        if self.block_fp8:
            plan = GemmPlan(((self.src.shape[0], config),))
            return lambda x, w: block_fp8_linear_gpu(x, *w, None, plan)
        if self.fp8:
            plan = GemmPlan(((self.src.shape[0], config),))
            if self.silu:
                return lambda x, w: fp8_linear_silu_and_mul(x, *w, None, plan)
            return lambda x, w: fp8_linear(x, *w, None, plan)
        return lambda x, w: skinny_linear(x, w, None, config, silu_and_mul=self.silu)

    def matches(self, config: GemmConfig) -> bool:
        ref = self.baseline(self.src, self.weights[0], CUBLAS_ONLY).float()
        out = self.skinny(config)(self.src, self.weights[0]).float()
        return bool((out - ref).abs().max() <= 0.02 * ref.abs().max() + 1e-3)


def tune_one(
    weights, batch: int, margin: float, fp8: bool = False, silu: bool = False, plan=CUBLAS_ONLY, block_fp8=False
) -> dict:
    """The fastest skinny config for this batch against the baseline (``plan``'s GEMM, cuBLAS by default;
    with ``silu`` followed by the activation kernel); keys ``cublas_*`` name the baseline."""
    chain = LayerChain(weights, batch, fp8, silu, plan, block_fp8)
    cublas_ms = chain.gemm_ms(chain.baseline)
    timed, skipped = [], 0

    def try_config(config: GemmConfig) -> None:
        nonlocal skipped
        try:
            if not chain.matches(config):
                skipped += 1
                return
            timed.append((chain.gemm_ms(chain.skinny(config)), config))
        except Exception:  # out of shared memory / registers for this tile: not a candidate
            skipped += 1

    for config in tile_sweep(batch, fp8, silu, block_fp8):
        try_config(config)
    ranked = [c for _, c in sorted(timed, key=lambda t: t[0])]
    best_tiles = ranked[:4]
    for block_n in sorted({c.block_n for c in ranked}):  # each width's best: wide tiles need split-K to fill the GPU
        best_of_width = next(c for c in ranked if c.block_n == block_n)
        if best_of_width not in best_tiles:
            best_tiles.append(best_of_width)
    for config, split_k, pdl in itertools.product(best_tiles, (1,) if silu else (1, 2, 4, 8), (False, True)):
        if split_k > 1 or pdl:
            try_config(GemmConfig(**{**config.to_json(), "split_k": split_k, "pdl": pdl}))
    timed.sort(key=lambda t: t[0])
    best_ms, best = timed[0] if timed else (float("inf"), None)
    chosen = best if best is not None and best_ms < cublas_ms * (1 - margin) else None
    return {
        "batch": batch,
        "norms_ms": round(chain.norms_ms, 4),
        "cublas_ms": round(cublas_ms, 4),
        "best_skinny_ms": round(best_ms, 4),
        "best_skinny_config": best.to_json() if best else None,
        "chosen": "skinny" if chosen else "cublas",
        "chosen_ms": round(best_ms if chosen else cublas_ms, 4),
        "candidates_timed": len(timed),
        "candidates_skipped": skipped,
        "top5": [{"ms": round(ms, 4), **c.to_json()} for ms, c in timed[:5]],
    }


def weights_kind(args) -> str:
    if args.fp8_block:
        return "block-fp8 weights, per-group activation quantization included"
    return "fp8 weights, per-token activation quantization included" if args.fp8 else "bf16"


def model_config(model: str):
    """A model directory, a shape name of scripts/make_model_configs.py, or a Hugging Face id."""
    from transformers import AutoConfig

    from sglang.test.gpu_utils import shape_config_dir

    if os.path.isdir(model):
        return AutoConfig.from_pretrained(model)
    try:
        return AutoConfig.from_pretrained(shape_config_dir(model))
    except KeyError:
        return AutoConfig.from_pretrained(model)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64])
    parser.add_argument("--margin", type=float, default=0.01, help="skinny must beat cuBLAS by this fraction")
    parser.add_argument("--fp8", action="store_true", help="tune fp8 weights (--quantization fp8) against _scaled_mm")
    parser.add_argument(
        "--fp8-block",
        action="store_true",
        help="tune a block-fp8 checkpoint's weights against cuBLAS's block-scaled GEMM",
    )
    parser.add_argument(
        "--silu",
        action="store_true",
        help="tune gate_up with SiLU-and-mul fused, against the table's gate_up + the kernel",
    )
    parser.add_argument("--out", default="", help="default: gemm_tuning/ (bf16) or gemm_tuning_fp8/ beside this file")
    parser.add_argument(
        "--model", default="Llama-3.1-8B", help="a shape name of scripts/make_model_configs.py, or a model dir / HF id"
    )
    parser.add_argument("--tp-size", type=int, default=1, help="tune the shapes one rank has (rank 0's)")
    parser.add_argument("--only", nargs="+", default=[], help="tune these projections alone (shapes.py's names)")
    parser.add_argument(
        "--table",
        default="",
        help="table file to update (default: this GPU's in $SGLANG_DECODE_GEMM_CONFIG_DIR or the package's)",
    )
    args = parser.parse_args()
    if args.fp8_block and (args.fp8 or args.silu):
        parser.error("--fp8-block goes alone (block-fp8 layers have no fused SiLU-and-mul)")
    out_name = "gemm_tuning" + ("_fp8" if args.fp8 else "_fp8_block" if args.fp8_block else "")
    out_name += "_silu" if args.silu else ""
    args.out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), out_name)
    shapes = projection_shapes(model_config(args.model), args.tp_size, block_fp8=args.fp8_block)
    if args.only:
        unknown = sorted(set(args.only) - set(shapes))
        if unknown:
            parser.error(f"--only {' '.join(unknown)}: {args.model}'s projections are {', '.join(shapes)}")
        shapes = {name: nk for name, nk in shapes.items() if name in args.only}
    device = torch.cuda.get_device_name()
    table_path = args.table or device_table_path(device, envs.SGLANG_DECODE_GEMM_CONFIG_DIR.get())
    current_raw = {}  # the table the engine would load now: --silu's baseline; batches not tuned now stay
    if os.path.exists(table_path):
        with open(table_path) as f:
            current_raw = json.load(f)
    current = parse_table(current_raw) if args.silu else {}  # without --silu the baseline is plain cuBLAS
    if args.silu:  # every merged gate/up projection (dense and, MLA models, shared experts; none for MoE's experts)
        shapes = {f"{name}_silu": nk for name, nk in shapes.items() if name.endswith("gate_up")}
    unique = {}  # one entry per weight shape: the table is keyed by shape, so projections of one shape share a plan
    for name, nk in shapes.items():
        if nk not in unique.values():
            unique[name] = nk
    shapes = unique
    bw = copy_bandwidth()
    rows, shapes_table = [], {}
    start = time.perf_counter()
    for name, (n, k) in shapes.items():
        weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(LAYERS)]
        if args.fp8:
            weights = [quantize_rows(w) for w in weights]
        if args.fp8_block:
            weights = [Fp8FusedMoEMethod().quantize(w) for w in weights]
        floor_ms = LAYERS * n * k * (1 if args.fp8 or args.fp8_block else 2) / bw * 1000
        baseline_plan = plan_for_shape(current, n, k, args.fp8)  # CUBLAS_ONLY where `current` has no entry
        key = shape_key(n, k, args.fp8, args.silu, args.fp8_block)
        entries = dict(current_raw.get("shapes", {}).get(key, {}))
        for batch in args.batches:
            row = {
                "gemm": name,
                "n": n,
                "k": k,
                "floor_ms": round(floor_ms, 4),
                **tune_one(weights, batch, args.margin, args.fp8, args.silu, baseline_plan, args.fp8_block),
            }
            rows.append(row)
            entries[str(batch)] = row["best_skinny_config"] if row["chosen"] == "skinny" else None
            print(
                f"{name} b{batch}: cuBLAS {row['cublas_ms']} ms, skinny {row['best_skinny_ms']} ms "
                f"({row['candidates_timed']} timed, {row['candidates_skipped']} skipped) -> {row['chosen']}",
                flush=True,
            )
        shapes_table[key] = entries
        del weights
        torch.cuda.empty_cache()
    update_table_file(
        table_path,
        device,
        f"{args.model} tp{args.tp_size}",
        shapes_table,
        tuned_by="benchmark/decode_roofline/tune_decode_gemms.py",
        torch=torch.__version__,
        margin=args.margin,
    )
    baseline = "torch._scaled_mm" if args.fp8 else "cuBLAS's block-scaled GEMM" if args.fp8_block else "cuBLAS"
    if args.silu:
        baseline = "the table's gate_up plan + the SiLU-and-mul kernel (column 'cuBLAS ms')"
    lines = [
        f"Skinny decode GEMM vs {baseline} ({args.model} shapes, tp {args.tp_size}, "
        f"{weights_kind(args)}, {LAYERS} distinct "
        f"weights, CUDA graph, each after an RMSNorm), {device}, "
        f"torch {torch.__version__}, copy bandwidth {bw / 1e9:.1f} GB/s, tuning took {time.perf_counter() - start:.0f} s",
        "",
        "| gemm | N x K | batch | floor ms | cuBLAS ms | x floor | skinny ms | x floor | chosen | skinny config |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        c = r["best_skinny_config"] or {}
        cfg = (
            f"m{c.get('block_m')} n{c.get('block_n')} k{c.get('block_k')} w{c.get('num_warps')} "
            f"s{c.get('num_stages')} split{c.get('split_k')}{' pdl' if c.get('pdl') else ''}"
        )
        lines.append(
            f"| {r['gemm']} | {r['n']} x {r['k']} | {r['batch']} | {r['floor_ms']} | {r['cublas_ms']} | "
            f"{r['cublas_ms'] / r['floor_ms']:.3f} | {r['best_skinny_ms']} | {r['best_skinny_ms'] / r['floor_ms']:.3f} | "
            f"{r['chosen']} | {cfg} |"
        )
    for batch in args.batches:
        sel = [r for r in rows if r["batch"] == batch]
        lines.append(
            f"| all | | {batch} | {sum(r['floor_ms'] for r in sel):.4f} | {sum(r['cublas_ms'] for r in sel):.4f} | | "
            f"{sum(r['chosen_ms'] for r in sel):.4f} (chosen) | | | |"
        )
    table = "\n".join(lines)
    print(table)
    write_results(
        args.out,
        {
            "device": device,
            "model": args.model,
            "tp_size": args.tp_size,
            "copy_bandwidth_GBps": round(bw / 1e9, 1),
            "table_file": os.path.relpath(table_path, ROOT),
            "rows": rows,
        },
        table,
    )


if __name__ == "__main__":
    main()
