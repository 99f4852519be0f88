"""Where the MLA latent kernel's time goes, by knockout: stage 1 (triton_ops/mla_decode.py) with parts of its loop
body taken out, on DeepSeek-V2-Lite's attention shape (16 heads, kv_lora 512 + rope 64, bf16, context 1k), with the
rows at shuffled slots (a pool after churn) and at contiguous ones (a fresh pool).

    python benchmark/mla/bench_mla_decode_parts.py [--batches 16 64 256] [--kernel-config 64,4,3] [--out DIR]
    python benchmark/mla/bench_mla_decode_parts.py --buffers 2 3 5 [--out DIR]     # CPU only, TRITON_INTERPRET unset

Variants (each a copy of the kernel module with its loop body edited, launched with the default config and chunk
count, or with --kernel-config's BLOCK_N,num_warps,num_stages[,BLOCK_H[,programs per SM]] as bench_mla_decode.py
takes it): the full kernel; without the scores' latent dot (the rope part's dot alone makes the scores); without the
probabilities' dot into the latent (each row's values summed instead, so the rows are still read); and loads only (no
dot at all: the rows summed into the accumulator); and, on contiguous slots only, the full kernel with each row's
slot computed instead of loaded from kv_indices (what the index load before each step's row copies costs: compiled
for sm_90 at the default 2 stages, the pipelined loop in compile_for_sm90's ttgir issues each step's index load as a
plain load after the dots, right before the next step's row copies, so two memory latencies a step are serial).
What a variant computes is garbage, its time is the point. Compiled for sm_90, the edited loops are not always the
same schedule with less work: "loads only" holds no copy buffer (its rows are plain loads), and without the index
load the pipeliner gives every stage to the row copies (at 3 stages the computed-slots variant holds two row buffers
where the full kernel holds one; at 5 it needs 315,392 bytes of shared memory and does not launch: `--buffers`). Each
cell is stage 1 + the merge as one CUDA graph replay, us per layer; the floor is one read of the rows at the copy
bandwidth (the decode roofline's measure).

`--buffers STAGES...` times nothing: it compiles each variant's stage 1 for sm_90 with triton's ptxas, as the chunked
launch compiles it (the compile test's "MLA decode over the latent cache" case with DIRECT off and the launch's
alignment facts; `test/unit/layers/test_kernels_compile_for_hopper.py`), at each stage count, and prints its shared
memory and the software pipeline's row buffers (`ring_depths`). No GPU needed; the process must not interpret
triton.

On the CPU (TRITON_INTERPRET=1) it runs every variant once on a tiny case (no timings): the edits still apply and
compile under the interpreter.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
from types import ModuleType

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_mla_decode import KV_LORA, ROPE, SHAPES, copy_bandwidth_gbps, make_case, parse_kernel_config  # noqa: E402

from sglang.srt.layers.attention.triton_ops import mla_decode  # noqa: E402
from sglang.test.bench_utils import cuda_graph_ms, write_results  # noqa: E402

HEADS = SHAPES["DeepSeek-V2-Lite"]
QK_DOT = "    scores = tl.dot(ql, tl.trans(latent)) + tl.dot(qr, tl.trans(k_rope))\n"
PV_DOT = "    acc = acc * alpha[:, None] + tl.dot(p.to(dtype), latent)\n"
ROPE_SCORES = "tl.dot(qr, tl.trans(k_rope))"
SUMMED_ROWS = "tl.sum(latent.to(tl.float32), axis=0)[None, :]"
SLOTS_LOAD = "    slots = tl.load(kv_indices + first + offs_n, mask=n_ok, other=0).to(tl.int64)\n"
VARIANTS = {
    "full": {},
    "no latent QK dot": {QK_DOT: f"    scores = {ROPE_SCORES}\n"},
    "no PV dot": {PV_DOT: f"    acc = acc * alpha[:, None] + {SUMMED_ROWS}\n"},
    "loads only": {
        QK_DOT: f"    scores = tl.zeros_like({ROPE_SCORES}) + tl.sum(k_rope.to(tl.float32), axis=1)[None, :]\n",
        PV_DOT: f"    acc = acc * alpha[:, None] + {SUMMED_ROWS}\n",
    },
    # The contiguous layout's slot of row j is j + 1 (slot 0 is the pool's padding slot): the slots computed, not
    # loaded, so the row copies no longer wait on the index load before them. Garbage on shuffled slots: not run.
    "computed slots": {SLOTS_LOAD: "    slots = (first + offs_n + 1).to(tl.int64)\n"},
}
CONTIGUOUS_ONLY = {"computed slots"}


def variant_module(name: str, edits: dict, folder: str) -> ModuleType:
    """A copy of mla_decode with `edits` (exact lines of _attend_rows) applied, imported under its own name."""
    source = open(mla_decode.__file__).read()
    for old, new in edits.items():
        if old not in source:
            raise SystemExit(f"{name}: the kernel no longer has the line {old.strip()!r}: update this benchmark")
        source = source.replace(old, new)
    module_name = "mla_decode_" + "_".join(name.split())
    path = os.path.join(folder, module_name + ".py")
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # the frozen dataclass looks its module up
    spec.loader.exec_module(module)
    return module


def run(batches: list, context: int, dev: str, kernel_config: dict | None = None) -> tuple[list, float]:
    gbps = copy_bandwidth_gbps(dev)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        modules = {name: variant_module(name, edits, folder) for name, edits in VARIANTS.items()}
        for batch in batches:
            q_latent, q_rope, cache, indptr, shuffled = make_case(HEADS, batch, context, KV_LORA, ROPE, dev, batch)
            contiguous = torch.arange(1, cache.shape[0], dtype=torch.int32, device=dev)
            floor_us = batch * context * (KV_LORA + ROPE) * cache.element_size() / (gbps * 1e3)
            for layout, indices in (("shuffled", shuffled), ("contiguous", contiguous)):
                for name, module in modules.items():
                    if layout != "contiguous" and name in CONTIGUOUS_ONLY:
                        continue
                    out = torch.empty(batch, HEADS, KV_LORA, dtype=q_latent.dtype, device=dev)

                    case = (q_latent, q_rope, cache, indptr, indices)
                    # The variant's own config class: each copy of the module defines one.
                    config = module.MLADecodeConfig(**(kernel_config or {}))

                    def step(module=module, out=out, case=case, config=config) -> None:
                        module.mla_decode_fwd(*case, 0.1, out=out, config=config)

                    step()
                    us = cuda_graph_ms(step, 50) * 1e3 if dev == "cuda" else None
                    rows.append(
                        {
                            "batch": batch,
                            "context": context,
                            "slots": layout,
                            "variant": name,
                            "us": round(us, 2) if us else None,
                            "x_floor": round(us / floor_us, 2) if us else None,
                            "floor_us": round(floor_us, 2),
                        }
                    )
                    print(rows[-1], flush=True)
    return rows, gbps


def pipeline_buffers(stages: list) -> list:
    """Each variant's stage 1 compiled for sm_90 at each stage count: its shared memory (bytes) and its rings (tile
    shape, buffers). The compile test's MLA case gives the pointer dtypes and constexprs (one place for them)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("--buffers compiles for the GPU: run it without TRITON_INTERPRET=1")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "decode_roofline"))
    from sass_census import load_compile_test

    compile_test = load_compile_test()
    (case,) = [c for c in compile_test._cases() if c[0] == "MLA decode over the latent cache"]
    name, _, pointers, floats, constexprs = case
    chunked = {**constexprs, "DIRECT": False}  # the launch at batch 64: chunks, then the merge
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for variant, edits in VARIANTS.items():
            kernel = variant_module(variant, edits, folder)._mla_decode_stage1
            for num_stages in stages:
                compiled = compile_test.compile_for_sm90(
                    f"{name}: {variant}", kernel, pointers, floats, chunked, num_warps=4, num_stages=num_stages,
                    aligned=True,
                )  # fmt: skip
                rings = compile_test.ring_depths(compiled)
                rows.append(
                    {"variant": variant, "stages": num_stages, "shared": compiled.metadata.shared, "rings": rings}
                )
                print(rows[-1], flush=True)
    return rows


