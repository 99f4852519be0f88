"""The MLA decode kernel (triton_ops/mla_decode.py: stage 1 over the latent rows, the stage-2 merge) per launch
config, on DeepSeek-V2-Lite (16 heads) and DeepSeek-V3 (128 heads) attention shapes: kv_lora 512, rope 64, bf16,
one layer, one GPU (TP=1). Which (BLOCK_N, warps, stages, chunk rule) wins, and how far from the HBM floor.

Each cell is the kernel + merge captured as one CUDA graph (the decode step's form), replayed; the latent rows
sit at shuffled slots as a pool hands them out. GB/s counts the latent rows read once (rows x 576 x 2 bytes), the
floor is that read at the copy bandwidth measured here (a device-to-device copy: reads + writes / time). Every
config's output is checked against the default config's (max abs diff).

Rows: the default config (MLADecodeConfig(), marked *), a grid of (BLOCK_N, num_warps, num_stages) x chunk rules:
the config's own (whole waves: MLADecodeConfig.num_splits, no suffix) and the earlier fill rule (`pN`: enough
chunks that rows x head blocks x chunks >= N x SMs, at most 32), and `before`: the first launch (BLOCK_N 16, 8
warps, 1 stage, max(1, min(8, 64 // rows)) chunks; its torch merge is replaced by the triton one, so it understates
the old cost). The ranking is each config's geometric mean over the cells of its time / the cell's best.

    python benchmark/mla/bench_mla_decode.py [--out DIR] [--kernel-configs 32,8,2 64,4,2,16 64,4,2,16,2] [--fill-rules 1 2]
    # = scripts/device/run.sh mla-decode
On the CPU (TRITON_INTERPRET=1) it runs a smoke of its logic on tiny shapes (no timings).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
from typing import Callable, Optional

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "decode_roofline"))
from bench_decode_roofline import copy_bandwidth  # noqa: E402

from sglang.srt.layers.attention.triton_ops.mla_decode import (  # noqa: E402
    DEFAULT_CONFIG,
    MLADecodeConfig,
    mla_decode_fwd,
    num_sms,
)
from sglang.test.bench_utils import cuda_graph_ms, write_results  # noqa: E402

SHAPES = {"DeepSeek-V2-Lite": 16, "DeepSeek-V3": 128}  # query heads on one GPU
KV_LORA, ROPE = 512, 64
CASES = ((1, 1024), (16, 1024), (64, 1024), (256, 1024), (1, 8192))  # (batch, context)
# (BLOCK_N, num_warps, num_stages[, BLOCK_H]): the kernel variants (each compiles); a chunk rule only moves the
# chunk count (no recompile), so it multiplies for free.
KERNEL_CONFIGS = ("16,8,1", "32,4,2", "32,8,1", "32,8,2", "32,8,3", "64,4,2", "64,8,1", "64,8,2")
FILL_RULES = (1, 2, 4)  # the earlier rule's programs per SM
MAX_DIFF = 0.05  # bf16 contexts of magnitude < 1: configs differ by rounding only


@dataclasses.dataclass(frozen=True)
class Variant:
    label: str
    config: MLADecodeConfig
    # (rows, heads, SMs) -> chunks: another rule (`pN`, `before`); None: the config's own (num_splits)
    splits: Optional[Callable[[int, int, int], int]] = None


def before_splits(rows: int, heads: int, sms: int) -> int:
    """The chunk count the kernel launched with before this benchmark existed."""
    return max(1, min(8, 64 // max(rows, 1)))


def fill_splits(programs_per_sm: int, config: MLADecodeConfig) -> Callable[[int, int, int], int]:
    """The earlier rule (the default before the whole-waves rule): enough chunks that rows x head blocks x
    chunks cover the SMs programs_per_sm times, at most config.max_splits."""

    def rule(rows: int, heads: int, sms: int) -> int:
        programs = max(rows, 1) * -(-heads // config.block_h)
        return max(1, min(config.max_splits, -(-programs_per_sm * sms // programs)))

    return rule


def parse_kernel_config(text: str) -> dict:
    parts = [int(x) for x in text.split(",")]
    if len(parts) not in (3, 4, 5):
        raise argparse.ArgumentTypeError(f"BLOCK_N,num_warps,num_stages[,BLOCK_H[,programs per SM]], got {text!r}")
    names = ("block_n", "num_warps", "num_stages", "block_h", "programs_per_sm")
    return dict(zip(names, parts))


def config_label(c: MLADecodeConfig) -> str:
    h = "" if c.block_h == DEFAULT_CONFIG.block_h else f"h{c.block_h}"
    per_sm = "" if c.programs_per_sm == 1 else f"x{c.programs_per_sm}"
    return f"n{c.block_n}w{c.num_warps}s{c.num_stages}{h}{per_sm}"


def variants(kernel_configs: list, fill_rules: list) -> list:
    out = [Variant(config_label(DEFAULT_CONFIG) + "*", DEFAULT_CONFIG)]
    for kc in kernel_configs:
        c = dataclasses.replace(DEFAULT_CONFIG, **kc)
        if c != DEFAULT_CONFIG:
            out.append(Variant(config_label(c), c))
        for pps in fill_rules:
            out.append(Variant(f"{config_label(c)}p{pps}", c, fill_splits(pps, c)))
    before = dataclasses.replace(DEFAULT_CONFIG, block_n=16, num_warps=8, num_stages=1)
    out.append(Variant("before", before, before_splits))
    return out


def make_case(heads: int, batch: int, context: int, kv_lora: int, rope: int, dev: str, seed: int):
    """q_latent, q_rope, cache, kv_indptr, kv_indices of `batch` requests of `context` rows at shuffled slots
    (generated on the device: V3 at batch 256 is 302 MB of rows)."""
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    gen = torch.Generator(device=dev).manual_seed(seed)
    slots = batch * context + 1
    cache = (0.5 * torch.randn(slots, 1, kv_lora + rope, generator=gen, device=dev)).to(dt)
    indices = (torch.randperm(slots - 1, generator=gen, device=dev) + 1).to(torch.int32)
    indptr = torch.arange(0, batch + 1, dtype=torch.int32, device=dev) * context
    q_latent = (0.05 * torch.randn(batch, heads, kv_lora, generator=gen, device=dev)).to(dt)
    q_rope = torch.randn(batch, heads, rope, generator=gen, device=dev).to(dt)
    return q_latent, q_rope, cache, indptr, indices


def copy_bandwidth_gbps(dev: str) -> float:
    """The decode roofline's measure (an eager device-to-device copy of 4 GiB: read + write bytes / time), so both
    benchmarks' floors are one figure. (Until 2026-12-04 this script timed a 1 GiB copy replayed in a CUDA graph:
    2,767 GB/s on the H200 the day the decode roofline's copy measured 4,297, so its x floor columns were 1.55x
    too low.)"""
    if dev != "cuda":
        return 4270.0  # the H200's datasheet figure, for the CPU smoke's arithmetic only
    return copy_bandwidth() / 1e9


def run_case(shape: str, batch: int, context: int, vs: list, copy_gbps: float, dims: tuple, dev: str) -> list:
    kv_lora, rope = dims
    heads = SHAPES[shape]
    q_latent, q_rope, cache, indptr, indices = make_case(heads, batch, context, kv_lora, rope, dev, batch * 7 + context)
    scale = (128 + 64) ** -0.5
    read_bytes = batch * context * (kv_lora + rope) * cache.element_size()
    floor_us = read_bytes / (copy_gbps * 1e9) * 1e6
    reference = None
    rows = []
    for v in vs:
        rule = v.splits or v.config.num_splits
        splits = rule(batch, heads, num_sms(q_latent.device))
        out = torch.empty_like(q_latent)

        def step(v=v, splits=splits, out=out) -> None:
            mla_decode_fwd(q_latent, q_rope, cache, indptr, indices, scale, splits, v.config, out)

        try:
            us = cuda_graph_ms(step, replays=20) * 1e3 if dev == "cuda" else (step() or 0.0)
        except Exception as e:  # noqa: BLE001 - a sweep config the GPU cannot run (shared memory): say so, go on
            if v.label.endswith("*"):
                raise  # the engine's default must run
            print(f"  {v.label}: failed ({type(e).__name__}: {str(e)[:160]})", flush=True)
            rows.append({"shape": shape, "batch": batch, "context": context, "config": v.label, "default": False,
                         "splits": splits, "us": None, "error": f"{type(e).__name__}: {str(e)[:300]}"})  # fmt: skip
            continue
        if reference is None:
            reference = out.float().clone()
        diff = (out.float() - reference).abs().max().item()
        if not diff <= MAX_DIFF:
            raise AssertionError(f"{shape} batch {batch} ctx {context} {v.label}: max diff {diff} vs the default")
        rows.append(
            {
                "shape": shape,
                "batch": batch,
                "context": context,
                "config": v.label,
                "default": v.label.endswith("*"),
                **dataclasses.asdict(v.config),
                "splits": splits,
                "us": round(us, 2),
                "gbps": round(read_bytes / (us * 1e-6) / 1e9, 1) if us else 0.0,
                "x_floor": round(us / floor_us, 2) if us else 0.0,
                "max_diff": diff,
            }
        )
    return rows


def rank(rows: list) -> list:
    """Per config: the geometric mean over cells of time / the cell's best time, best first."""
    best, ratios = {}, {}
    rows = [r for r in rows if r["us"] is not None]
    for r in rows:
        key = (r["shape"], r["batch"], r["context"])
        best[key] = min(best.get(key, math.inf), r["us"])
    for r in rows:
        key = (r["shape"], r["batch"], r["context"])
        ratios.setdefault(r["config"], []).append(r["us"] / best[key] if best[key] > 0 else 1.0)
    scores = [(label, math.exp(sum(map(math.log, rs)) / len(rs))) for label, rs in ratios.items()]
    return [{"config": label, "geomean_vs_best": round(s, 3)} for label, s in sorted(scores, key=lambda x: x[1])]


