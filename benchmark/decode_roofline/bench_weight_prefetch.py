"""The decode step by how much of each projection's weight the skinny GEMM prefetches into L2 while it waits for the
kernel before it (``decode_gemm/kernel.py``'s ``L2_PREFETCH_BYTES``; 0 = none, the GEMM streams one tile first).

    python benchmark/decode_roofline/bench_weight_prefetch.py [--shape Qwen3-8B] [--budgets-mib 0 8 16 32 64 1024]
        [--batches 1 8 64 256] [--rounds 2] [--out DIR]

A dense shape runs as a native block-fp8 checkpoint (dummy weights in its format, as ``bench_decode_roofline.py
--checkpoint-fp8``); ``--shape DeepSeek-V2-Lite`` in bf16 (its dense projections take the skinny GEMM only where
the device's table has them). Context 1k; the graphs are captured again for each budget (at the batches measured
only); ``--rounds`` sweeps the budgets that many times, each cell the fastest of its rounds (the order of the
budgets drifts less into the result). Each cell is the step in ms and its ratio to budget 0; a dense shape also
its ratio to the HBM floor (``dense_floor_terms``). Prints the table, writes results.json / results.md.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_decode_roofline as roofline  # noqa: E402

from sglang.srt.layers.decode_gemm import kernel as gemm_kernel  # noqa: E402  (roofline put python/ on the path)
from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner  # noqa: E402
from sglang.test.bench_utils import write_results  # noqa: E402
from sglang.test.fp8_checkpoints import quantization_config  # noqa: E402
from sglang.test.gpu_utils import shape_config_dir  # noqa: E402

MIB = 1024**2
CONTEXT = 1024


def runner(shape: str, batches: list):
    moe = shape in roofline.MOE_SHAPES
    config_dir = (
        shape_config_dir(shape) if moe else shape_config_dir(shape, quantization_config=quantization_config("block"))
    )
    return roofline.our_runner(config_dir, cuda_graph_bs=tuple(batches)), moe


def sweep(mr, budgets: list, batches: list, rounds: int, moe: bool) -> dict:
    """{(budget MiB, batch): fastest step ms over the rounds}, the graphs captured again for each budget."""
    best: dict = {}
    for _ in range(rounds):
        for mib in budgets:
            gemm_kernel.L2_PREFETCH_BYTES = mib * MIB  # read at each launch, so at capture
            mr.cuda_graph_runner = None
            torch.cuda.empty_cache()
            mr.cuda_graph_runner = CudaGraphRunner(mr)
            for bs in batches:
                ms, _ = roofline.decode_step_ms(mr, bs, CONTEXT, iters=50, random_inputs=moe)
                best[(mib, bs)] = min(ms, best.get((mib, bs), float("inf")))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="Qwen3-8B")
    parser.add_argument("--budgets-mib", type=int, nargs="+", default=[0, 8, 16, 32, 64, 1024])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_weight_prefetch.py needs a CUDA GPU")
    shipped = gemm_kernel.L2_PREFETCH_BYTES
    bw = roofline.copy_bandwidth()
    mr, moe = runner(args.shape, args.batches)
    best = sweep(mr, args.budgets_mib, args.batches, args.rounds, moe)
    floors = (
        {}
        if moe
        else {bs: sum(roofline.dense_floor_terms(mr, bs, CONTEXT).values()) / bw * 1000 for bs in args.batches}
    )
    device = torch.cuda.get_device_name()
    rows = [
        dict(
            batch=bs,
            hbm_floor_ms=round(floors[bs], 3) if floors else None,
            step_ms={mib: round(best[(mib, bs)], 3) for mib in args.budgets_mib},
        )
        for bs in args.batches
    ]
    base = args.budgets_mib[0]
    head = (
        f"{args.shape} decode step (context {CONTEXT}, {'bf16' if moe else 'native block-fp8 checkpoint'}, dummy "
        f"weights) by L2 prefetch budget, {device}, copy bandwidth {bw / 1e9:.1f} GB/s; fastest of {args.rounds} "
        f"rounds; the engine ships {shipped // MIB} MiB\n\n"
        "| batch | HBM floor ms | "
        + " | ".join(f"{mib} MiB ms (x {base} MiB{', x floor' if floors else ''})" for mib in args.budgets_mib)
        + " |\n|---:|---:|"
        + "---:|" * len(args.budgets_mib)
        + "\n"
    )

    def cell(r: dict, mib: int) -> str:
        ms = r["step_ms"][mib]
        ratio = f"{ms / r['step_ms'][base]:.3f}" + (f", {ms / r['hbm_floor_ms']:.3f}" if floors else "")
        return f"{ms} ({ratio})"

    table = head + "".join(
        f"| {r['batch']} | {r['hbm_floor_ms'] if floors else '-'} | "
        + " | ".join(cell(r, mib) for mib in args.budgets_mib)
        + " |\n"
        for r in rows
    )
    print(table)
    if args.out:
        result = dict(device=device, shape=args.shape, context=CONTEXT, rounds=args.rounds, shipped_mib=shipped // MIB)
        write_results(args.out, dict(result, copy_bandwidth_GBps=round(bw / 1e9, 1), rows=rows), table)


if __name__ == "__main__":
    main()
