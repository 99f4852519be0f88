"""Decode step time of the Llama-3.1-8B shape (or a DeepSeek MoE shape) vs the HBM floor and vs transformers, on one GPU.

    python benchmark/decode_roofline/bench_decode_roofline.py [--quantization fp8] [--skip-hf] [--out DIR]
    python benchmark/decode_roofline/bench_decode_roofline.py --shape DeepSeek-V2-Lite --skip-hf --out DIR
    python benchmark/decode_roofline/bench_decode_roofline.py --shape Qwen3-8B --checkpoint-fp8 --skip-hf \
        --contexts 1024 --out DIR                                    # a native block-fp8 checkpoint's decode step
    python benchmark/decode_roofline/bench_decode_roofline.py --shape Qwen3-8B --checkpoint-fp8 --dry-run   # CPU
    python benchmark/decode_roofline/bench_decode_roofline.py --shape Qwen3-30B-A3B --checkpoint-int4 32 --skip-hf \
        --out DIR                          # a W4A16 MoE checkpoint's routed experts held in int4 groups of 32

Measures, in one run: the device-to-device copy bandwidth; transformers' decode step (generate)
at batch 1 and 64, context 1k, on the same dummy weights; our decode step (CUDA graph replay,
including the per-step attention metadata) at batch 1/8/64/256 and context 1k/8k; our prefill
throughput for 8k-token chunks. The HBM floor of a step is (weight bytes + KV bytes read) divided
by the copy bandwidth (bytes read + written per second). With ``--quantization fp8`` our model's linear
layers hold fp8 weights (the floor counts the bytes the model really holds; transformers stays bf16).
Prints a table, writes JSON + markdown.

A MoE shape (--shape DeepSeek-V2-Lite: MLA + DeepSeekMoE; Qwen3-30B-A3B; batches 1 and 64 at context 1k unless
--batches) is counted by the bytes its step really reads, each a printed term: the parameters every step reads whole
(attention, dense and shared MLPs, norms, routers, lm_head), the embedding rows of the batch's tokens, the routed
experts the step touches (counted per layer in an eager pass of the same batch, whose routing the graph replays),
and the KV rows (MLA: one 576-value latent row per token and layer). The batch's tokens are random and its KV rows
random, so requests route apart as real ones do. With --checkpoint-int4 G the config carries a pack-quantized
checkpoint's quantization_config (compressed-tensors W4A16 in groups of G, the routed experts only, as
Kimi-K2-Thinking's): the routed experts are held as int4 codes and fp32 group scales (the fused MoE's INT4 groups),
and their bytes are counted so. (The Llama rows keep the committed accounting: every parameter, the embedding table
too.)

Another dense shape (--shape Qwen3-8B, Gemma-2-9B, Gemma-3-27B) is counted by terms too: the fp8 weights, their scales, the other parameters
(norms, lm_head, any bf16 linear), the embedding rows of the batch's tokens, and the KV rows. With --checkpoint-fp8
its config carries a native block-fp8 checkpoint's quantization_config (quant_method fp8, weight_block_size
[128, 128]): --load-format dummy fills the layers in that format (e4m3 weights, weight_scale_inv per 128x128
block), which the GPU keeps and runs as such (layers/quantization/fp8_block_linear.py). --dry-run runs the same
code on the CPU (a tiny model of the shape's family, eager steps, no CUDA graph; fp8 layers kept as the GPU keeps
them, computed by the torch reference) to check the script, not to measure.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from typing import Callable

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

from sglang.srt.configs.model_config import num_routed_experts  # noqa: E402
from sglang.test import gpu_utils  # noqa: E402
from sglang.test.bench_utils import write_results  # noqa: E402
from sglang.test.gpu_utils import shape_config_dir  # noqa: E402

GB = 1e9
DEFAULT_OUT = os.path.dirname(os.path.abspath(__file__))  # the committed results.json (a dry run never writes it)
MOE_SHAPES = ("DeepSeek-V2-Lite", "Qwen3-30B-A3B")
MOE_BATCHES = [1, 64]
# --dry-run: the shape's family at dimensions the CPU runs in a second (multiples of 128: the fp8 blocks).
DRY_OVERRIDES = dict(
    hidden_size=256,
    intermediate_size=384,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=128,
    vocab_size=512,
    max_position_embeddings=2048,
    bos_token_id=1,
    eos_token_id=2,
)
# ... and the MoE shapes': DeepSeek's MLA, shared and routed experts, one dense layer; Qwen3-MoE's routed experts; at
# dimensions the CPU runs.
_MOE_DRY = {k: v for k, v in DRY_OVERRIDES.items() if k != "max_position_embeddings"}  # the shape's own (YaRN's)
MOE_DRY_OVERRIDES = {
    "DeepSeek-V2-Lite": dict(
        _MOE_DRY,
        moe_intermediate_size=128,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_shared_experts=1,
        first_k_dense_replace=1,
        kv_lora_rank=64,
        qk_nope_head_dim=32,
        qk_rope_head_dim=16,
        v_head_dim=32,
    ),
    "Qwen3-30B-A3B": dict(_MOE_DRY, moe_intermediate_size=128, num_experts=8, num_experts_per_tok=2),
}


def copy_bandwidth() -> float:
    x = torch.empty(4 * 1024**3, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        y.copy_(x)
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1000 / 10
    del x, y
    return 2 * 4 * 1024**3 / seconds  # bytes read + written per second


def hf_decode_step_ms(config_dir: str, batches, ctx: int) -> dict:
    from transformers import AutoConfig, AutoModelForCausalLM

    from sglang.srt.model_loader.dummy_weights import dummy_weights_iterator

    config = AutoConfig.from_pretrained(config_dir)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    params = dict(model.named_parameters())
    for name, t in dummy_weights_iterator(config, torch.bfloat16, "cuda", seed=0):
        params[name].data.copy_(t)
    out = {}
    for bs in batches:
        ids = torch.randint(0, config.vocab_size, (bs, ctx), device="cuda")

        def run(m, n: int, ids=ids) -> float:
            torch.cuda.synchronize()
            t = time.perf_counter()
            m.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
            torch.cuda.synchronize()
            return time.perf_counter() - t

        run(model, 2)
        out[bs] = (run(model, 33) - run(model, 1)) / 32 * 1000
    del model, params
    torch.cuda.empty_cache()
    return out


def cpu_copy_bandwidth(nbytes: int = 256 * 1024**2) -> float:
    """copy_bandwidth's quantity on the CPU (the dry run's floor: only that the arithmetic runs)."""
    x = torch.empty(nbytes, dtype=torch.uint8)
    y = torch.empty_like(x)
    y.copy_(x)
    t = time.perf_counter()
    y.copy_(x)
    return 2 * nbytes / (time.perf_counter() - t)


def our_runner(config_dir: str, quantization=None, **server_args):
    from sglang.srt.configs.engine_config import resolve_engine_config
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(
        model_path=config_dir,
        load_format="dummy",
        skip_tokenizer_init=True,
        max_running_requests=256,
        log_level="warning",
        quantization=quantization,
        **server_args,
    )
    return ModelRunner(resolve_engine_config(args))


def _on_cuda(mr) -> bool:
    return torch.device(mr.device).type == "cuda"


def _sync(mr) -> None:
    if _on_cuda(mr):
        torch.cuda.synchronize()


def _elapsed_ms(mr, step: Callable[[], None], iters: int) -> float:
    """Milliseconds per call of `step`, `iters` calls back to back: CUDA events on the GPU, wall time on the CPU."""
    _sync(mr)
    if not _on_cuda(mr):
        t = time.perf_counter()
        for _ in range(iters):
            step()
        return (time.perf_counter() - t) * 1000 / iters
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        step()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def apply_decode_config(mr, overrides: dict) -> None:
    """Set the backend's DecodeKernelConfig fields / min_block_tokens, then capture the graphs again."""
    from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner

    backend = mr.attn_backend
    if "min_block_tokens" in overrides:
        backend.min_block_tokens = overrides.pop("min_block_tokens")
    backend.kernel_config = dataclasses.replace(backend.kernel_config, **overrides)
    mr.cuda_graph_runner = None
    torch.cuda.empty_cache()
    mr.cuda_graph_runner = CudaGraphRunner(mr)
    print(f"decode config: {backend.kernel_config}, min_block_tokens {backend.min_block_tokens}")


