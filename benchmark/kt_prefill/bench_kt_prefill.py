"""KT hybrid MoE on the Qwen3-30B-A3B shape cut to 12 layers (dummy weights): hybrid vs full-GPU prefill.

    python benchmark/kt_prefill/bench_kt_prefill.py [--methods BF16 FP8] [--out DIR]

Per method: prefill time of 2k, 8k and 20k-token prompts through the hybrid path (experts beyond
--kt-num-gpu-experts computed on the CPU) and through the full-GPU path (every layer's experts
streamed into the shared slot), hybrid decode tokens/s at batch 1, the slot's reservation, and the
KV tokens with and without --kt-gpu-prefill-token-threshold. Prompts run as chunked prefill
(--chunked-prefill-size 8192, as the server would). Prints a table, writes JSON + markdown.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

from sglang.test.bench_utils import write_results  # noqa: E402
from sglang.test.gpu_utils import shape_config_dir  # noqa: E402

GiB = 1 << 30
NUM_GPU_EXPERTS = 16
CHUNK = 8192


def runner(method: str, threshold):
    from sglang.srt.configs.engine_config import resolve_engine_config
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(
        model_path=shape_config_dir("Qwen3-30B-A3B-12L"),
        load_format="dummy",
        skip_tokenizer_init=True,
        kt_method=method,
        kt_num_gpu_experts=NUM_GPU_EXPERTS,
        kt_gpu_prefill_token_threshold=threshold,
        kt_cpuinfer=os.cpu_count(),
        chunked_prefill_size=CHUNK,
        max_running_requests=64,
        log_level="warning",
    )
    return ModelRunner(resolve_engine_config(args))


def prefill_seconds(mr, n_tokens: int) -> float:
    """One prompt of n_tokens, in chunks of CHUNK tokens (each chunk attends to the earlier ones)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode, ModelWorkerBatch

    (row,) = mr.req_to_token_pool.alloc(1)
    slots = mr.token_to_kv_pool_allocator.alloc(n_tokens)
    mr.req_to_token_pool.req_to_token[row, :n_tokens] = slots.to(torch.int32).cuda()
    torch.cuda.synchronize()
    start = time.perf_counter()
    done = 0
    while done < n_tokens:
        n = min(CHUNK, n_tokens - done)
        batch = ModelWorkerBatch(
            ForwardMode.EXTEND,
            [3] * n,
            [row],
            [done + n],
            slots[done : done + n],
            extend_seq_lens=[n],
            extend_prefix_lens=[done],
        )
        mr.forward(ForwardBatch.init_new(batch, mr)).next_token_logits.sum().item()
        done += n
    elapsed = time.perf_counter() - start
    mr.req_to_token_pool.free(row)
    mr.token_to_kv_pool_allocator.free(slots)
    return elapsed


def decode_tokens_per_s(mr, ctx: int = 512, steps: int = 16) -> float:
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode, ModelWorkerBatch

    (row,) = mr.req_to_token_pool.alloc(1)
    slots = mr.token_to_kv_pool_allocator.alloc(ctx + steps)
    mr.req_to_token_pool.req_to_token[row, : ctx + steps] = slots.to(torch.int32).cuda()
    times = []
    for i in range(steps):
        seq = ctx + i + 1
        batch = ModelWorkerBatch(ForwardMode.DECODE, [3], [row], [seq], slots[seq - 1 : seq])
        torch.cuda.synchronize()
        t = time.perf_counter()
        mr.forward(ForwardBatch.init_new(batch, mr)).next_token_logits.argmax().item()
        times.append(time.perf_counter() - t)
    mr.req_to_token_pool.free(row)
    mr.token_to_kv_pool_allocator.free(slots)
    return 1.0 / (sum(times[2:]) / len(times[2:]))


def release(mr) -> None:
    mr.shutdown()
    del mr
    gc.collect()
    torch.cuda.empty_cache()


def bench_method(method: str, lengths) -> dict:
    base = runner(method, None)
    tokens_without = base.max_total_num_tokens
    hybrid = {n: prefill_seconds(base, n) for n in lengths}  # no threshold: always hybrid
    decode = decode_tokens_per_s(base)
    release(base)
    mr = runner(method, 1)  # threshold 1: every prefill chunk takes the full-GPU path
    reservation = mr.memory_plan.reservations_bytes["kt_full_gpu_prefill_slot"]
    prefill_seconds(mr, 1024)  # builds the slot and compiles the kernels
    full = {n: prefill_seconds(mr, n) for n in lengths}
    tokens_with = mr.max_total_num_tokens
    cell = mr.memory_plan.cell_size_bytes
    release(mr)
    return {
        "method": method,
        "reservation_bytes": reservation,
        "reservation_gib": reservation / GiB,
        "kv_tokens_without_threshold": tokens_without,
        "kv_tokens_with_threshold": tokens_with,
        "reservation_tokens": reservation / cell,
        "hybrid_prefill_s": hybrid,
        "full_gpu_prefill_s": full,
        "speedup": {n: hybrid[n] / full[n] for n in lengths},
        "hybrid_decode_tokens_per_s": decode,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--methods", nargs="*", default=["BF16", "FP8"])
    parser.add_argument("--lengths", nargs="*", type=int, default=[2048, 8192, 20480])
    parser.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    args = parser.parse_args()
    rows = [bench_method(m, args.lengths) for m in args.methods]
    lines = [
        f"Qwen3-30B-A3B shape, 12 layers, dummy weights, {NUM_GPU_EXPERTS} of 128 experts per layer on the GPU, "
        f"{torch.cuda.get_device_name()}, {os.cpu_count()} CPU threads",
        "",
        "| method | prompt tokens | hybrid prefill s | full-GPU prefill s | speed-up | reservation GiB | KV tokens without / with threshold | hybrid decode tok/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        for n in args.lengths:
            lines.append(
                f"| {r['method']} | {n} | {r['hybrid_prefill_s'][n]:.2f} | {r['full_gpu_prefill_s'][n]:.2f} | "
                f"{r['speedup'][n]:.1f}x | {r['reservation_gib']:.3f} | {r['kv_tokens_without_threshold']} / "
                f"{r['kv_tokens_with_threshold']} | {r['hybrid_decode_tokens_per_s']:.1f} |"
            )
    table = "\n".join(lines)
    print(table)
    write_results(args.out, {"device": torch.cuda.get_device_name(), "rows": rows}, table)


if __name__ == "__main__":
    main()
