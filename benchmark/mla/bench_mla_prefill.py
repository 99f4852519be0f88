"""MLA extend (prefill with a cached prefix): the absorbed form vs the decompressed form, per extend size and prefix
length, on DeepSeek-V3 and DeepSeek-V2-Lite attention shapes (one layer, bf16, one GPU), and the crossover that
sets mla_triton.ABSORBED_EXTEND_MAX_TOKENS.

Each form is timed as forward_mla runs it for one layer (layers/attention/mla_triton.py): absorbed = W_UK into the
query, the latent kernel over each new token's causal slot list, W_UV after; decompressed = kv_b_proj over the
prefix and the new rows, then the extend kernel. The absorbed form's slot lists are built once per batch for every
layer: their time is a column of its own. The cache rows sit at shuffled slots, as a pool hands them out.

    python benchmark/mla/bench_mla_prefill.py [--shapes DeepSeek-V3 DeepSeek-V2-Lite] [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys

import torch

from sglang.srt.layers.attention import mla_triton
from sglang.test.bench_utils import write_results


@dataclasses.dataclass(frozen=True)
class Shape:
    heads: int  # query heads on one GPU (TP=1)
    kv_lora: int = 512
    rope: int = 64
    nope: int = 128
    v: int = 128


SHAPES = {"DeepSeek-V3": Shape(heads=128), "DeepSeek-V2-Lite": Shape(heads=16)}
EXTENDS = (1, 4, 16, 32, 64, 128, 256, 512, 1024, 4096)
PREFIXES = (0, 1024, 4096, 16384)
# The absorbed form's slot lists hold extend x (prefix + extend) entries; past this it is not worth timing.
MAX_ABSORBED_PAIRS = 1 << 26
MAX_DIFF = 0.1  # bf16 outputs of magnitude ~1: the forms differ by rounding only


def _time_ms(fn, reps: int = 10) -> float:
    fn()
    if not torch.cuda.is_available():  # a smoke run of the script's logic (TRITON_INTERPRET=1), not a timing
        return 0.0
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def measure(shape: Shape, prefix: int, extend: int, gen: torch.Generator, dev: str = "cuda") -> dict:
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    h = shape.heads
    slots = prefix + extend + 1
    cache = torch.randn(slots, 1, shape.kv_lora + shape.rope, generator=gen).to(dev, dt)
    req_to_token = torch.zeros(2, prefix + extend, dtype=torch.int32)
    req_to_token[1] = (torch.randperm(slots - 1, generator=gen) + 1)[: prefix + extend].to(torch.int32)
    req_to_token = req_to_token.to(dev)
    rows = torch.tensor([1], device=dev)
    q_nope = torch.randn(extend, h, shape.nope, generator=gen).to(dev, dt)
    q_rope = torch.randn(extend, h, shape.rope, generator=gen).to(dev, dt)
    w = (0.05 * torch.randn(h, shape.nope + shape.v, shape.kv_lora, generator=gen)).to(dev, dt)
    w_uk, w_uv = w[:, : shape.nope], w[:, shape.nope :]
    new = cache[req_to_token[1, prefix:].long(), 0]
    latent, k_rope = new[:, : shape.kv_lora], new[:, shape.kv_lora :]
    qo_indptr = torch.tensor([0, extend], dtype=torch.int32, device=dev)
    kv_indptr = torch.tensor([0, prefix], dtype=torch.int32, device=dev)
    kv_indices = req_to_token[1, :prefix].contiguous()
    prefix_lens = torch.tensor([prefix], device=dev)
    scale = (shape.nope + shape.rope) ** -0.5

    row = {"prefix": prefix, "extend": extend}
    row["decompressed_ms"] = _time_ms(
        lambda: mla_triton.decompressed_extend(
            q_nope, q_rope, latent, k_rope, cache, w_uk, w_uv, qo_indptr, kv_indptr, kv_indices, extend, scale
        )
    )
    if extend * (prefix + extend) <= MAX_ABSORBED_PAIRS:

        def lists():
            return mla_triton.token_row_lists(req_to_token, rows, prefix_lens, qo_indptr, [prefix], [extend])

        row["token_lists_ms"] = _time_ms(lists)
        indptr, indices = lists()
        row["absorbed_ms"] = _time_ms(
            lambda: mla_triton.absorbed_attention(q_nope, q_rope, cache, w_uk, w_uv, indptr, indices, scale)
        )
        # The two forms compute the same attention: a wrong kernel must not win the table.
        a = mla_triton.absorbed_attention(q_nope, q_rope, cache, w_uk, w_uv, indptr, indices, scale).float()
        b = mla_triton.decompressed_extend(
            q_nope, q_rope, latent, k_rope, cache, w_uk, w_uv, qo_indptr, kv_indptr, kv_indices, extend, scale
        ).float()
        row["max_abs_diff"] = (a - b).abs().max().item()
        if row["max_abs_diff"] > MAX_DIFF:
            raise RuntimeError(f"the two forms disagree at prefix {prefix}, extend {extend}: {row}")
    return row


def crossover(rows: list) -> int:
    """The largest extend size up to which the absorbed form wins at every size: it wins a size when its time
    summed over the prefix lengths measured is no more than the decompressed form's (long prefixes, where the
    choice matters, weigh most; microsecond ties at prefix 0 do not decide)."""
    best = 0
    for extend in sorted({r["extend"] for r in rows}):
        same = [r for r in rows if r["extend"] == extend]
        if not all("absorbed_ms" in r for r in same):
            break
        if sum(r["absorbed_ms"] for r in same) > sum(r["decompressed_ms"] for r in same):
            break
        best = extend
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--extends", nargs="+", type=int, default=list(EXTENDS))
    parser.add_argument("--prefixes", nargs="+", type=int, default=list(PREFIXES))
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    gen = torch.Generator().manual_seed(0)
    results, lines = {}, []
    for name in args.shapes:
        shape = SHAPES[name]
        rows = [measure(shape, p, n, gen) for p in args.prefixes for n in args.extends]
        cross = crossover(rows)
        results[name] = {"shape": dataclasses.asdict(shape), "rows": rows, "crossover_extend_tokens": cross}
        lines += [
            f"### {name} ({shape.heads} heads, kv_lora {shape.kv_lora} + rope {shape.rope}, one layer, bf16)",
            "",
            "| prefix | extend | absorbed ms | (slot lists ms) | decompressed ms | faster | max abs diff |",
            "|---:|---:|---:|---:|---:|---|---:|",
        ]
        for r in rows:
            a = r.get("absorbed_ms")
            faster = "-" if a is None else ("absorbed" if a <= r["decompressed_ms"] else "decompressed")
            lines.append(
                f"| {r['prefix']} | {r['extend']} | {'-' if a is None else f'{a:.3f}'} | "
                f"{r.get('token_lists_ms', float('nan')):.3f} | {r['decompressed_ms']:.3f} | {faster} | "
                f"{r.get('max_abs_diff', float('nan')):.2e} |"
            )
        lines += ["", f"{name}: absorbed wins (summed over the prefixes) up to {cross} new tokens per request", ""]
    threshold = min(r["crossover_extend_tokens"] for r in results.values())
    lines.append(
        f"suggested ABSORBED_EXTEND_MAX_TOKENS = {threshold} (in the tree: {mla_triton.ABSORBED_EXTEND_MAX_TOKENS})"
    )
    markdown = "\n".join(lines)
    print(markdown)
    data = {"device": torch.cuda.get_device_name(), "results": results, "suggested_threshold": threshold}
    print(json.dumps({"suggested_threshold": threshold, "device": data["device"]}))
    if args.out:
        write_results(args.out, data, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
