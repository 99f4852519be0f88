"""Which tile config should the fused MoE (``srt/layers/moe/fused_moe_triton/fused_moe.py``) run at decode sizes?

    python3 benchmark/decode_roofline/tune_fused_moe.py --out DIR        # = scripts/device/run.sh tune-moe
    python3 benchmark/decode_roofline/tune_fused_moe.py --per-gemm --shapes DeepSeek-V2-Lite --out DIR  # tune-moe-per-gemm
    python benchmark/decode_roofline/tune_fused_moe.py --dry-run          # CPU check (interpreter, tiny shapes)

The question comes from the DeepSeek-V2-Lite decode step (README: 3.05x its HBM floor at batch 1), whose largest
item is the two expert GEMMs: 1.343 ms a step for 52 launches at ~2 TB/s, half the copy bandwidth, on the untuned
``default_configs``. For each shape (the routed experts of one GPU: DeepSeek-V2-Lite in bf16, DeepSeek-V3 with the
native checkpoint's block-FP8 experts) and batch of decode tokens it times ``fused_experts_triton`` (align, both
GEMMs, sum; no align at one token) as one CUDA graph over enough layers of distinct weights that the touched experts are several times the
L2, with every token routed to top-k distinct random experts, for every (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages)
of the grid; each config's output is checked against the default configs' output. The floor is the bytes of the experts
the batch touches (both matrices, scales included) at the measured copy bandwidth. It prints per cell the best
config, the default's time and both against the floor, then the configs ranked by the geometric mean of their time
over each cell's best; ``default_configs`` takes the winner (per BLOCK_M regime).

``--per-gemm`` times each expert GEMM alone (gate/up, then down with SiLU-and-mul in its loads) for every config of
a wider grid at one token, where the one config for both leaves V2-Lite at 1.9x the floor: the best config of each
GEMM against the best single config, each against the floor of its own matrix's touched bytes (upstream SGLang
tunes the down projection apart too).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import math
import os
import sys

import torch

if "--dry-run" in sys.argv and not torch.cuda.is_available():
    # The CPU check runs the triton kernels in the interpreter, which must be chosen before any kernel is defined.
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_decode_roofline import copy_bandwidth  # noqa: E402

from sglang.srt.layers.moe.fused_moe_triton import (  # noqa: E402
    MoEGemmConfigs,
    MoEKernelConfig,
    default_configs,
    fused_experts_triton,
)
from sglang.srt.layers.moe.fused_moe_triton.fused_moe import invoke_moe_gemm  # noqa: E402
from sglang.srt.layers.moe.fused_moe_triton.moe_align import moe_align_block_size  # noqa: E402
from sglang.srt.layers.moe.layer import make_moe_layer  # noqa: E402
from sglang.test.bench_utils import cuda_graph_ms, write_results  # noqa: E402

# name -> (experts, hidden, moe intermediate, top-k, the experts' method on the GPU)
SHAPES = {
    "DeepSeek-V2-Lite": (64, 2048, 1408, 6, "BF16"),
    "DeepSeek-V3": (256, 7168, 2048, 8, "FP8"),
    "Qwen3-30B-A3B": (128, 2048, 768, 8, "BF16"),
    # a W4A16 checkpoint's experts held as they are (groups of 32: llm-compressor's and Kimi-K2-Thinking's; 128)
    "Qwen3-30B-A3B-int4-g32": (128, 2048, 768, 8, "INT4_G32"),
    "Qwen3-30B-A3B-int4-g128": (128, 2048, 768, 8, "INT4"),
    # the same experts in MXFP4 (e2m1 codes, an e8m0 scale per 32 inputs: --kt-method MXFP4's GPU experts)
    "Qwen3-30B-A3B-mxfp4": (128, 2048, 768, 8, "MXFP4"),
}
DRY_SHAPES = {
    "tiny-bf16": (8, 128, 128, 2, "BF16"),
    "tiny-fp8": (8, 256, 128, 2, "FP8"),
    "tiny-int4-g32": (8, 128, 128, 2, "INT4_G32"),
    "tiny-mxfp4": (8, 128, 128, 2, "MXFP4"),
}
BATCHES = (1, 8, 32, 64)
L2_BYTES = 50 * 1024**2
TOUCHED_OVER_L2 = 4  # distinct layers until the touched experts are this many L2s
MAX_LAYER_BYTES = 40 * 1024**3  # the layers' weights of one shape stay under this
# Decode tiles: at most 64 tokens x top-k over the experts leaves a few slots per expert, so BLOCK_M 64 (the prefill
# default, timed as the default where it applies) only wastes its rows; each config is two triton compiles per shape,
# so the grid stays at 54 to fit one device call.
GRID = dict(
    block_m=(16, 32),
    block_n=(32, 64, 128),
    block_k=(64, 128, 256),
    warps_stages=((4, 3), (4, 4), (8, 4)),
)
DRY_GRID = dict(block_m=(16,), block_n=(32, 64), block_k=(64, 128), warps_stages=((4, 3),))
# --per-gemm: each GEMM alone at one token (or a few), where one config for both may not suit both: the down GEMM
# of V2-Lite at one token is 6 slots x 16 tiles of 128 columns, 96 programs on 132 SMs.
PER_GEMM_GRID = dict(
    block_m=(16,),
    block_n=(32, 64, 128, 256),
    block_k=(64, 128, 256),
    warps_stages=((4, 3), (4, 4), (8, 3)),
)
MAX_REL_DIFF = 2e-2  # configs differ by accumulation order only


def configs(grid: dict) -> list[MoEKernelConfig]:
    return [
        MoEKernelConfig(block_m=m, block_n=n, block_k=k, num_warps=w, num_stages=s)
        for m, n, k, (w, s) in itertools.product(
            grid["block_m"], grid["block_n"], grid["block_k"], grid["warps_stages"]
        )
    ]


def label(c: MoEKernelConfig | MoEGemmConfigs) -> str:
    if isinstance(c, MoEGemmConfigs):
        return label(c.up) if c.up == c.down else f"{label(c.up)}+{label(c.down)}"
    return f"m{c.block_m}n{c.block_n}k{c.block_k}w{c.num_warps}s{c.num_stages}"


def random_layer(experts: int, hidden: int, inter: int, method: str, device: str, seed: int):
    """One layer's expert weights in `method`'s layout, random (fp8 / int4 / mxfp4: random codes and scales)."""
    with torch.device(device):
        layer = make_moe_layer(experts, hidden, inter, torch.bfloat16, method)
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, p in layer.named_parameters():
        if p.dtype == torch.float8_e4m3fn:
            p.data.copy_((torch.randn(p.shape, generator=gen, device=device) * 64).clamp(-448, 448).to(p.dtype))
        elif p.dtype == torch.uint8 and "scale" in name:  # mxfp4's e8m0 exponents: scales of 2**-9 .. 2**0
            p.data.copy_(torch.randint(118, 128, p.shape, generator=gen, device=device, dtype=torch.uint8))
        elif p.dtype == torch.uint8:  # int4 / mxfp4: two random codes a byte
            p.data.copy_(torch.randint(0, 256, p.shape, generator=gen, device=device, dtype=torch.uint8))
        elif p.dtype == torch.float32:  # block scales
            p.data.copy_(torch.rand(p.shape, generator=gen, device=device) * 1e-3 + 1e-4)
        else:
            p.data.copy_(torch.randn(p.shape, generator=gen, device=device, dtype=torch.float32).to(p.dtype) * 0.02)
    return layer.quant_method.gemm_weights(layer)


def touched_bytes(w13, w2, topk_ids: torch.Tensor) -> int:
    """Bytes of the experts the batch routes to: both matrices and their scales."""
    per_expert = sum(
        (w.weight[0].numel() * w.weight.element_size())
        + (0 if w.scale is None else w.scale[0].numel() * w.scale.element_size())
        for w in (w13, w2)
    )
    return int(torch.unique(topk_ids).numel()) * per_expert


def routing(batch: int, experts: int, top_k: int, device: str, seed: int):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(batch)]).to(torch.int32)
    weights = torch.rand(batch, top_k, generator=gen)
    return (weights / weights.sum(-1, keepdim=True)).to(device), ids.to(device)


def batch_inputs(batch: int, experts: int, top_k: int, hidden: int, device: str):
    """A batch's routing (top-k distinct random experts a token, their weights) and its bf16 activations."""
    topk_w, topk_ids = routing(batch, experts, top_k, device, batch)
    x = (torch.randn(batch, hidden, generator=torch.Generator().manual_seed(batch)) * 0.5).to(device, torch.bfloat16)
    return topk_w, topk_ids, x


