"""Where a decode step's time goes beyond its GEMMs, by knockout: the step with one kind of kernel left out.

    python benchmark/decode_roofline/bench_knockout.py [--shape Qwen3-8B] [--batches 1 8 64 256] [--rounds 2] [--out DIR]

A dense shape as a native block-fp8 checkpoint (dummy weights in its format, as ``bench_decode_roofline.py
--checkpoint-fp8``), context 1k, CUDA-graph replay, recaptured for each variant: the full step; the step without
decode attention (``TritonAttnBackend._decode`` returns an unwritten buffer: no KV store, no attention kernels); without
the rotary kernel (its fused qk-norm and KV store with it); without the skinny GEMM's split-K sum kernels (their fused
residual add, RMSNorm and quantization with them: the GEMM's output is left unwritten); without the SiLU-and-mul kernel
(where it is a kernel of its own: after a block-fp8 gate_up); and without all four, which leaves the GEMMs, lm_head and
the embedding. What a variant computes is garbage, its time is the point: how much shorter the step gets without that
work, which is what the work costs on the step's critical path with PDL overlapping neighbours (the profiler's kernel
times overlap there, `profile_decode_step.py`). The variants alternate over the rounds; each cell is its fastest.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Iterator

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_decode_roofline as roofline  # noqa: E402

from sglang.srt.layers import linear  # noqa: E402  (roofline put python/ on the path)
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend  # noqa: E402
from sglang.srt.layers.decode_gemm import kernel as gemm_kernel  # noqa: E402
from sglang.srt.layers.quantization.block_fp8_activation import empty_block_fp8_activation  # noqa: E402
from sglang.srt.layers.rotary_embedding import RotaryEmbedding  # noqa: E402
from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner  # noqa: E402
from sglang.test.bench_utils import write_results  # noqa: E402
from sglang.test.fp8_checkpoints import quantization_config  # noqa: E402
from sglang.test.gpu_utils import shape_config_dir  # noqa: E402

CONTEXT = 1024
PARTS = ("attention", "rotary", "split-k sums", "silu")


def _no_attention(self, q, k, v, layer, forward_batch, save_kv_cache, quantized):
    return torch.empty((q.shape[0], layer.tp_q_head_num, layer.v_head_dim), dtype=q.dtype, device=q.device)


def _no_rotary(self, positions, q, k, fused_set_kv_buffer_arg=None, qk_norm=None):
    return q, k


class _NoLaunch:
    """Stands in for a triton kernel: ``kernel[grid](...)`` launches nothing."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def _no_silu(x, quantize=None):
    rows, cols = x.shape[0], x.shape[-1] // 2
    if quantize is None:
        return torch.empty((rows, cols), dtype=x.dtype, device=x.device)
    return empty_block_fp8_activation(rows, cols, x.dtype, quantize, x.device)


@contextlib.contextmanager
def knocked_out(parts: tuple[str, ...]) -> Iterator[None]:
    """The engine with ``parts`` left out while the graphs are captured (each launch reads these names then)."""
    with contextlib.ExitStack() as stack:
        patches = {
            "attention": (TritonAttnBackend, "_decode", _no_attention),
            "rotary": (RotaryEmbedding, "forward", _no_rotary),
            "split-k sums": (gemm_kernel, "_sum_splits_kernel", _NoLaunch()),
            "silu": (linear, "silu_and_mul", _no_silu),
        }
        for part in parts:
            owner, name, stand_in = patches[part]
            original = getattr(owner, name)
            setattr(owner, name, stand_in)
            stack.callback(setattr, owner, name, original)
        yield


def variants() -> dict[str, tuple[str, ...]]:
    return {"full step": (), **{f"no {p}": (p,) for p in PARTS}, "GEMMs only": PARTS}


def sweep(mr, batches: list, rounds: int) -> dict:
    """{(variant, batch): fastest step ms over the rounds}, the graphs captured again for each variant."""
    best: dict = {}
    for _ in range(rounds):
        for name, parts in variants().items():
            with knocked_out(parts):
                mr.cuda_graph_runner = None
                torch.cuda.empty_cache()
                mr.cuda_graph_runner = CudaGraphRunner(mr)
            for bs in batches:
                ms, _ = roofline.decode_step_ms(mr, bs, CONTEXT, iters=50)
                best[(name, bs)] = min(ms, best.get((name, bs), float("inf")))
    return best


def table(shape: str, device: str, bw: float, rounds: int, rows: list) -> str:
    names = list(variants())
    head = (
        f"{shape} decode step (context {CONTEXT}, native block-fp8 checkpoint, dummy weights) with kinds of kernel "
        f"left out, {device}, copy bandwidth {bw / 1e9:.1f} GB/s; fastest of {rounds} rounds; ms (less than the full "
        "step, x floor)\n\n| batch | HBM floor ms | "
        + " | ".join(names)
        + " |\n|---:|---:|"
        + "---:|" * len(names)
        + "\n"
    )
    lines = []
    for r in rows:
        full = r["step_ms"]["full step"]
        cells = [
            f"{ms} ({full - ms:+.3f}, {ms / r['hbm_floor_ms']:.3f})" if name != "full step" else
            f"{ms} ({ms / r['hbm_floor_ms']:.3f})"
            for name, ms in r["step_ms"].items()
        ]  # fmt: skip
        lines.append(f"| {r['batch']} | {r['hbm_floor_ms']} | " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="Qwen3-8B", choices=["Llama-3.1-8B", "Qwen3-8B"])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_knockout.py needs a CUDA GPU")
    bw = roofline.copy_bandwidth()
    config_dir = shape_config_dir(args.shape, quantization_config=quantization_config("block"))
    mr = roofline.our_runner(config_dir, cuda_graph_bs=tuple(args.batches))
    best = sweep(mr, args.batches, args.rounds)
    device = torch.cuda.get_device_name()
    rows = [
        dict(
            batch=bs,
            hbm_floor_ms=round(sum(roofline.dense_floor_terms(mr, bs, CONTEXT).values()) / bw * 1000, 3),
            step_ms={name: round(best[(name, bs)], 3) for name in variants()},
        )
        for bs in args.batches
    ]
    text = table(args.shape, device, bw, args.rounds, rows)
    print(text)
    if args.out:
        result = dict(device=device, shape=args.shape, context=CONTEXT, rounds=args.rounds, rows=rows)
        write_results(args.out, dict(result, copy_bandwidth_GBps=round(bw / 1e9, 1)), text)


if __name__ == "__main__":
    main()
