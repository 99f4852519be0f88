"""Decode step time of the Llama-3.1-8B shape (or a DeepSeek MoE shape) vs the HBM floor and vs transformers, on one GPU.

    python benchmark/decode_roofline/bench_decode_roofline.py [--quantization fp8] [--skip-hf] [--out DIR]
    python benchmark/decode_roofline/bench_decode_roofline.py --shape DeepSeek-V2-Lite --skip-hf --out DIR

Measures, in one run: the device-to-device copy bandwidth; transformers' decode step (generate)
at batch 1 and 64, context 1k, on the same dummy weights; our decode step (CUDA graph replay,
including the per-step attention metadata) at batch 1/8/64/256 and context 1k/8k; our prefill
throughput for 8k-token chunks. The HBM floor of a step is (weight bytes + KV bytes read) divided
by the copy bandwidth (bytes read + written per second). With ``--quantization fp8`` our model's linear
layers hold fp8 weights (the floor counts the bytes the model really holds; transformers stays bf16).
Prints a table, writes JSON + markdown.

A MoE shape (--shape DeepSeek-V2-Lite: MLA + DeepSeekMoE, batches 1 and 64 at context 1k) is counted by the bytes
its step really reads, each a printed term: the parameters every step reads whole (attention, dense and shared
MLPs, norms, routers, lm_head), the embedding rows of the batch's tokens, the routed experts the step touches
(counted per layer in an eager pass of the same batch, whose routing the graph replays), and the latent KV rows
(one 576-value row per token and layer). The batch's tokens are random and its KV rows random, so requests route
apart as real ones do. (The Llama rows keep the committed accounting: every parameter, the embedding table too.)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

from sglang.test import gpu_utils  # noqa: E402
from sglang.test.bench_utils import write_results  # noqa: E402
from sglang.test.gpu_utils import shape_config_dir  # noqa: E402

GB = 1e9


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


def our_runner(config_dir: str, quantization=None):
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
    )
    return ModelRunner(resolve_engine_config(args))


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
    slots = mr.token_to_kv_pool_allocator.alloc(n_ctx * ctx).view(n_ctx, ctx).cuda()
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
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        mr.forward(fb)
    end.record()
    torch.cuda.synchronize()
    for r in rows:
        mr.req_to_token_pool.free(r)
    mr.token_to_kv_pool_allocator.free(slots.flatten().cpu())
    return start.elapsed_time(end) / iters, shared


def experts_touched(mr, fb) -> list:
    """Distinct routed experts each MoE layer's experts run for batch `fb`: an eager forward (the graph replay
    routes the same tokens alike) with a hook on each experts module reading the routing it is handed."""
    touched = []

    def count(module, args, kwargs):
        touched.append(int(kwargs["topk_output"][1].unique().numel()))

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


def moe_floor_terms(mr, bs: int, ctx: int, touched: list) -> dict:
    """The bytes a MoE decode step reads, by term (see the module docstring)."""
    params = dict(mr.model.named_parameters())
    embed = params["model.embed_tokens.weight"]
    routed = {n: p for n, p in params.items() if ".mlp.experts." in n}
    nbytes = lambda ts: sum(t.numel() * t.element_size() for t in ts)  # noqa: E731
    per_expert = nbytes(routed.values()) / (len(touched) * mr.model.config.n_routed_experts)
    return {
        "whole_params_bytes": nbytes(p for n, p in params.items() if n not in routed and p is not embed),
        "embedding_rows_bytes": bs * embed.shape[1] * embed.element_size(),
        "experts_touched_per_layer": round(sum(touched) / len(touched), 2),
        "experts_touched_bytes": int(sum(touched) * per_expert),
        "latent_kv_bytes": bs * ctx * mr.memory_plan.cell_size_bytes,
    }


def moe_main(args, bw: float) -> None:
    """--shape NAME (a DeepSeek MoE shape): batches 1 and 64 at context 1k vs the floor of its terms."""
    mr = our_runner(shape_config_dir(args.shape))
    rows = []
    for bs in (1, 64):
        touched = []
        ms, shared = decode_step_ms(
            mr, bs, 1024, random_inputs=True, on_batch=lambda fb, t=touched: t.extend(experts_touched(mr, fb))
        )
        terms = moe_floor_terms(mr, bs, 1024, touched)
        floor_bytes = sum(v for k, v in terms.items() if k.endswith("_bytes"))
        floor_ms = floor_bytes / bw * 1000
        rows.append(
            {"batch": bs, "context": 1024, "step_ms": round(ms, 3), "hbm_floor_ms": round(floor_ms, 3),
             "ratio_to_floor": round(ms / floor_ms, 3), "kv_slots_shared": shared, **terms}
        )  # fmt: skip
    result = {
        "device": torch.cuda.get_device_name(),
        "shape": args.shape,
        "copy_bandwidth_GBps": round(bw / GB, 1),
        "decode": rows,
        "cuda_graph_max_bs": mr.config.args.cuda_graph_max_bs,
    }
    lines = [
        f"{args.shape} shape, bf16, dummy weights, {result['device']}; copy bandwidth {result['copy_bandwidth_GBps']} GB/s",
        "",
        "| batch | context | step ms | HBM floor ms | x floor | whole params GB | embedding rows MB | experts touched "
        "/ layer | experts GB | latent KV GB |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['batch']} | {r['context']} | {r['step_ms']} | {r['hbm_floor_ms']} | {r['ratio_to_floor']} | "
            f"{r['whole_params_bytes'] / GB:.3f} | {r['embedding_rows_bytes'] / 1e6:.3f} | "
            f"{r['experts_touched_per_layer']} | {r['experts_touched_bytes'] / GB:.3f} | {r['latent_kv_bytes'] / GB:.3f} |"
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
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        mr.forward(fb)
    torch.cuda.synchronize()
    elapsed = (time.perf_counter() - t) / iters
    release()
    return chunk / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument("--quantization", default=None, choices=["fp8"], help="our model's linear layers")
    parser.add_argument(
        "--decode-config",
        default="",
        help="JSON overrides of the triton backend's decode "
        'choices, e.g. {"block_n": 64, "num_warps": 8, "min_block_tokens": 256} (graphs are re-captured)',
    )
    parser.add_argument(
        "--shape",
        default="Llama-3.1-8B",
        choices=["Llama-3.1-8B", "DeepSeek-V2-Lite"],
        help="DeepSeek-V2-Lite: the MoE floor by terms (batches 1 and 64, context 1k)",
    )
    args = parser.parse_args()
    config_dir = shape_config_dir(args.shape)
    bw = copy_bandwidth()
    if args.shape != "Llama-3.1-8B":
        moe_main(args, bw)
        return
    hf = {} if args.skip_hf else hf_decode_step_ms(config_dir, [1, 64], 1024)
    mr = our_runner(config_dir, args.quantization)
    if args.decode_config:
        apply_decode_config(mr, json.loads(args.decode_config))
    # Parameters and the fp8 layers' scales: what a step reads (rotary tables and other buffers are not).
    scales = [b for name, b in mr.model.named_buffers() if name.endswith("weight_scale")]
    weight_bytes = sum(t.numel() * t.element_size() for t in [*mr.model.parameters(), *scales])
    cell = mr.memory_plan.cell_size_bytes
    rows = []
    for ctx in (1024, 8192):
        for bs in (1, 8, 64, 256):
            ms, shared = decode_step_ms(mr, bs, ctx)
            floor_ms = (weight_bytes + bs * ctx * cell) / bw * 1000
            rows.append(
                {
                    "batch": bs,
                    "context": ctx,
                    "step_ms": round(ms, 3),
                    "hbm_floor_ms": round(floor_ms, 3),
                    "ratio_to_floor": round(ms / floor_ms, 3),
                    "tokens_per_s": round(bs / ms * 1000, 1),
                    "hf_step_ms": round(hf[bs], 2) if ctx == 1024 and bs in hf else None,
                    "kv_slots_shared": shared,
                }
            )
    prefill = prefill_tokens_per_s(mr)
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "quantization": args.quantization,
        "copy_bandwidth_GBps": round(bw / GB, 1),
        "weight_GB": round(weight_bytes / GB, 3),
        "kv_cell_bytes": cell,
        "decode": rows,
        "prefill_8k_tokens_per_s": round(prefill, 1),
        "cuda_graph_max_bs": mr.config.args.cuda_graph_max_bs,
        "decode_kernel_config": vars(mr.attn_backend.kernel_config),
        "min_block_tokens": mr.attn_backend.min_block_tokens,
    }
    lines = [
        f"Llama-3.1-8B shape, {'fp8 linear layers' if args.quantization else 'bf16'}, {result['device']}; copy bandwidth {result['copy_bandwidth_GBps']} GB/s; "
        f"weights {result['weight_GB']} GB; prefill (8k-token chunk) {result['prefill_8k_tokens_per_s']} tokens/s",
        "",
        "| batch | context | step ms | HBM floor ms | x floor | tokens/s | transformers step ms |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        note = " (slots shared)" if r["kv_slots_shared"] else ""
        lines.append(
            f"| {r['batch']} | {r['context']}{note} | {r['step_ms']} | {r['hbm_floor_ms']} | {r['ratio_to_floor']} | "
            f"{r['tokens_per_s']} | {r['hf_step_ms'] if r['hf_step_ms'] is not None else '-'} |"
        )
    table = "\n".join(lines)
    print(table)
    write_results(args.out, result, table)


if __name__ == "__main__":
    main()