def decode_step_ms(
    mr, bs: int, ctx: int, iters: int = 30, random_inputs: bool = False, on_batch=None
) -> tuple[float, bool]:
    """Our decode step; when bs*ctx slots exceed the pool, requests share one context's slots. random_inputs:
    random token ids and KV rows (MoE routing apart per request); on_batch(fb) runs before the timing."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode, ModelWorkerBatch

    shared = bs * ctx > mr.token_to_kv_pool_allocator.available_size()
    rows = mr.req_to_token_pool.alloc(bs)
    n_ctx = 1 if shared else bs
    slots = mr.token_to_kv_pool_allocator.alloc(n_ctx * ctx).view(n_ctx, ctx).to(mr.device)
    for i, r in enumerate(rows):
        mr.req_to_token_pool.req_to_token[r, :ctx] = slots[0 if shared else i].to(torch.int32)
    input_ids = [7] * bs
    if random_inputs:
        gen = torch.Generator().manual_seed(bs)
        input_ids = torch.randint(100, mr.model_config.vocab_size, (bs,), generator=gen).tolist()
        flat = slots.flatten()
        for buf in mr.token_to_kv_pool.buffers():
            if buf.is_floating_point():
                buf[flat] = torch.randn((flat.numel(), *buf.shape[1:]), device=buf.device, dtype=buf.dtype)
    batch = ModelWorkerBatch(
        ForwardMode.DECODE,
        input_ids=input_ids,
        req_pool_indices=rows,
        seq_lens=[ctx] * bs,
        out_cache_loc=slots[0 if shared else slice(None), -1].reshape(-1).expand(bs).contiguous().cpu(),
    )
    fb = ForwardBatch.init_new(batch, mr)
    if on_batch is not None:
        on_batch(fb)
    for _ in range(3):
        mr.forward(fb)
    ms = _elapsed_ms(mr, lambda: mr.forward(fb), iters)
    for r in rows:
        mr.req_to_token_pool.free(r)
    mr.token_to_kv_pool_allocator.free(slots.flatten().cpu())
    return ms, shared


def experts_touched(mr, fb) -> list:
    """Distinct routed experts each MoE layer's experts run for batch `fb`: an eager forward (the graph replay
    routes the same tokens alike) with a hook on each experts module reading the routing it is handed (DeepSeek's
    computed top-k), or computing it from the router logits it is handed as the module does (softmax top-k).
    Ids past the routed experts (DeepSeek's shared experts as slots at one token) are not counted: the shared MLP's
    weights are in the whole-parameters term already."""
    from sglang.srt.layers.moe.topk import select_experts

    touched = []
    routed = num_routed_experts(mr.model.config)

    def count(module, args, kwargs):
        topk = kwargs.get("topk_output")
        if topk is None:
            logits = kwargs["router_logits"] if "router_logits" in kwargs else args[1]
            topk = select_experts(logits, module.top_k, module.renormalize)
        ids = topk[1]
        touched.append(int(ids[ids < routed].unique().numel()))

    handles = [
        m.register_forward_pre_hook(count, with_kwargs=True)
        for name, m in mr.model.named_modules()
        if name.endswith(".mlp.experts")
    ]
    graphs, mr.cuda_graph_runner = mr.cuda_graph_runner, None
    try:
        mr.forward(fb)
    finally:
        mr.cuda_graph_runner = graphs
        for h in handles:
            h.remove()
    return touched


def floor_ms(terms: dict, bw: float) -> float:
    """The HBM floor of a step's terms (every ``*_bytes`` entry read once) at copy bandwidth ``bw``, in ms."""
    return sum(v for k, v in terms.items() if k.endswith("_bytes")) / bw * 1000


def moe_floor_terms(mr, bs: int, ctx: int, touched: list) -> dict:
    """The bytes a MoE decode step reads, by term (see the module docstring)."""
    params = dict(mr.model.named_parameters())
    embed = params["model.embed_tokens.weight"]
    routed = {n: p for n, p in params.items() if ".mlp.experts." in n}
    nbytes = lambda ts: sum(t.numel() * t.element_size() for t in ts)  # noqa: E731
    per_expert = nbytes(routed.values()) / (len(touched) * num_routed_experts(mr.model.config))
    return {
        "whole_params_bytes": nbytes(p for n, p in params.items() if n not in routed and p is not embed),
        "embedding_rows_bytes": bs * embed.shape[1] * embed.element_size(),
        "experts_touched_per_layer": round(sum(touched) / len(touched), 2),
        "experts_touched_bytes": int(sum(touched) * per_expert),
        "kv_bytes": bs * ctx * mr.memory_plan.cell_size_bytes,
    }


def moe_main(args, bw: float) -> None:
    """--shape NAME (a DeepSeek MoE shape): batches 1 and 64 at context 1k vs the floor of its terms (a dry run: a
    tiny model of the family, batches 1 and 8 at context 128, on the CPU)."""
    overrides = dict(MOE_DRY_OVERRIDES[args.shape]) if args.dry_run else {}
    if args.checkpoint_int4:
        from sglang.test.int4_checkpoints import quantization_config

        overrides["quantization_config"] = quantization_config(args.checkpoint_int4)
    if args.dry_run:
        mr = our_runner(shape_config_dir(args.shape, **overrides), device="cpu", max_total_tokens=4096)
    else:
        mr = our_runner(shape_config_dir(args.shape, **overrides))
    ctx, iters = (128, 3) if args.dry_run else (1024, 30)
    rows = []
    for bs in args.batches:
        touched = []
        ms, shared = decode_step_ms(
            mr, bs, ctx, iters, random_inputs=True, on_batch=lambda fb, t=touched: t.extend(experts_touched(mr, fb))
        )
        terms = moe_floor_terms(mr, bs, ctx, touched)
        floor = floor_ms(terms, bw)
        rows.append(
            {"batch": bs, "context": ctx, "step_ms": round(ms, 3), "hbm_floor_ms": round(floor, 3),
             "ratio_to_floor": round(ms / floor, 3), "kv_slots_shared": shared, **terms}
        )  # fmt: skip
    result = {
        "device": "cpu (dry run)" if args.dry_run else torch.cuda.get_device_name(),
        "shape": args.shape,
        "variant": _variant(args),
        "experts": mr.model.model.layers[-1].mlp.experts.quant_method.name,
        "copy_bandwidth_GBps": round(bw / GB, 1),
        "decode": rows,
        "cuda_graph_max_bs": mr.config.args.cuda_graph_max_bs,
    }
    lines = [
        f"{args.shape} shape, {result['variant']} (routed experts {result['experts']}), dummy weights, "
        f"{result['device']}; copy bandwidth {result['copy_bandwidth_GBps']} GB/s",
        "",
        "| batch | context | step ms | HBM floor ms | x floor | whole params GB | embedding rows MB | experts touched "
        "/ layer | experts GB | KV GB |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['batch']} | {r['context']} | {r['step_ms']} | {r['hbm_floor_ms']} | {r['ratio_to_floor']} | "
            f"{r['whole_params_bytes'] / GB:.3f} | {r['embedding_rows_bytes'] / 1e6:.3f} | "
            f"{r['experts_touched_per_layer']} | {r['experts_touched_bytes'] / GB:.3f} | {r['kv_bytes'] / GB:.3f} |"
        )
    table = "\n".join(lines)
    print(table)
    write_results(args.out, result, table)


def extend_batch(mr, batch: int, length: int):
    """`batch` new prompts of `length` synthetic tokens: gpu_utils.extend_batch's (ForwardBatch, release)."""
    ids = [11 + (i % 1000) for i in range(batch * length)]
    return gpu_utils.extend_batch(mr, [ids[i * length : (i + 1) * length] for i in range(batch)])


def prefill_tokens_per_s(mr, chunk: int = 8192, iters: int = 5) -> float:
    fb, release = extend_batch(mr, 1, chunk)
    mr.forward(fb)
    _sync(mr)
    t = time.perf_counter()
    for _ in range(iters):
        mr.forward(fb)
    _sync(mr)
    elapsed = (time.perf_counter() - t) / iters
    release()
    return chunk / elapsed


def dense_floor_terms(mr, bs: int, ctx: int) -> dict:
    """The bytes a dense model's decode step reads, by term: fp8 weights, their scales (a native checkpoint's
    weight_scale_inv parameters, --quantization fp8's weight_scale buffers), the other parameters but the
    embedding table (norms, lm_head, bf16 linears), the batch's embedding rows, and the KV rows."""
    params = dict(mr.model.named_parameters())
    embed = params.pop("model.embed_tokens.weight")
    # Tied embeddings: lm_head reads the whole table every step (then counted with the other parameters).
    tied = any(p is embed for n, p in mr.model.named_parameters(remove_duplicate=False) if "embed_tokens" not in n)
    if tied:
        params["model.embed_tokens.weight"] = embed
    named = [*params.items(), *mr.model.named_buffers()]
    scales = {n for n, _ in named if n.endswith((".weight_scale", ".weight_scale_inv"))}
    nbytes = lambda ts: sum(t.numel() * t.element_size() for t in ts)  # noqa: E731
    fp8 = [p for n, p in params.items() if p.dtype == torch.float8_e4m3fn]
    return {
        "fp8_weights_bytes": nbytes(fp8),
        "scales_bytes": nbytes(t for n, t in named if n in scales),
        "other_params_bytes": nbytes(
            p for n, p in params.items() if n not in scales and p.dtype != torch.float8_e4m3fn
        ),
        "embedding_rows_bytes": 0 if tied else bs * embed.shape[1] * embed.element_size(),
        "kv_bytes": bs * ctx * mr.memory_plan.cell_size_bytes,
    }


def whole_weight_bytes(mr) -> int:
    """The committed Llama accounting: every parameter (the embedding table too) and fp8 scale buffers."""
    scales = [b for name, b in mr.model.named_buffers() if name.endswith("weight_scale")]
    return sum(t.numel() * t.element_size() for t in [*mr.model.parameters(), *scales])


def keep_block_fp8_on_cpu() -> None:
    """The dry run: keep a block-fp8 checkpoint's layers in fp8 on the CPU as the GPU does (the CPU dequantizes them
    at load otherwise; its fp8 layers compute the same sum with the torch reference), so the floor's fp8 terms and
    the block layers' loading run here as they will there."""
    import sglang.srt.configs.model_config as model_config

    model_config.linear_weight_format = lambda quant, *rest: (
        "fp8_block" if quant and quant.strategy == "block" else None
    )


def _variant(args) -> str:
    if args.checkpoint_int4:
        return f"W4A16 checkpoint (int4 groups of {args.checkpoint_int4})"
    if args.checkpoint_fp8:
        return "native block-fp8 checkpoint (dummy weights)"
    return "fp8 linear layers (--quantization fp8)" if args.quantization else "bf16"


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=DEFAULT_OUT)
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument("--quantization", default=None, choices=["fp8"], help="our model's linear layers")
    parser.add_argument(
        "--checkpoint-fp8",
        action="store_true",
        help="the shape as a native block-fp8 checkpoint (quantization_config fp8, weight_block_size [128, 128])",
    )
    parser.add_argument(
        "--checkpoint-int4",
        type=int,
        default=0,
        metavar="GROUP",
        help="a MoE shape as a pack-quantized W4A16 checkpoint (compressed-tensors, the routed experts in groups of "
        "GROUP)",
    )
    parser.add_argument(
        "--decode-config",
        default="",
        help="JSON overrides of the triton backend's decode "
        'choices, e.g. {"block_n": 64, "num_warps": 8, "min_block_tokens": 256} (graphs are re-captured)',
    )
    parser.add_argument(
        "--shape",
        default="Llama-3.1-8B",
        choices=["Llama-3.1-8B", "Qwen3-8B", "Gemma-2-9B", "Gemma-3-27B", *MOE_SHAPES],
        help="DeepSeek-V2-Lite, Qwen3-30B-A3B: the MoE floor by terms (batches 1 and 64 unless --batches, context "
        "1k); the others but Llama-3.1-8B: a dense floor by terms",
    )
    parser.add_argument("--batches", type=int, nargs="+", default=None, help="default 1 8 64 256 (MoE: 1 64)")
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 8192])
    parser.add_argument("--dry-run", action="store_true", help="CPU check of the script: a tiny model, eager steps")
    args = parser.parse_args()
    if args.checkpoint_fp8 and args.quantization:
        parser.error("--checkpoint-fp8 is a pre-quantized checkpoint: --quantization does not apply")
    if args.checkpoint_fp8 and args.shape in MOE_SHAPES:
        parser.error("--checkpoint-fp8 is for the dense shapes")
    if args.checkpoint_int4 and args.shape not in MOE_SHAPES:
        parser.error("--checkpoint-int4 is for the MoE shapes (its routed experts)")
    if args.batches is None:
        args.batches = MOE_BATCHES if args.shape in MOE_SHAPES else [1, 8, 64, 256]
    return args


