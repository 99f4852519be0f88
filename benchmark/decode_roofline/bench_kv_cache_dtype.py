"""Decode attention over a bf16 vs an fp8 KV cache (``--kv-cache-dtype``), Llama-3.1-8B attention shape.

    python benchmark/decode_roofline/bench_kv_cache_dtype.py [--batches 64 256] [--context 1024] [--out DIR]

Times one decode step's attention for all 32 layers (each layer its own K/V buffers) as a CUDA graph replay,
with the engine's split policy, for each KV dtype; fp8 caches twice: with the tiles upcast to fp16 for the
dots (the engine's choice, ``decode_attention.dot_dtype``) and to the query's bf16 (the choice before,
``DecodeKernelConfig(fp8_dots_in_fp16=False)``). Prints
the table (ms, KV bytes read per second) and writes results.json / results.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

from sglang.srt.layers.attention.triton_ops import decode_attention as da  # noqa: E402
from sglang.test.bench_utils import cuda_graph_ms, write_results  # noqa: E402

LAYERS, HQ, HKV, D, MAX_SPLITS = 32, 32, 8, 128, 16
SWEEP = [(128, 4, 3), (256, 4, 3), (256, 8, 3), (128, 8, 3), (128, 4, 4), (64, 4, 4), (256, 8, 2)]  # first: the default
KV_DTYPES = {"bf16": torch.bfloat16, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def attention_ms(
    bs: int, ctx: int, kv_dtype: torch.dtype, upcast_to_query: bool, config: da.DecodeKernelConfig | None = None
) -> float:
    slots = bs * ctx + 1  # slot 0: the dummy
    k_bufs = [torch.randn(slots, HKV, D, device="cuda").to(kv_dtype) for _ in range(LAYERS)]
    v_bufs = [torch.randn(slots, HKV, D, device="cuda").to(kv_dtype) for _ in range(LAYERS)]
    q = torch.randn(bs, HQ, D, device="cuda", dtype=torch.bfloat16)
    o = torch.empty(bs, HQ, D, device="cuda", dtype=torch.bfloat16)
    indptr = torch.arange(0, (bs + 1) * ctx, ctx, device="cuda", dtype=torch.int32)
    indices = torch.arange(bs * ctx, device="cuda", dtype=torch.int32) + 1
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    min_splits, cap = da.decode_split_bounds(bs, HKV, sms, MAX_SPLITS)
    splits = torch.empty(bs, dtype=torch.int32, device="cuda")
    config = config or da.DecodeKernelConfig.for_head_dim(D)
    seq_lens = torch.full((bs,), ctx, device="cuda", dtype=torch.int32)
    da.get_num_kv_splits(splits, seq_lens, cap, min_splits=min_splits, block_n=config.block_n)
    logits = torch.empty(bs, HQ, cap, D, device="cuda", dtype=torch.float32)
    lse = torch.empty(bs, HQ, cap, device="cuda", dtype=torch.float32)
    if upcast_to_query:  # the earlier choice, for comparison only
        config = dataclasses.replace(config, fp8_dots_in_fp16=False)
    try:
        return cuda_graph_ms(
            lambda: [
                da.decode_attention_fwd(q, k, v, o, indptr, indices, logits, lse, splits, cap, D**-0.5, config=config)
                for k, v in zip(k_bufs, v_bufs)
            ]
        )
    finally:
        k_bufs.clear(), v_bufs.clear()
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument(
        "--sweep", action="store_true", help="also time other stage-1 tilings over the fp8 e4m3 cache (engine's dots)"
    )
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "kv_cache_dtype"))
    args = parser.parse_args()
    rows = []
    for bs in args.batches:
        for name, dtype in KV_DTYPES.items():
            for upcast_to_query in (False, True) if dtype != torch.bfloat16 else (False,):
                ms = attention_ms(bs, args.context, dtype, upcast_to_query)
                kv_bytes = LAYERS * bs * args.context * HKV * D * 2 * dtype.itemsize
                dots = "bf16" if dtype == torch.bfloat16 or upcast_to_query else "fp16"
                rows.append(
                    {
                        "batch": bs,
                        "context": args.context,
                        "kv_dtype": name,
                        "dot_dtype": dots,
                        "ms": round(ms, 4),
                        "kv_GBps": round(kv_bytes / ms / 1e6, 1),
                        "engine": not upcast_to_query,
                    }
                )
                print(rows[-1], flush=True)
    sweep = []
    for bs in args.batches if args.sweep else ():
        for block_n, warps, stages in SWEEP:
            config = da.DecodeKernelConfig(block_n=block_n, num_warps=warps, num_stages=stages)
            ms = attention_ms(bs, args.context, torch.float8_e4m3fn, False, config)
            sweep.append(
                {"batch": bs, "block_n": block_n, "num_warps": warps, "num_stages": stages, "ms": round(ms, 4)}
            )
            print(sweep[-1], flush=True)
    lines = [
        f"Decode attention, 32 layers, Llama-3.1-8B heads (32 q / 8 kv x 128), {torch.cuda.get_device_name()}, "
        f"torch {torch.__version__}",
        "",
        "| batch | context | KV dtype | dots in | ms | KV GB/s | engine's choice |",
        "|---:|---:|---|---|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['batch']} | {r['context']} | {r['kv_dtype']} | {r['dot_dtype']} | {r['ms']} | {r['kv_GBps']} | "
            f"{'yes' if r['engine'] else 'no'} |"
        )
    if sweep:
        lines += [
            "",
            "Stage-1 tilings over fp8_e4m3 (fp16 dots):",
            "",
            "| batch | block_n | warps | stages | ms |",
            "|---:|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {r['batch']} | {r['block_n']} | {r['num_warps']} | {r['num_stages']} | {r['ms']} |" for r in sweep
        ]
    table = "\n".join(lines)
    print(table)
    write_results(args.out, {"device": torch.cuda.get_device_name(), "rows": rows, "sweep": sweep}, table)


if __name__ == "__main__":
    main()
