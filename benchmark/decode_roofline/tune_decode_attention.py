"""Sweep the triton decode-attention launch choices on the GPU (Llama-3.1-8B attention shape).

    python benchmark/decode_roofline/tune_decode_attention.py [--out DIR] [--focused | --configs N,W,S ...]

Times one decode step's attention for all 32 layers (each layer its own K/V buffers, so nothing is
served from L2) as a CUDA graph replay, which is how the engine runs it: kernel time plus the
launch gaps between kernels. Stage A tries DecodeKernelConfigs (block_n x num_warps x num_stages x grid
order; `--focused`: five near the default, in both grid orders) under the backend's split policy; stage B tries split policies
(min_block_tokens, programs per SM, max_kv_splits; "cap" is the backend's per-batch cap of ~4
stage-1 programs per SM) with each case's two best configs. Every
result is checked against the default config's output. Prints the best per case and writes
results.json / results.md (the defaults in triton_ops/decode_attention.py and triton_backend.py
come from these tables).
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

from sglang.srt.layers.attention.triton_ops import (  # noqa: E402
    DecodeKernelConfig,
    decode_attention_fwd,
    decode_split_bounds,
    get_num_kv_splits,
)
from sglang.test.bench_utils import cuda_graph_ms, write_results  # noqa: E402

LAYERS, HQ, HKV, D = 32, 32, 8, 128  # Llama-3.1-8B
CASES = [(1, 1024), (1, 8192), (8, 1024), (64, 1024), (8, 8192), (256, 1024)]
DEFAULT_POLICY = {"min_block_tokens": 1024, "programs_per_sm": 2, "max_kv_splits": "cap"}


class Case:
    """One (batch, context): 32 layers of KV, contiguous slots per request (as a fresh allocator gives)."""

    def __init__(self, bs: int, ctx: int, k_bufs, v_bufs) -> None:
        self.bs, self.ctx = bs, ctx
        self.k_bufs, self.v_bufs = k_bufs, v_bufs
        self.q = torch.randn(bs, HQ, D, device="cuda", dtype=torch.bfloat16)
        self.o = torch.zeros(LAYERS, bs, HQ, D, device="cuda", dtype=torch.bfloat16)
        self.indptr = torch.arange(0, (bs + 1) * ctx, ctx, device="cuda", dtype=torch.int32)
        self.indices = torch.arange(bs * ctx, device="cuda", dtype=torch.int32) + 1  # slot 0 is the dummy
        self.seq_lens = torch.full((bs,), ctx, device="cuda", dtype=torch.int32)
        self.kv_bytes = LAYERS * bs * ctx * HKV * D * 2 * 2

    def step_fn(self, config: DecodeKernelConfig, policy: dict):
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        min_splits, cap = decode_split_bounds(self.bs, HKV, sms, 16, policy["programs_per_sm"])
        max_splits = cap if policy["max_kv_splits"] == "cap" else policy["max_kv_splits"]  # "cap": the backend's
        splits = torch.empty(self.bs, dtype=torch.int32, device="cuda")
        get_num_kv_splits(splits, self.seq_lens, max_splits, policy["min_block_tokens"], min_splits, config.block_n)
        logits = torch.empty(self.bs, HQ, max_splits, D, device="cuda", dtype=torch.float32)
        lse = torch.empty(self.bs, HQ, max_splits, device="cuda", dtype=torch.float32)

        def step() -> None:
            for layer in range(LAYERS):
                decode_attention_fwd(
                    self.q,
                    self.k_bufs[layer],
                    self.v_bufs[layer],
                    self.o[layer],
                    self.indptr,
                    self.indices,
                    logits,
                    lse,
                    splits,
                    max_splits,
                    D**-0.5,
                    0.0,
                    config,
                )

        return step


def measure(case: Case, config: DecodeKernelConfig, policy: dict, reference, replays: int) -> dict:
    row = {"batch": case.bs, "context": case.ctx, **vars(config), **policy}
    try:
        case.o.zero_()
        ms = cuda_graph_ms(case.step_fn(config, policy), replays)
        err = (case.o.float() - reference).abs().max().item()
    except Exception as exc:  # e.g. a tile that does not fit in shared memory
        row.update(error=f"{type(exc).__name__}: {str(exc)[:120]}")
        return row
    row.update(ms=round(ms, 4), kv_GBps=round(case.kv_bytes / ms / 1e6, 1), max_abs_err=round(err, 5))
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "tuning_grid_order"))
    parser.add_argument("--focused", action="store_true", help="five configs near the default only")
    parser.add_argument(
        "--configs",
        nargs="+",
        default=None,
        metavar="N,W,S",
        help="stage A tries exactly these block_n,num_warps,num_stages (default grid order), stage B the focused "
        "split policies",
    )
    parser.add_argument("--replays", type=int, default=20)
    args = parser.parse_args()
    torch.manual_seed(0)
    tokens = max(bs * ctx for bs, ctx in CASES) + 1
    k_bufs = [torch.randn(tokens, HKV, D, device="cuda", dtype=torch.bfloat16) for _ in range(LAYERS)]
    v_bufs = [torch.randn(tokens, HKV, D, device="cuda", dtype=torch.bfloat16) for _ in range(LAYERS)]
    cases = [Case(bs, ctx, k_bufs, v_bufs) for bs, ctx in CASES]
    focused_policies = [
        {"min_block_tokens": t, "programs_per_sm": 2, "max_kv_splits": m}
        for t, m in itertools.product((256, 1024), (8, 16, "cap"))
    ]
    if args.configs:
        configs = [
            DecodeKernelConfig(**dict(zip(("block_n", "num_warps", "num_stages"), map(int, c.split(",")))))
            for c in args.configs
        ]
        policies = focused_policies
    elif args.focused:
        configs = [
            DecodeKernelConfig(block_n=n, num_warps=w, num_stages=s, kv_heads_adjacent=a)
            for (n, w, s), a in itertools.product(
                ((128, 4, 3), (64, 8, 3), (128, 8, 3), (64, 4, 3), (128, 4, 2)), (False, True)
            )
        ]
        policies = focused_policies
    else:
        configs = [
            DecodeKernelConfig(block_n=n, num_warps=w, num_stages=s, kv_heads_adjacent=a)
            for n, w, s, a in itertools.product((32, 64, 128), (2, 4, 8), (1, 2, 3, 4), (False, True))
        ]
        policies = [
            {"min_block_tokens": t, "programs_per_sm": p, "max_kv_splits": m}
            for t, p, m in itertools.product((256, 512, 1024), (1, 2, 4), (8, 16, "cap"))
        ]
    rows, best = [], {}
    for case in cases:
        case.step_fn(DecodeKernelConfig(), DEFAULT_POLICY)()
        reference = case.o.float().clone()
        base = measure(case, DecodeKernelConfig(), DEFAULT_POLICY, reference, args.replays)
        stage_a = [measure(case, c, DEFAULT_POLICY, reference, args.replays) for c in configs]
        ok = sorted((r for r in stage_a if "ms" in r and r["max_abs_err"] < 0.05), key=lambda r: r["ms"])
        top = [DecodeKernelConfig(**{k: r[k] for k in vars(DecodeKernelConfig())}) for r in ok[:2]]
        stage_b = [measure(case, c, p, reference, args.replays) for c in top for p in policies]
        case_rows = [base] + stage_a + stage_b
        for r in case_rows:
            r["stage"] = "default" if r is base else ("A" if r in stage_a else "B")
        rows += case_rows
        good = [r for r in case_rows if "ms" in r and r["max_abs_err"] < 0.05]
        best[(case.bs, case.ctx)] = (base, min(good, key=lambda r: r["ms"]))
        b = best[(case.bs, case.ctx)][1]
        print(
            f"batch {case.bs} ctx {case.ctx}: default {base.get('ms')} ms -> best {b['ms']} ms "
            f"({b['kv_GBps']} GB/s of KV) with { ({k: b[k] for k in b if k not in ('batch', 'context', 'stage')}) }",
            flush=True,
        )
    bad = [r for r in rows if "max_abs_err" in r and r["max_abs_err"] >= 0.05]
    lines = [
        f"Decode attention, 32 layers of the Llama-3.1-8B shape (32 q / 8 kv heads of 128), bf16, "
        f"{torch.cuda.get_device_name()}, CUDA graph replay; {len(rows)} measurements, "
        f"{sum('error' in r for r in rows)} configs failed to launch, {len(bad)} disagreed with the default (>= 0.05).",
        "",
        "| batch | context | default ms | best ms | KV GB/s (best) | block_n | warps | stages | kv heads adjacent "
        "| min_block_tokens | programs/SM | max_kv_splits |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|",
    ]
    for (bs, ctx), (base, b) in best.items():
        lines.append(
            f"| {bs} | {ctx} | {base.get('ms')} | {b['ms']} | {b['kv_GBps']} | {b['block_n']} | {b['num_warps']} | "
            f"{b['num_stages']} | {b['kv_heads_adjacent']} | {b['min_block_tokens']} | {b['programs_per_sm']} | "
            f"{b['max_kv_splits']} |"
        )
    table = "\n".join(lines)
    print(table)
    write_results(args.out, {"device": torch.cuda.get_device_name(), "rows": rows}, table)


if __name__ == "__main__":
    main()
