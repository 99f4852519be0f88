"""How far SGLANG_KT_CPU_INT8_ACTIVATIONS moves the INT8 CPU experts' output (any machine with AVX512-VNNI).

    python benchmark/kt_decode/int8_activation_error.py [--experts 16] [--tokens 1 16 64] [--out DIR]

One Qwen3-30B-A3B-shaped layer (hidden 2048, experts of 768, top-8) in a bf16 model, Gaussian weights quantized to
INT8 as the loader does (per-row scales); the same routed tokens (bf16-valued Gaussian activations) through the
kernel with fp32 activations and with int8 activations. Prints the relative RMS and relative max difference of the
two outputs per token count, writes results.json + results.md to --out (default: a temporary directory).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

import torch  # noqa: E402

from sglang.srt.layers.moe.cpu_experts import CpuExpertsEngine  # noqa: E402
from sglang.srt.layers.moe.layer import make_moe_layer  # noqa: E402
from sglang.test.bench_utils import write_results  # noqa: E402

HIDDEN, INTER, TOP_K = 2048, 768, 8


def gaussian_int8_layer(experts: int, gen: torch.Generator) -> torch.nn.Module:
    layer = make_moe_layer(experts, HIDDEN, INTER, torch.bfloat16, "INT8")
    for e in range(experts):
        for shard, (rows, cols) in (("w1", (INTER, HIDDEN)), ("w3", (INTER, HIDDEN)), ("w2", (HIDDEN, INTER))):
            layer.quant_method.load_expert(layer, e, shard, torch.randn(rows, cols, generator=gen) / cols**0.5)
    return layer


def mixture(layer, experts: int, tokens: int, int8_activations: bool, x, weights, ids) -> torch.Tensor:
    engine = CpuExpertsEngine(2, HIDDEN, INTER, TOP_K, experts, 0, tokens, False, 0, int8_activations=int8_activations)
    handle = engine.add_layer(layer, layer.quant_method)
    if int8_activations and not handle.int8_dot:
        raise SystemExit("this CPU has no AVX512-VNNI: the kernel has no int8 path here")
    out = engine.run_on_host(handle, x, weights, ids)
    engine.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--experts", type=int, default=16)
    parser.add_argument("--tokens", nargs="*", type=int, default=[1, 16, 64])
    parser.add_argument("--out", default=tempfile.mkdtemp(prefix="kt-int8-activations-"))
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(0)
    layer = gaussian_int8_layer(args.experts, gen)
    rows = []
    for tokens in args.tokens:
        x = torch.randn(tokens, HIDDEN, generator=gen).bfloat16().float()
        weights = torch.rand(tokens, TOP_K, generator=gen)
        weights /= weights.sum(dim=1, keepdim=True)
        ids = torch.stack([torch.randperm(args.experts, generator=gen)[:TOP_K] for _ in range(tokens)]).int()
        fp32 = mixture(layer, args.experts, tokens, False, x, weights, ids)
        int8 = mixture(layer, args.experts, tokens, True, x, weights, ids)
        diff = int8 - fp32
        rows.append(
            {
                "tokens": tokens,
                "rel_rms": (diff.norm() / fp32.norm()).item(),
                "rel_max": (diff.abs().max() / fp32.abs().max()).item(),
            }
        )
    lines = [
        f"INT8 CPU experts, int8 vs fp32 activations: one Qwen3-30B-A3B-shaped layer ({args.experts} experts of "
        f"{HIDDEN}x{INTER}, top-{TOP_K}), Gaussian weights and activations",
        "",
        "| tokens | relative RMS difference | max difference / max output |",
        "|---:|---:|---:|",
    ]
    lines += [f"| {r['tokens']} | {100 * r['rel_rms']:.2f}% | {100 * r['rel_max']:.2f}% |" for r in rows]
    table = "\n".join(lines)
    print(table)
    write_results(args.out, {"experts": args.experts, "rows": rows}, table)


if __name__ == "__main__":
    main()
