"""Where a decode step's time goes beyond its GEMMs, by knockout: the step with one kind of kernel left out.

    python benchmark/decode_roofline/bench_knockout.py [--shape Qwen3-8B] [--batches 1 8 64 256] [--rounds 2] [--out DIR]
    python benchmark/decode_roofline/bench_knockout.py --shape DeepSeek-V2-Lite --batches 1 64   # = run.sh knockout-mla

A dense shape as a native block-fp8 checkpoint (dummy weights in its format, as ``bench_decode_roofline.py
--checkpoint-fp8``), context 1k, CUDA-graph replay, recaptured for each variant: the full step; the step without
decode attention (``TritonAttnBackend._decode`` returns an unwritten buffer: no KV store, no attention kernels); without
the rotary kernel (its fused qk-norm and KV store with it); without the skinny GEMM's split-K sum kernels (their fused
residual add, RMSNorm and quantization with them: the GEMM's output is left unwritten); without the SiLU-and-mul kernel
(where it is a kernel of its own: after a block-fp8 gate_up); and without all four, which leaves the GEMMs, lm_head and
the embedding. What a variant computes is garbage, its time is the point: how much shorter the step gets without that
work, which is what the work costs on the step's critical path with PDL overlapping neighbours (the profiler's kernel
times overlap there, `profile_decode_step.py`). The variants alternate over the rounds; each cell is its fastest.

``--shape DeepSeek-V2-Lite`` (bf16, dummy weights, random tokens and KV so that each request routes apart) leaves out
the routing first (the router's logits and the top-k kernel: a fixed choice of distinct experts a token stands in, so
the experts' GEMMs read as many weights), then with it each of: MLA's decode attention (the backend's
``forward_mla``: the latent kernel, its split merge and W_UV), the rotary launch (with the latent's norm and store and
the query's W_UK), the experts' two GEMMs, the experts' sum, the RMSNorm kernels launched as their own (with their
residual adds); and all six, which leaves the dense projections (q / kv_a, o_proj, layer 0's MLP), lm_head and the
embedding. Its floor is the roofline's MoE floor (the experts the real routing touches).
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

from sglang.srt.layers import fused_elementwise, linear  # noqa: E402  (roofline put python/ on the path)
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend  # noqa: E402
from sglang.srt.layers.decode_gemm import kernel as gemm_kernel  # noqa: E402
from sglang.srt.layers.moe.fused_moe_triton import fused_moe  # noqa: E402
from sglang.srt.layers.quantization.block_fp8_activation import empty_block_fp8_activation  # noqa: E402
from sglang.srt.layers.rotary_embedding import RotaryEmbedding  # noqa: E402
from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner  # noqa: E402
from sglang.srt.models import deepseek_v2  # noqa: E402
from sglang.test.bench_utils import write_results  # noqa: E402
from sglang.test.fp8_checkpoints import quantization_config  # noqa: E402
from sglang.test.gpu_utils import shape_config_dir  # noqa: E402

CONTEXT = 1024
PARTS = ("attention", "rotary", "split-k sums", "silu")
MLA_SHAPES = ("DeepSeek-V2-Lite",)
MLA_PARTS = ("routing", "attention", "rotary", "expert GEMMs", "experts' sum", "norms")  # routing first: variants()


def _no_attention(self, q, k, v, layer, forward_batch, save_kv_cache, quantized):
    return torch.empty((q.shape[0], layer.tp_q_head_num, layer.v_head_dim), dtype=q.dtype, device=q.device)


def _no_rotary(self, positions, q, k, fused_set_kv_buffer_arg=None, qk_norm=None, query_absorb=None):
    return q, k


def _no_mla(self, q_nope, q_rope, latent, k_rope, w_kv_b, layer, forward_batch, save_kv_cache=True, q_latent=None):
    n = q_nope.shape[0]
    return torch.empty((n, layer.num_heads * layer.v_head_dim), dtype=q_nope.dtype, device=q_nope.device)


def _no_router(self, hidden_states):
    return torch.empty((hidden_states.shape[0], self.weight.shape[0]), dtype=torch.float32, device=self.weight.device)


def _fixed_routing():
    """Stands in for ``select_experts_grouped``: token t picks experts (t * k + j) mod E (distinct for k <= E), equal
    weights, then the shared slots where asked; built in the eager warm-up before each capture, reused by it."""
    routes: dict = {}

    def select(router_logits, config, correction_bias=None, shared=None):
        t, experts = router_logits.shape
        key = (t, shared)
        if key not in routes:
            if router_logits.is_cuda and torch.cuda.is_current_stream_capturing():
                raise RuntimeError("the fixed routing is built in the eager warm-up, not while capturing")
            k, device = config.top_k, router_logits.device
            ids = (torch.arange(t * k, device=device) % experts).view(t, k).to(torch.int32)
            weights = torch.full((t, k), 1.0 / k, dtype=torch.float32, device=device)
            if shared is not None:
                first = torch.arange(shared.first, shared.first + shared.count, device=device, dtype=torch.int32)
                ids = torch.cat([ids, first.expand(t, -1)], 1).contiguous()
                weights = torch.cat([weights, weights.new_ones(t, shared.count)], 1).contiguous()
            routes[key] = (weights, ids)
        return routes[key]

    return select


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
            "attention": [(TritonAttnBackend, "_decode", _no_attention), (TritonAttnBackend, "forward_mla", _no_mla)],
            "rotary": [(RotaryEmbedding, "forward", _no_rotary)],
            "split-k sums": [(gemm_kernel, "_sum_splits_kernel", _NoLaunch())],
            "silu": [(linear, "silu_and_mul", _no_silu)],
            "routing": [
                (deepseek_v2.MoEGate, "forward", _no_router),
                (deepseek_v2, "select_experts_grouped", _fixed_routing()),
            ],
            "expert GEMMs": [(fused_moe, "_moe_gemm_kernel", _NoLaunch())],
            "experts' sum": [(fused_moe, "_moe_sum_kernel", _NoLaunch())],
            "norms": [(fused_elementwise, "_rmsnorm_kernel", _NoLaunch())],
        }
        for part in parts:
            for owner, name, stand_in in patches[part]:
                original = getattr(owner, name)
                setattr(owner, name, stand_in)
                stack.callback(setattr, owner, name, original)
        yield


def variants(parts: tuple[str, ...] = PARTS) -> dict[str, tuple[str, ...]]:
    """The dense shapes: the full step, each part left out, all left out. The MoE shapes keep the fixed routing in
    every variant past "no routing" (the experts' GEMMs then never read an expert that garbage logits picked, whatever
    another variant leaves unwritten): "no routing + X" less "no routing" is what X costs."""
    if parts == PARTS:
        return {"full step": (), **{f"no {p}": (p,) for p in parts}, "GEMMs only": parts}
    base, rest = parts[:1], parts[1:]
    return {
        "full step": (),
        f"no {base[0]}": base,
        **{f"no {base[0]} + {p}": (*base, p) for p in rest},
        "dense GEMMs only": parts,
    }


def sweep(mr, batches: list, rounds: int, parts: tuple[str, ...] = PARTS, random_inputs: bool = False) -> dict:
    """{(variant, batch): fastest step ms over the rounds}, the graphs captured again for each variant."""
    best: dict = {}
    for _ in range(rounds):
        for name, knocked in variants(parts).items():
            with knocked_out(knocked):
                mr.cuda_graph_runner = None
                torch.cuda.empty_cache()
                mr.cuda_graph_runner = CudaGraphRunner(mr)
            for bs in batches:
                ms, _ = roofline.decode_step_ms(mr, bs, CONTEXT, iters=50, random_inputs=random_inputs)
                best[(name, bs)] = min(ms, best.get((name, bs), float("inf")))
    return best


def moe_floor_ms(mr, bs: int, bw: float) -> float:
    """The roofline's MoE floor at `bs`: the experts the real routing of random tokens touches (an eager forward)."""
    touched: list = []
    roofline.decode_step_ms(
        mr,
        bs,
        CONTEXT,
        iters=1,
        random_inputs=True,
        on_batch=lambda fb: touched.extend(roofline.experts_touched(mr, fb)),
    )
    return round(roofline.floor_ms(roofline.moe_floor_terms(mr, bs, CONTEXT, touched), bw), 3)