def buffers_table(rows: list) -> str:
    stages = sorted({r["stages"] for r in rows})
    lines = [
        "MLA latent kernel (DeepSeek-V2-Lite shape) compiled for sm_90 as the chunked launch compiles it (4 warps, "
        "BLOCK_N 64, aligned): shared memory bytes (the row tile's buffers)",
        "",
        "| variant | " + " | ".join(f"{s} stages" for s in stages) + " |",
        "|---|" + "---:|" * len(stages),
    ]
    for variant in VARIANTS:
        cells = []
        for s in stages:
            (r,) = [r for r in rows if r["variant"] == variant and r["stages"] == s]
            buffers = ", ".join(f"{shape}: {depth}" for shape, depth in r["rings"]) or "none"
            cells.append(f"{r['shared']:,} ({buffers})")
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table(rows: list, device: str, gbps: float, config_text: str = "the default config") -> str:
    names = list(VARIANTS)
    lines = [
        f"MLA latent kernel by knockout, DeepSeek-V2-Lite ({HEADS} heads), bf16, {config_text}, {device}; "
        f"copy bandwidth {gbps:.0f} GB/s; us per layer (x the rows' floor)",
        "",
        "| batch | slots | floor us | " + " | ".join(names) + " |",
        "|---:|---|---:|" + "---:|" * len(names),
    ]
    cells = {}
    for r in rows:
        cells.setdefault((r["batch"], r["slots"], r["floor_us"]), {})[r["variant"]] = r
    for (batch, slots, floor_us), by_name in cells.items():
        values = [
            f"{by_name[n]['us']:.1f} ({by_name[n]['x_floor']:.2f})" if n in by_name and by_name[n]["us"] else "-"
            for n in names
        ]
        lines.append(f"| {batch} | {slots} | {floor_us:.1f} | " + " | ".join(values) + " |")
    return "\n".join(lines)


def main(argv: list | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int, nargs="+", default=[16, 64, 256])
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--kernel-config", type=parse_kernel_config, default=None, help="BN,W,S[,BH[,per SM]]")
    p.add_argument("--buffers", type=int, nargs="+", default=None, metavar="STAGES", help="compile only (no GPU)")
    p.add_argument("--out", default=None, help="folder for results.json / results.md")
    args = p.parse_args(argv)
    if args.buffers:
        rows = pipeline_buffers(args.buffers)
        text = buffers_table(rows)
        print(text)
        if args.out:
            write_results(args.out, {"compiled_for": "sm_90", "rows": rows}, text)
        return 0
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cpu":  # the interpreter's smoke: every variant once on a tiny case
        args.batches, args.context = [2], 40
    rows, gbps = run(args.batches, args.context, dev, args.kernel_config)
    device = torch.cuda.get_device_name() if dev == "cuda" else "CPU (interpreter smoke, no timings)"
    config_text = f"kernel config {args.kernel_config}" if args.kernel_config else "the default config"
    text = table(rows, device, gbps, config_text)
    print(text)
    if args.out:
        results = {"device": device, "copy_bandwidth_GBps": gbps, "kernel_config": args.kernel_config, "rows": rows}
        write_results(args.out, results, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