def run_layers(weights: list, x, topk_w, topk_ids, cfg: MoEGemmConfigs) -> None:
    for w13, w2 in weights:
        fused_experts_triton(x, w13, w2, topk_w, topk_ids, cfg)


def tune_shape(name: str, shape: tuple, batches: tuple, grid: dict, device: str, gbps: float) -> list[dict]:
    experts, hidden, inter, top_k, method = shape
    first = random_layer(experts, hidden, inter, method, device, 0)
    per_layer = sum(w.weight.numel() * w.weight.element_size() for w in first)
    bs1 = touched_bytes(*first, routing(1, experts, top_k, device, 1)[1])
    layers = (
        1
        if device != "cuda"
        else max(1, min(math.ceil(TOUCHED_OVER_L2 * L2_BYTES / bs1), MAX_LAYER_BYTES // per_layer))
    )
    weights = [first] + [random_layer(experts, hidden, inter, method, device, i) for i in range(1, layers)]
    rows = []
    for batch in batches:
        topk_w, topk_ids, x = batch_inputs(batch, experts, top_k, hidden, device)
        floor_ms = layers * touched_bytes(*first, topk_ids) / (gbps * 1e9) * 1e3 if gbps else 0.0
        default = default_configs(batch, top_k, experts, first[0].packed)
        ref = fused_experts_triton(x, *first, topk_w, topk_ids, default).float()
        cells = {}
        for cfg in [default] + [MoEGemmConfigs.both(c) for c in configs(grid) if MoEGemmConfigs.both(c) != default]:
            try:
                out = fused_experts_triton(x, *first, topk_w, topk_ids, cfg).float()
            except Exception as e:  # a config triton cannot build (shared memory) is skipped, counted
                cells[label(cfg)] = {"error": f"{type(e).__name__}: {str(e)[:120]}"}
                continue
            rel = ((out - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()
            if rel > MAX_REL_DIFF:
                raise AssertionError(f"{name} batch {batch} {label(cfg)}: {rel:.3g} off the default config's output")
            step = functools.partial(run_layers, weights, x, topk_w, topk_ids, cfg)
            ms = cuda_graph_ms(step) if device == "cuda" else 0.0
            cells[label(cfg)] = {"ms": ms, "x_floor": ms / floor_ms if floor_ms else None}
        timed = {k: v for k, v in cells.items() if "ms" in v}
        best = min(timed, key=lambda k: timed[k]["ms"])
        rows.append(dict(shape=name, method=method, batch=batch, layers=layers, floor_ms=floor_ms, default=label(default),
                         best=best, cells=cells))  # fmt: skip
        top = sorted(timed, key=lambda k: timed[k]["ms"])[:5]  # printed as it goes: a cut run keeps each cell's leaders
        print(f"{name} ({method}) batch {batch}: best {best} {timed[best]['ms']:.3f} ms, default {label(default)} "
              f"{timed[label(default)]['ms']:.3f} ms, floor {floor_ms:.3f} ms ({layers} layers); top "
              + ", ".join(f"{k} {timed[k]['ms']:.3f}" for k in top), flush=True)  # fmt: skip
    return rows


def gemm_steps(weights: list, x, topk_w, topk_ids, cfg: MoEKernelConfig):
    """The two expert GEMMs of every layer as two steps, on the routing `fused_experts_triton` makes for `cfg`."""
    num_tokens, top_k = topk_ids.shape
    slots = num_tokens * top_k
    if num_tokens == 1:
        route = topk_ids.reshape(-1).contiguous()
    else:
        route = moe_align_block_size(topk_ids, cfg.block_m, weights[0][0].weight.shape[0])
    w13, w2 = weights[0]
    cache1 = torch.empty((slots, w13.n), dtype=x.dtype, device=x.device)
    cache2 = torch.empty((slots, w2.n), dtype=x.dtype, device=x.device)
    scores = topk_w.reshape(-1).to(torch.float32).contiguous()

    def up() -> None:
        for a, _ in weights:
            invoke_moe_gemm(x, a, cache1, route, slots, top_k, None, cfg)

    def down() -> None:
        for _, b in weights:
            invoke_moe_gemm(cache1, b, cache2, route, slots, 1, scores, cfg, a_gated=True)

    return up, down, cache1, cache2


def tune_per_gemm(name: str, shape: tuple, batches: tuple, grid: dict, device: str, gbps: float) -> list[dict]:
    """Each GEMM alone for every config: the best of each against the best single config for both."""
    experts, hidden, inter, top_k, method = shape
    first = random_layer(experts, hidden, inter, method, device, 0)
    one_expert = [w.weight[0].numel() * w.weight.element_size()
                  + (0 if w.scale is None else w.scale[0].numel() * w.scale.element_size())
                  for w in first]  # fmt: skip
    layers = 1 if device != "cuda" else max(1, math.ceil(TOUCHED_OVER_L2 * L2_BYTES / (top_k * sum(one_expert))))
    weights = [first] + [random_layer(experts, hidden, inter, method, device, i) for i in range(1, layers)]
    rows = []
    for batch in batches:
        topk_w, topk_ids, x = batch_inputs(batch, experts, top_k, hidden, device)
        touched = int(torch.unique(topk_ids).numel())
        floors = [layers * touched * b / (gbps * 1e9) * 1e3 if gbps else 0.0 for b in one_expert]
        default = default_configs(batch, top_k, experts, first[0].packed)
        up, down, c1, c2 = gemm_steps(weights[:1], x, topk_w, topk_ids, default.up)
        up(), down()
        refs = (c1.float().clone(), c2.float().clone())
        cells = {}
        for cfg in list(dict.fromkeys([default.up, default.down, *configs(grid)])):
            try:
                up, down, c1, c2 = gemm_steps(weights[:1], x, topk_w, topk_ids, cfg)
                up(), down()
            except Exception as e:  # a config triton cannot build (shared memory) is skipped, counted
                cells[label(cfg)] = {"error": f"{type(e).__name__}: {str(e)[:120]}"}
                continue
            for ref, got, which in ((refs[0], c1, "up"), (refs[1], c2, "down")):
                rows_used = topk_ids.reshape(-1) >= 0
                rel = ((got.float() - ref)[rows_used].abs().max() / ref[rows_used].abs().max().clamp_min(1e-6)).item()
                if rel > MAX_REL_DIFF:
                    raise AssertionError(f"{name} batch {batch} {label(cfg)} {which}: {rel:.3g} off the default's")
            up, down, _, _ = gemm_steps(weights, x, topk_w, topk_ids, cfg)
            ms = [cuda_graph_ms(up), cuda_graph_ms(down)] if device == "cuda" else [0.0, 0.0]
            cells[label(cfg)] = {"up_ms": ms[0], "down_ms": ms[1], "ms": ms[0] + ms[1]}
            print(f"  {label(cfg)}: up {ms[0]:.4f} ms, down {ms[1]:.4f} ms", flush=True)  # a cut run keeps these
        # The defaults once more, last: the first config timed may pay for a cold start the others do not.
        again = {}
        for g, cfg in (("up", default.up), ("down", default.down)):
            up, down, _, _ = gemm_steps(weights, x, topk_w, topk_ids, cfg)
            again[g] = cuda_graph_ms(up if g == "up" else down) if device == "cuda" else 0.0
        timed = {k: v for k, v in cells.items() if "ms" in v}
        best = {g: min(timed, key=lambda k: timed[k][f"{g}_ms"]) for g in ("up", "down")}
        joint = min(timed, key=lambda k: timed[k]["ms"])
        rows.append(dict(shape=name, method=method, batch=batch, layers=layers, floor_up_ms=floors[0],
                         floor_down_ms=floors[1], default_up=label(default.up), default_down=label(default.down),
                         default_again_up_ms=again["up"], default_again_down_ms=again["down"], best_up=best["up"],
                         best_down=best["down"], best_joint=joint, cells=cells))  # fmt: skip
        for g, f in (("up", floors[0]), ("down", floors[1])):
            top = sorted(timed, key=lambda k: timed[k][f"{g}_ms"])[:5]
            d = label(getattr(default, g))
            print(f"{name} ({method}) batch {batch} {g}: default {d} {timed[d][f'{g}_ms']:.3f} ms "
                  f"(again, last: {again[g]:.3f}), floor "
                  f"{f:.3f} ms ({layers} layers); top " + ", ".join(f"{k} {timed[k][f'{g}_ms']:.3f}" for k in top),
                  flush=True)  # fmt: skip
    return rows


def per_gemm_table(rows: list[dict]) -> str:
    out = ["| shape | batch | layers | GEMM | floor ms | default | ms | again ms | x floor | best | ms | x floor | best for both | ms |",
           "| --- | ---: | ---: | --- | ---: | --- | ---: | ---: | ---: | --- | ---: | ---: | --- | ---: |"]  # fmt: skip
    for r in rows:
        for g in ("up", "down"):
            f = r[f"floor_{g}_ms"]
            d, b, j = r["cells"][r[f"default_{g}"]], r["cells"][r[f"best_{g}"]], r["cells"][r["best_joint"]]
            xf = lambda ms, f=f: f"{ms / f:.2f}" if f else "-"  # noqa: E731
            out.append(f"| {r['shape']} | {r['batch']} | {r['layers']} | {g} | {f:.3f} | {r[f'default_{g}']} | "
                       f"{d[f'{g}_ms']:.3f} | {r[f'default_again_{g}_ms']:.3f} | {xf(d[f'{g}_ms'])} | {r[f'best_{g}']} | "
                       f"{b[f'{g}_ms']:.3f} | "
                       f"{xf(b[f'{g}_ms'])} | {r['best_joint']} | {j[f'{g}_ms']:.3f} |")  # fmt: skip
    return "\n".join(out)


def ranking(rows: list[dict], block_m: int) -> list[tuple[str, float]]:
    """Configs of one BLOCK_M ranked by the geometric mean of time over each cell's best (cells where all ran)."""
    names = [k for k in rows[0]["cells"] if k.startswith(f"m{block_m}n")]
    scores = []
    for k in names:
        ratios = []
        for r in rows:
            timed = {n: v["ms"] for n, v in r["cells"].items() if "ms" in v}
            if k not in timed or not timed[k]:
                break
            ratios.append(timed[k] / min(timed.values()))
        else:
            scores.append((k, math.exp(sum(map(math.log, ratios)) / len(ratios))))
    return sorted(scores, key=lambda s: s[1])


def table(rows: list[dict]) -> str:
    out = ["| shape | experts | batch | layers | floor ms | best | ms | x floor | default | ms | x floor |",
           "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | --- | ---: | ---: |"]  # fmt: skip
    for r in rows:
        b, d = r["cells"][r["best"]], r["cells"][r["default"]]
        xf = lambda c: f"{c['x_floor']:.2f}" if c.get("x_floor") else "-"  # noqa: E731
        out.append(f"| {r['shape']} | {r['method']} | {r['batch']} | {r['layers']} | {r['floor_ms']:.3f} | {r['best']} | "
                   f"{b['ms']:.3f} | {xf(b)} | {r['default']} | {d['ms']:.3f} | {xf(d)} |")  # fmt: skip
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES)[:3], choices=list(SHAPES))  # the int4 ones on request
    ap.add_argument("--batches", nargs="+", type=int, default=None)
    ap.add_argument("--out", default=None, help="folder for results.json / results.md")
    ap.add_argument("--per-gemm", action="store_true", help="time each GEMM alone (default batch: 1)")
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes and grid on the CPU (TRITON_INTERPRET=1)")
    args = ap.parse_args()
    device = "cpu" if args.dry_run else "cuda"
    shapes = DRY_SHAPES if args.dry_run else {k: SHAPES[k] for k in args.shapes}
    grid = DRY_GRID if args.dry_run else PER_GEMM_GRID if args.per_gemm else GRID
    batches = (1, 4) if args.dry_run else tuple(args.batches or ((1,) if args.per_gemm else BATCHES))
    gbps = 0.0 if args.dry_run else copy_bandwidth() / 1e9
    print(f"copy bandwidth {gbps:.0f} GB/s; {len(configs(grid))} configs" + (" (dry run)" if args.dry_run else ""))
    if args.per_gemm:
        rows = [r for name, shape in shapes.items() for r in tune_per_gemm(name, shape, batches, grid, device, gbps)]
        text = per_gemm_table(rows)
        print(text)
        if args.out:
            write_results(args.out, dict(copy_bandwidth_GBps=gbps, rows=rows), text)
        return
    rows = [r for name, shape in shapes.items() for r in tune_shape(name, shape, batches, grid, device, gbps)]
    text = table(rows)
    for m in grid["block_m"]:
        ranked = ranking(rows, m)[:6]
        text += f"\n\nBLOCK_M {m}, ranked (geomean of time / cell best): " + ", ".join(
            f"{k} {s:.3f}" for k, s in ranked
        )
    print(text)
    if args.out:
        write_results(args.out, dict(copy_bandwidth_GBps=gbps, rows=rows), text)


if __name__ == "__main__":
    main()
