"""The router's fp32 logits by token count: the engine's kernel (``layers/moe/router_gemm.py``, a program per
expert block and token) against torch's cast and cuBLAS's fp32 GEMM, the path past ``KERNEL_MAX_TOKENS``.

    python benchmark/decode_roofline/bench_router_logits.py [--tokens 1 2 4 8 16 32 64] [--out DIR]

Each row times one decode step's routers (every MoE layer its own fp32 weight, each after a bf16 RMSNorm of the
hidden state as in the model, so each router waits on a producer) as one CUDA graph replay, for DeepSeek-V2-Lite
(26 MoE layers, 64 experts, hidden 2048) and DeepSeek-V3 (58 MoE layers, 256 experts, hidden 7168). The kernel
columns are the kernel at every token count (past ``KERNEL_MAX_TOKENS`` and for weights past
``KERNEL_MAX_L2_BYTES`` too), one per program tile (experts x K columns a step; the first is the engine's);
"engine" says which path the engine takes there. Prints the table and writes results.json / results.md.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

from sglang.srt.layers.fused_elementwise import rmsnorm  # noqa: E402
from sglang.srt.layers.moe.router_gemm import (  # noqa: E402
    DEFAULT_TILE,
    KERNEL_MAX_L2_BYTES,
    KERNEL_MAX_TOKENS,
    RouterTile,
    router_logits_triton,
)
from sglang.test.bench_utils import cuda_graph_ms, write_results  # noqa: E402

SHAPES = {"DeepSeek-V2-Lite": (26, 64, 2048), "DeepSeek-V3": (58, 256, 7168)}  # MoE layers, experts, hidden
TILES = [DEFAULT_TILE, RouterTile(2, 1024), RouterTile(4, 1024), RouterTile(8, 512)]


def step_ms(layers: int, experts: int, hidden: int, tokens: int, router: RouterTile | str | None) -> float:
    """One step's ``layers`` norms, each followed by the router (the kernel with that tile, "torch"; None: the norms
    alone)."""
    weights = [torch.randn(experts, hidden, device="cuda") for _ in range(layers)]
    norm_weight = torch.ones(hidden, device="cuda", dtype=torch.bfloat16)
    src = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
    x = torch.empty_like(src)

    def step() -> None:
        for w in weights:
            rmsnorm(src, norm_weight, 1e-6, out=x)
            if isinstance(router, RouterTile):
                router_logits_triton(x, w, router)
            elif router == "torch":
                F.linear(x.float(), w)

    return cuda_graph_ms(step)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_router_logits.py needs a CUDA GPU")
    device = torch.cuda.get_device_name()
    rows = []
    for shape, (layers, experts, hidden) in SHAPES.items():
        for tokens in args.tokens:
            kernel = {f"{t.experts}x{t.block_k}": step_ms(layers, experts, hidden, tokens, t) for t in TILES}
            torch_ms = step_ms(layers, experts, hidden, tokens, "torch")
            norms_ms = step_ms(layers, experts, hidden, tokens, None)
            rows.append(
                dict(
                    shape=shape,
                    tokens=tokens,
                    kernel_ms={name: round(ms, 4) for name, ms in kernel.items()},
                    torch_ms=round(torch_ms, 4),
                    norms_alone_ms=round(norms_ms, 4),
                    engine="kernel"
                    if tokens <= KERNEL_MAX_TOKENS and tokens * experts * hidden * 4 <= KERNEL_MAX_L2_BYTES
                    else "torch",
                )
            )
    names = [f"{t.experts}x{t.block_k}" for t in TILES]
    head = (
        f"Router logits per decode step (each layer's router after an RMSNorm, one CUDA graph), {device}, "
        f"torch {torch.__version__}; the engine takes the kernel ({names[0]}) up to {KERNEL_MAX_TOKENS} tokens while "
        f"tokens x weight bytes <= {KERNEL_MAX_L2_BYTES >> 20} MiB\n\n"
        "| shape | tokens | "
        + " | ".join(f"kernel {n} ms" for n in names)
        + " | torch (cast + cuBLAS fp32) ms | norms alone ms | best kernel / torch | engine |\n"
        + "|---|---:|"
        + "---:|" * len(names)
        + "---:|---:|---:|---|\n"
    )
    table = head + "".join(
        f"| {r['shape']} | {r['tokens']} | "
        + " | ".join(str(r["kernel_ms"][n]) for n in names)
        + f" | {r['torch_ms']} | {r['norms_alone_ms']} | {min(r['kernel_ms'].values()) / r['torch_ms']:.2f} | "
        f"{r['engine']} |\n"
        for r in rows
    )
    print(table)
    if args.out:
        write_results(
            args.out,
            dict(device=device, kernel_max_tokens=KERNEL_MAX_TOKENS, tiles=names, rows=rows),
            table,
        )


if __name__ == "__main__":
    main()
