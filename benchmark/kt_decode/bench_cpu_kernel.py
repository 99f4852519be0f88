"""The KT CPU expert kernel alone, on any machine (no GPU): ms per layer step by method and token count.

    python benchmark/kt_decode/bench_cpu_kernel.py [--methods INT4 BF16 INT8] [--tokens 1 8] [--threads N]
        [--experts 48] [--int8-activations 0 1] [--out DIR]

One Qwen3-30B-A3B-shaped layer (hidden 2048, experts of 768, top-8) in a bf16 model, `--experts` experts on the
CPU, random weights; each token routed to 8 distinct experts. Best of 5 rounds of 10 synchronous steps
(`CpuExpertsEngine.run_on_host`), and the weight bytes the steps read per second (the kernel's own count).
Prints a table, writes results.json + results.md to --out (default: a temporary directory: the numbers belong to
the machine that ran it; benchmark/kt_decode/bench_kt_decode.py is the measurement on the GPU machine).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

import torch  # noqa: E402

from sglang.srt.layers.moe.cpu_experts import CpuExpertsEngine  # noqa: E402
from sglang.srt.layers.moe.kt_ep_wrapper import make_moe_layer  # noqa: E402
from sglang.test.bench_utils import write_results  # noqa: E402

HIDDEN, INTER, TOP_K = 2048, 768, 8


def bench(method: str, experts: int, tokens: int, threads: int, int8_activations: bool) -> dict:
    gen = torch.Generator().manual_seed(0)
    layer = make_moe_layer(experts, HIDDEN, INTER, torch.bfloat16, method)
    for p in layer.parameters():  # random stored values are enough for timing (no quantization pass)
        if p.dtype.is_floating_point:
            p.data.copy_(0.02 * torch.randn(p.shape, generator=gen))
        else:
            p.data.copy_(torch.randint(0, 100, p.shape, generator=gen))
    engine = CpuExpertsEngine(
        threads, HIDDEN, INTER, TOP_K, experts, 0, max(tokens, 1), False, 2000, int8_activations=int8_activations
    )
    handle = engine.add_layer(layer, layer.quant_method)
    x = torch.randn(tokens, HIDDEN, generator=gen).bfloat16().float()
    weights = torch.rand(tokens, TOP_K, generator=gen)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:TOP_K] for _ in range(tokens)]).int()
    engine.run_on_host(handle, x, weights, ids)
    best, steps = float("inf"), 10
    for _ in range(5):
        before = engine.stats()
        start = time.perf_counter()
        for _ in range(steps):
            engine.run_on_host(handle, x, weights, ids)
        seconds = (time.perf_counter() - start) / steps
        if seconds < best:
            best, read = seconds, engine.stats().minus(before).bytes_read / steps
    engine.close()
    return {
        "method": method,
        "tokens": tokens,
        "bf16_path": handle.bf16_dot,
        "int8_path": handle.int8_dot,
        "ms": best * 1e3,
        "GBps": read / best / 1e9,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--methods", nargs="*", default=["INT4", "BF16", "INT8"])
    parser.add_argument("--tokens", nargs="*", type=int, default=[1, 8])
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--experts", type=int, default=48)
    parser.add_argument("--out", default=tempfile.mkdtemp(prefix="kt-cpu-kernel-"))
    parser.add_argument(
        "--int8-activations",
        nargs="*",
        type=int,
        choices=[0, 1],
        default=[0],
        help="INT8 rows without (0) and/or with (1) int8 activations (SGLANG_KT_CPU_INT8_ACTIVATIONS)",
    )
    args = parser.parse_args()
    rows = [
        bench(m, args.experts, t, args.threads, bool(a))
        for m in args.methods
        for a in (args.int8_activations if m == "INT8" else [0])
        for t in args.tokens
    ]
    lines = [
        f"KT CPU expert kernel, {args.threads} threads, {args.experts} experts of {HIDDEN}x{INTER}, top-{TOP_K}",
        "",
        "| method | tokens | bf16 path | int8 path | ms per layer step | weight GB/s |",
        "|---|---:|---|---|---:|---:|",
    ]
    lines += [
        f"| {r['method']} | {r['tokens']} | {r['bf16_path']} | {r['int8_path']} | {r['ms']:.2f} | {r['GBps']:.1f} |"
        for r in rows
    ]
    table = "\n".join(lines)
    print(table)
    write_results(args.out, {"rows": rows}, table)


if __name__ == "__main__":
    main()
