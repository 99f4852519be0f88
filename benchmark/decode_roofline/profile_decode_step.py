"""Where a decode step's time goes (Llama-3.1-8B shape, or --shape DeepSeek-V2-Lite / Qwen3-8B [--checkpoint-fp8];
one GPU): kernel time by kernel vs the graph step.

    python benchmark/decode_roofline/profile_decode_step.py [--shape DeepSeek-V2-Lite] [--batches 1 64] [--context 1024]
        [--no-pdl]

For each batch size it times the CUDA-graph step (as bench_decode_roofline.py does) and profiles the same
graph replays with torch.profiler (CUPTI reports the kernels inside a graph one by one): the sum of kernel
times is what the GPU computes; the difference to the step time is idle time between kernels (launch gaps,
ramp-up and tails). `--eager` profiles the step without graphs instead. Prints the top kernels by total
time. With programmatic dependent launch (``srt/layers/pdl.py``) a kernel's reported duration includes the
time it waited for the one before, so kernel times overlap and their sum can exceed the step; ``--no-pdl`` launches
every kernel without it (as on a GPU before Hopper), so each kernel's time is its own and the ranking says where
the step goes (the step itself then runs slower by what PDL saves). The launch
floor line: a CUDA graph of as many launches of an empty one-program kernel (with PDL, as the step's triton
kernels) as the step has, replayed: what the launches alone cost, whatever the kernels compute. A diagnostic,
not a results benchmark (writes nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict

import torch
import triton
import triton.language as tl

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

from bench_decode_roofline import apply_decode_config, decode_step_ms, dense_config_dir, our_runner  # noqa: E402

from sglang.srt.layers import pdl as pdl_module  # noqa: E402
from sglang.srt.layers.pdl import pdl_available, pdl_prologue  # noqa: E402
from sglang.test.bench_utils import cuda_graph_ms  # noqa: E402
from sglang.test.gpu_utils import shape_config_dir  # noqa: E402


@triton.jit
def _empty_kernel(x, PDL: tl.constexpr):
    pdl_prologue(PDL)


def launch_floor_ms(launches: int) -> float:
    """ms per replay of one CUDA graph of `launches` launches of an empty one-program kernel (PDL where the GPU
    has it, as the decode step's triton kernels launch)."""
    x = torch.empty(1, device="cuda")
    pdl = pdl_available(x)

    def step() -> None:
        for _ in range(launches):
            _empty_kernel[(1,)](x, PDL=pdl, launch_pdl=pdl)

    return cuda_graph_ms(step, replays=20)


def kernel_breakdown(mr, bs: int, ctx: int, eager: bool, steps: int = 5) -> tuple[float, list]:
    """(mean kernel ms per step, [(kernel name, ms per step, calls per step)] sorted by time)."""
    graphs = mr.cuda_graph_runner
    if eager:
        mr.cuda_graph_runner = None
    try:
        decode_step_ms(mr, bs, ctx, iters=2, random_inputs=True)  # warm up
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            decode_step_ms(mr, bs, ctx, iters=steps, random_inputs=True)
    finally:
        mr.cuda_graph_runner = graphs
    per_kernel = defaultdict(lambda: [0.0, 0])
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[evt.name][0] += evt.device_time / 1000.0
            per_kernel[evt.name][1] += 1
    # decode_step_ms runs 3 warm-up + `steps` timed forwards inside the profile.
    n = steps + 3
    rows = sorted(((k, v[0] / n, v[1] / n) for k, v in per_kernel.items()), key=lambda r: -r[1])
    return sum(r[1] for r in rows), rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", nargs="*", type=int, default=[1, 64])
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--eager", action="store_true", help="profile the step without CUDA graphs")
    parser.add_argument(
        "--decode-config",
        default="",
        help="JSON overrides of the triton backend's decode "
        'choices, e.g. {"block_n": 64, "num_warps": 8, "min_block_tokens": 256} (graphs are re-captured)',
    )
    parser.add_argument("--shape", default="Llama-3.1-8B", choices=["Llama-3.1-8B", "DeepSeek-V2-Lite", "Qwen3-8B"])
    parser.add_argument("--checkpoint-fp8", action="store_true", help="a dense shape as a native block-fp8 checkpoint")
    parser.add_argument("--no-pdl", action="store_true", help="launch every kernel without PDL: times that add up")
    args = parser.parse_args()
    if args.no_pdl:  # pdl_available asks this per device; every launch reads it, before the graphs are captured
        pdl_module._device_supports_pdl = lambda device_index: False
    args.dry_run = False
    dense = args.shape != "DeepSeek-V2-Lite"
    mr = our_runner(dense_config_dir(args) if dense else shape_config_dir(args.shape))
    if args.decode_config:
        apply_decode_config(mr, json.loads(args.decode_config))
    for bs in args.batches:
        # random tokens, as the roofline bench's MoE rows: one token for all would route every request alike
        graph_ms, _ = decode_step_ms(mr, bs, args.context, random_inputs=True)
        kernel_ms, rows = kernel_breakdown(mr, bs, args.context, args.eager)
        print(
            f"\n{args.shape}{' (PDL off)' if args.no_pdl else ''}, batch {bs}, context {args.context}: graph step "
            f"{graph_ms:.3f} ms; kernels {kernel_ms:.3f} ms "
            f"({sum(r[2] for r in rows):.0f} launches); idle between kernels ~{graph_ms - kernel_ms:.3f} ms"
        )
        launches = round(sum(r[2] for r in rows))
        floor = launch_floor_ms(launches)
        print(
            f"  launch floor: {launches} empty launches in one graph take {floor:.3f} ms ({1e3 * floor / launches:.2f} us each)"
        )
        for name, ms, calls in rows[: args.top]:
            print(f"  {ms:8.3f} ms  {calls:6.0f}x  {name[:110]}")


if __name__ == "__main__":
    main()
