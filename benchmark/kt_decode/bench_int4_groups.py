"""The CPU expert kernel alone on INT4 experts by group size (128: AMXINT4's; 32: Kimi-K2-Thinking's checkpoint; 64),
one DeepSeek-V3-sized expert layer (hidden 7168, intermediate 2048), every routed slot on the CPU.

    python benchmark/kt_decode/bench_int4_groups.py [--threads N] [--tokens 1 4 16] [--experts 8] [--out DIR]

Each row: ms per layer step (the median of --steps calls of the engine's host path, after warm-up) for that many
tokens, each routed to the same top-8 experts (so every step reads `--experts` experts' weights once), and the int4
code bytes read per second. bf16_dot: whether the layer takes the kernel's bf16 path (vdpbf16ps; a bf16 model on a
CPU with AVX512-BF16) or its fp32 path. Prints a table, writes results_int4_groups.json + .md under --out.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

from sglang.test.bench_utils import write_results  # noqa: E402

HIDDEN, INTER, TOP_K = 7168, 2048, 8
METHODS = {"INT4": 128, "INT4_G64": 64, "INT4_G32": 32}


def layer_of(method: str, experts: int) -> torch.nn.Module:
    from sglang.srt.layers.moe.layer import make_moe_layer

    layer = make_moe_layer(experts, HIDDEN, INTER, torch.bfloat16, method)
    gen = torch.Generator().manual_seed(0)
    for e in range(experts):
        for shard, shape in (("w1", (INTER, HIDDEN)), ("w3", (INTER, HIDDEN)), ("w2", (HIDDEN, INTER))):
            layer.quant_method.load_expert(layer, e, shard, torch.randn(shape, generator=gen) * 0.02)
    return layer


def bench(method: str, experts: int, threads: int, tokens_list: list[int], steps: int) -> list[dict]:
    from sglang.srt.layers.moe.cpu_experts import CpuExpertsEngine

    layer = layer_of(method, experts)
    engine = CpuExpertsEngine(
        threads=threads, hidden=HIDDEN, inter=INTER, top_k=TOP_K, num_cpu_experts=experts, expert_offset=0,
        capacity=max(tokens_list), pin_memory=False, spin_us=0, int8_activations=False, doorbell=False,
    )  # fmt: skip
    handle = engine.add_layer(layer, layer.quant_method)
    rows = []
    code_bytes = experts * 3 * HIDDEN * INTER // 2
    for tokens in tokens_list:
        x = torch.randn(tokens, HIDDEN, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(tokens))
        weights = torch.full((tokens, TOP_K), 1.0 / TOP_K)
        ids = (torch.arange(TOP_K) % experts).repeat(tokens, 1)
        for _ in range(3):
            engine.run_on_host(handle, x, weights, ids)
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            engine.run_on_host(handle, x, weights, ids)
            times.append(time.perf_counter() - start)
        ms = statistics.median(times) * 1e3
        rows.append(
            {
                "method": method,
                "group": METHODS[method],
                "bf16_dot": bool(handle.bf16_dot),
                "tokens": tokens,
                "threads": threads,
                "ms_per_step": round(ms, 3),
                "code_gb_per_s": round(code_bytes / (ms / 1e3) / 1e9, 2),
            }
        )
        print(f"{method} (groups of {METHODS[method]}) bf16_dot={handle.bf16_dot} tokens={tokens}: {ms:.3f} ms")
    engine.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--tokens", type=int, nargs="*", default=[1, 4, 16])
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--methods", nargs="*", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    args = parser.parse_args()
    rows = []
    for method in args.methods:
        rows += bench(method, args.experts, args.threads, args.tokens, args.steps)
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "")
    header = (
        f"INT4 experts by group size, the CPU expert kernel alone (host path): {args.experts} experts of {HIDDEN} x "
        f"{INTER}, top-{TOP_K}, bf16 model, {args.threads} threads, {cpu}; median of {args.steps} steps"
    )
    lines = [
        header,
        "",
        "| method | group | bf16 path | tokens | ms per step | int4 code GB/s |",
        "|---|---:|---|---:|---:|---:|",
    ]
    lines += [
        f"| {r['method']} | {r['group']} | {r['bf16_dot']} | {r['tokens']} | {r['ms_per_step']} | {r['code_gb_per_s']} |"
        for r in rows
    ]
    print("\n".join(lines))
    write_results(args.out, {"rows": rows, "header": header}, "\n".join(lines), name="results_int4_groups")


if __name__ == "__main__":
    main()