def table(shape: str, device: str, bw: float, rounds: int, rows: list) -> str:
    names = list(rows[0]["step_ms"])
    checkpoint = "bf16" if shape in MLA_SHAPES else "native block-fp8 checkpoint"
    head = (
        f"{shape} decode step (context {CONTEXT}, {checkpoint}, dummy weights) with kinds of kernel "
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
    parser.add_argument("--shape", default="Qwen3-8B", choices=["Llama-3.1-8B", "Qwen3-8B", *MLA_SHAPES])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_knockout.py needs a CUDA GPU")
    bw = roofline.copy_bandwidth()
    mla = args.shape in MLA_SHAPES
    overrides = {} if mla else dict(quantization_config=quantization_config("block"))
    mr = roofline.our_runner(shape_config_dir(args.shape, **overrides), cuda_graph_bs=tuple(args.batches))
    parts = MLA_PARTS if mla else PARTS
    best = sweep(mr, args.batches, args.rounds, parts, random_inputs=mla)
    device = torch.cuda.get_device_name()
    rows = [
        dict(
            batch=bs,
            hbm_floor_ms=moe_floor_ms(mr, bs, bw)
            if mla
            else round(roofline.floor_ms(roofline.dense_floor_terms(mr, bs, CONTEXT), bw), 3),
            step_ms={name: round(best[(name, bs)], 3) for name in variants(parts)},
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