def dense_config_dir(args) -> str:
    """The shape's config (tiny in a dry run), with a block-fp8 quantization_config for --checkpoint-fp8."""
    from sglang.test.fp8_checkpoints import quantization_config

    overrides = dict(DRY_OVERRIDES) if args.dry_run else {}
    if args.dry_run and args.shape.startswith("Gemma"):  # a sliding-window layer and a full one, a window that fits
        overrides.update(layer_types=["sliding_attention", "full_attention"], sliding_window=64)
    if args.checkpoint_fp8:
        overrides["quantization_config"] = quantization_config("block")
    return shape_config_dir(args.shape, **overrides)


def decode_rows(mr, args, bw: float, iters: int) -> list:
    """Our decode step at every batch and context vs the HBM floor (by terms for shapes other than Llama's)."""
    by_terms = args.shape != "Llama-3.1-8B"
    weight_bytes = whole_weight_bytes(mr)
    cell = mr.memory_plan.cell_size_bytes
    rows = []
    for ctx in args.contexts:
        for bs in args.batches:
            ms, shared = decode_step_ms(mr, bs, ctx, iters=iters)
            terms = dense_floor_terms(mr, bs, ctx) if by_terms else {}
            floor = floor_ms(terms if by_terms else {"floor_bytes": weight_bytes + bs * ctx * cell}, bw)
            rows.append(
                {
                    "batch": bs,
                    "context": ctx,
                    "step_ms": round(ms, 3),
                    "hbm_floor_ms": round(floor, 3),
                    "ratio_to_floor": round(ms / floor, 3),
                    "tokens_per_s": round(bs / ms * 1000, 1),
                    "kv_slots_shared": shared,
                    **terms,
                }
            )
    return rows