def table(rows: list) -> str:
    lines = [
        "| shape | batch | context | config | splits | us | GB/s | x floor |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        if r["us"] is None:
            lines.append(
                f"| {r['shape']} | {r['batch']} | {r['context']} | {r['config']} | {r['splits']} | failed | | |"
            )
            continue
        lines.append(
            f"| {r['shape']} | {r['batch']} | {r['context']} | {r['config']} | {r['splits']} | {r['us']:.1f} | "
            f"{r['gbps']:.0f} | {r['x_floor']:.2f} |"
        )
    return "\n".join(lines)


def summary(rows: list, ranking: list) -> str:
    """Per cell: the best config, the default and `before`; then the ranking's head."""
    lines = ["| shape | batch | context | best | us | x floor | default us | x floor | before us |", "|" + " --- |" * 9]
    cells = {}
    for r in rows:
        if r["us"] is None:
            continue
        cells.setdefault((r["shape"], r["batch"], r["context"]), []).append(r)
    for (shape, batch, ctx), rs in cells.items():
        b = min(rs, key=lambda r: r["us"])
        d = next(r for r in rs if r["default"])
        old = next((r for r in rs if r["config"] == "before"), {"us": math.nan})
        lines.append(
            f"| {shape} | {batch} | {ctx} | {b['config']} | {b['us']:.1f} | {b['x_floor']:.2f} | {d['us']:.1f} | "
            f"{d['x_floor']:.2f} | {old['us']:.1f} |"
        )
    lines.append("")
    lines.append("ranking (geomean of time / cell best): " + ", ".join(
        f"{r['config']} {r['geomean_vs_best']}" for r in ranking[:8]
    ))  # fmt: skip
    default = next(r for r in ranking if r["config"].endswith("*"))
    lines.append(f"default {default['config']} {default['geomean_vs_best']}; winner {ranking[0]['config']}")
    return "\n".join(lines)


def main(argv: Optional[list] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="folder for results.json / results.md")
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--kernel-configs", nargs="+", type=parse_kernel_config, default=None)
    p.add_argument(
        "--fill-rules",
        nargs="*",
        type=int,
        default=list(FILL_RULES),
        help="programs per SM of the earlier chunk rule, compared with the config's (none: no value)",
    )
    args = p.parse_args(argv)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    kernel_configs = args.kernel_configs or [parse_kernel_config(k) for k in KERNEL_CONFIGS]
    if dev == "cuda":
        dims, cases = (KV_LORA, ROPE), CASES
    else:  # the interpreter: the script's logic on tiny shapes
        dims, cases = (32, 16), ((1, 40), (3, 17))
        kernel_configs, args.fill_rules = kernel_configs[:2], args.fill_rules[:1]
    vs = variants(kernel_configs, args.fill_rules)
    copy_gbps = copy_bandwidth_gbps(dev)
    print(f"copy bandwidth {copy_gbps:.0f} GB/s; {len(vs)} configs x {len(cases) * len(args.shapes)} cells", flush=True)
    rows = []
    for shape in args.shapes:
        for batch, context in cases:
            rows += run_case(shape, batch, context, vs, copy_gbps, dims, dev)
            done = [r for r in rows[-len(vs) :] if r["us"] is not None]
            best = min(done, key=lambda r: r["us"])
            print(f"{shape} batch {batch} ctx {context}: best {best['config']} {best['us']:.1f} us", flush=True)
    ranking = rank(rows)
    text = summary(rows, ranking)
    print(text)
    data = {
        "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu (smoke)",
        "copy_gbps": round(copy_gbps, 1),
        "default": config_label(DEFAULT_CONFIG) + "*",
        "ranking": ranking,
        "rows": rows,
    }
    if args.out:
        write_results(args.out, data, text + "\n\n" + table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