def decode_table(result: dict, rows: list, hf: dict) -> str:
    terms = "fp8_weights_bytes" in rows[0]
    lines = [
        f"{result['shape']} shape, {result['variant']}, {result['device']}; copy bandwidth "
        f"{result['copy_bandwidth_GBps']} GB/s; weights {result['weight_GB']} GB; prefill (8k-token chunk) "
        f"{result['prefill_8k_tokens_per_s']} tokens/s",
        "",
        "| batch | context | step ms | HBM floor ms | x floor | tokens/s | transformers step ms |"
        + (" fp8 weights GB | scales MB | other params GB | embedding rows MB | KV GB |" if terms else ""),
        "|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" * 5 if terms else ""),
    ]
    for r in rows:
        note = " (slots shared)" if r["kv_slots_shared"] else ""
        hf_ms = hf.get(r["batch"]) if r["context"] == 1024 else None
        line = (
            f"| {r['batch']} | {r['context']}{note} | {r['step_ms']} | {r['hbm_floor_ms']} | {r['ratio_to_floor']} | "
            f"{r['tokens_per_s']} | {round(hf_ms, 2) if hf_ms is not None else '-'} |"
        )
        if terms:
            line += (
                f" {r['fp8_weights_bytes'] / GB:.3f} | {r['scales_bytes'] / 1e6:.1f} | "
                f"{r['other_params_bytes'] / GB:.3f} | {r['embedding_rows_bytes'] / 1e6:.3f} | {r['kv_bytes'] / GB:.3f} |"
            )
        lines.append(line)
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    if args.dry_run:
        args.skip_hf, args.batches, args.contexts = True, [1, 8], [128]
        args.out = args.out if args.out != DEFAULT_OUT else tempfile.mkdtemp(prefix="roofline-dry-run-")
        keep_block_fp8_on_cpu()
        bw = cpu_copy_bandwidth()
    else:
        bw = copy_bandwidth()
    if args.shape in MOE_SHAPES:
        moe_main(args, bw)
        return
    config_dir = dense_config_dir(args)
    hf = {} if args.skip_hf else hf_decode_step_ms(config_dir, [1, 64], 1024)
    # The graphs up to the largest batch measured (capturing past it costs minutes on the deep shapes).
    runner_args = (
        dict(device="cpu", max_total_tokens=4096) if args.dry_run else dict(cuda_graph_max_bs=max(args.batches))
    )
    mr = our_runner(config_dir, args.quantization, **runner_args)
    if args.decode_config:
        apply_decode_config(mr, json.loads(args.decode_config))
    rows = decode_rows(mr, args, bw, iters=3 if args.dry_run else 30)
    for r in rows:
        r["hf_step_ms"] = round(hf[r["batch"]], 2) if r["context"] == 1024 and r["batch"] in hf else None
    prefill = prefill_tokens_per_s(mr, chunk=256 if args.dry_run else 8192, iters=1 if args.dry_run else 5)
    on_gpu = _on_cuda(mr)
    result = {
        "device": torch.cuda.get_device_name() if on_gpu else "CPU (dry run)",
        "torch": torch.__version__,
        "shape": args.shape,
        "variant": _variant(args),
        "quantization": args.quantization,
        "checkpoint_fp8": args.checkpoint_fp8,
        "copy_bandwidth_GBps": round(bw / GB, 1),
        "weight_GB": round(whole_weight_bytes(mr) / GB, 3),
        "kv_cell_bytes": mr.memory_plan.cell_size_bytes,
        "decode": rows,
        "prefill_8k_tokens_per_s": round(prefill, 1),
        "cuda_graph_max_bs": mr.config.args.cuda_graph_max_bs,
    }
    if on_gpu:
        result["decode_kernel_config"] = vars(mr.attn_backend.kernel_config)
        result["min_block_tokens"] = mr.attn_backend.min_block_tokens
    table = decode_table(result, rows, hf)
    print(table)
    write_results(args.out, result, table)


if __name__ == "__main__":
    main()
