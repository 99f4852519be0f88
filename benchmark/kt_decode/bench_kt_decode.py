"""KT hybrid decode against the host's memory bandwidth (Qwen3-30B-A3B or DeepSeek-V3 shape, dummy weights, one GPU).

    python benchmark/kt_decode/bench_kt_decode.py [--shape Qwen3-30B-A3B] [--methods BF16 INT8 INT4]
        [--layers 12 48] [--batches 1 4 16 64] [--gpu-experts 16] [--threads 16] [--out DIR]
    python benchmark/kt_decode/bench_kt_decode.py --shape DeepSeek-V3 --methods INT8 FP8 --layers 4 --batches 1 16
    (--methods RAWINT4: the shape as a pack-quantized INT4 checkpoint, Kimi-K2-Thinking's groups of 32)

--shape (scripts/make_model_configs.py's shapes): Qwen3-30B-A3B (128 experts of 768, hidden 2048, top-8; by
default 16 per layer on the GPU) or DeepSeek-V3 (256 experts of 2048, hidden 7168, top-8 of the noaux_tc grouped
routing: sigmoid scores plus the correction bias, 4 of 8 groups; one shared expert and MLA attention on the GPU;
by default 32 per layer on the GPU, the same eighth as Qwen's 16 of 128). --layers N is N MoE layers: DeepSeek-V3's
three dense leading layers are left out (first_k_dense_replace 0), so every layer of the model is a MoE layer and
step time / N is the time of one MoE layer, with no dense layer's GPU time in it. Host memory: one DeepSeek-V3 MoE
layer's CPU experts are ~9.9 GB in INT8 or FP8 (224 x 3 x 7168 x 2048 bytes), ~20 GB in BF16; use few layers.

1. Host bandwidth: a STREAM-style read by the CPU expert kernel's threads (and torch's sum for comparison) and
   a copy (torch copy_, bytes read + written).
2. Per method, layer count and batch: decode steps through ModelRunner (CUDA graphs, then eagerly), with
   --gpu-experts of the shape's experts per layer on the GPU and the rest on the CPU kernel. The kernel counts
   the experts each layer step reads and their bytes, so the bound is exact for the routing that ran:
       bound_ms_per_layer = bytes the CPU experts read per layer step / host read bandwidth.
3. Profile of the gap, per layer: the CPU kernel's time (route + compute, from the step's start to its last
   task), the stream-ordering overhead (a captured empty step: the GPU's writes into the pinned block, the
   hand-over -- the doorbell's stream write and wait, or two host functions -- and the read-back),
   and the rest (GPU attention, norms, router, GPU experts' tail, launch gaps).
Prints a table, writes results.json (`rows`) + results.md; DeepSeek-V3: results_deepseek_v3.json + .md (the
committed Qwen rows stay).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

from sglang.test.bench_utils import write_results  # noqa: E402
from sglang.test.gpu_utils import shape_config_dir  # noqa: E402

GB = 1e9
# --shape: the config overrides that make --layers N mean N MoE layers (and no layer the forward does not run),
# the default experts per layer on the GPU, the results' file name, and what the header line says of the shape.
SHAPES = {
    "Qwen3-30B-A3B": {"overrides": {}, "gpu_experts": 16, "results": "results", "about": ""},
    "DeepSeek-V3": {
        # The three dense leading layers would put their GPU time (attention + an 18432-wide MLP) into step time /
        # layers; the multi-token-prediction layer is never built (the model skips it at load).
        "overrides": {"first_k_dense_replace": 0, "num_nextn_predict_layers": 0},
        "gpu_experts": 32,  # an eighth of the experts, as Qwen3-30B-A3B's 16 of 128
        "results": "results_deepseek_v3",
        "about": " (every layer MoE: first_k_dense_replace 0; noaux_tc routing: sigmoid + correction bias, top-4 "
        "of 8 groups, top-8; MLA attention and 1 shared expert on the GPU)",
    },
}
CONTEXT = 512  # tokens already in each request's KV
STEPS = 12
WARMUP = 3


# ------------------------------------------------------------------ bandwidth
def host_bandwidth(threads: int, size_gb: float = 4.0) -> dict:
    from sglang.srt.layers.moe.cpu_experts.build import load_kernel_library

    lib = load_kernel_library()
    nbytes = int(size_gb * GB) // 64 * 64
    buf = torch.ones(nbytes // 4, dtype=torch.float32)  # touched: every page is resident
    lib.ktc_read_seconds(buf.data_ptr(), nbytes, threads, 1, 1)
    reps = 5
    # Each thread's share read front to back, and as 2 / 4 runs side by side with prefetch (the kernel reads
    # two rows at a time): the best is the bound's bandwidth.
    reads = {
        streams: nbytes * reps / lib.ktc_read_seconds(buf.data_ptr(), nbytes, threads, reps, streams) / GB
        for streams in (1, 2, 4)
    }
    read = max(reads.values())
    torch.set_num_threads(threads)
    buf.sum()
    t = time.perf_counter()
    for _ in range(reps):
        buf.sum()
    torch_read = nbytes * reps / (time.perf_counter() - t) / GB
    half = buf[: buf.numel() // 2]
    dst = torch.empty_like(half)
    dst.copy_(half)
    t = time.perf_counter()
    for _ in range(reps):
        dst.copy_(half)
    copy = 2 * half.numel() * 4 * reps / (time.perf_counter() - t) / GB
    return {
        "threads": threads,
        "read_GBps": read,
        "read_GBps_by_streams": reads,
        "torch_sum_read_GBps": torch_read,
        "copy_GBps": copy,
    }


# --------------------------------------------------------------------- model
# --methods RAWINT4: the shape as a pack-quantized INT4 checkpoint (Kimi-K2-Thinking's routed experts: groups of 32),
# whose dummy experts are quantized into its groups and held as they are (INT4_G32).
RAWINT4_GROUP = 32


def model_dir(shape: str, layers: int, method: str = "") -> str:
    """The shape's config.json with `layers` layers, every one of them a MoE layer (RAWINT4: with Kimi-K2-Thinking's
    quantization_config)."""
    overrides = dict(SHAPES[shape]["overrides"])
    if method == "RAWINT4":
        from sglang.test.int4_checkpoints import quantization_config

        overrides["quantization_config"] = quantization_config(RAWINT4_GROUP)
    return shape_config_dir(shape, num_hidden_layers=layers, **overrides)


def shape_info(shape: str, gpu_experts: int) -> dict:
    """What the table and the JSON say of the shape: its MoE geometry and the experts' split."""
    import json
    from types import SimpleNamespace

    from sglang.srt.configs.model_config import num_routed_experts

    with open(os.path.join(model_dir(shape, 1), "config.json")) as f:
        config = json.load(f)
    experts = num_routed_experts(SimpleNamespace(**config))  # whichever name the family gives them
    if not 0 <= gpu_experts < experts:
        raise SystemExit(f"--gpu-experts {gpu_experts}: {shape} has {experts} experts per layer (some on the CPU)")
    return {
        "shape": shape,
        "hidden": config["hidden_size"],
        "experts": experts,
        "moe_intermediate": config["moe_intermediate_size"],
        "top_k": config["num_experts_per_tok"],
        "routing": config.get("topk_method") or "softmax top-k",
        "shared_experts": config.get("n_shared_experts") or 0,
        "gpu_experts": gpu_experts,
        "cpu_experts": experts - gpu_experts,
        "overrides": SHAPES[shape]["overrides"],
    }


def runner(shape: str, method: str, layers: int, max_batch: int, threads: int, gpu_experts: int):
    from sglang.srt.configs.engine_config import resolve_engine_config
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(
        model_path=model_dir(shape, layers, method),
        load_format="dummy",
        skip_tokenizer_init=True,
        kt_method=method,
        kt_num_gpu_experts=gpu_experts,
        kt_cpuinfer=threads,
        max_running_requests=max_batch,
        cuda_graph_max_bs=max_batch,
        max_total_tokens=max_batch * (CONTEXT + 64) + 1024,
        log_level="warning",
    )
    return ModelRunner(resolve_engine_config(args))


def decode_steps(mr, batch: int, graph: bool, steps: int = STEPS):
    """Seconds of each timed decode step of `batch` requests at CONTEXT tokens (random token ids, so the
    routing varies from row to row and step to step as real text does), and the CPU kernel's counters
    over those steps."""
    engine = mr.model.kt_state.cpu_engine
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode, ModelWorkerBatch

    rows = mr.req_to_token_pool.alloc(batch)
    slots = mr.token_to_kv_pool_allocator.alloc(batch * (CONTEXT + steps + WARMUP))
    per = CONTEXT + steps + WARMUP
    for i, row in enumerate(rows):
        mr.req_to_token_pool.req_to_token[row, :per] = slots[i * per : (i + 1) * per].to(torch.int32).cuda()
    gen = torch.Generator().manual_seed(batch)
    vocab = mr.model_config.vocab_size
    times = []
    before = None
    for step in range(WARMUP + steps):
        if step == WARMUP:
            before = engine.stats()
        seq = CONTEXT + step + 1
        ids = torch.randint(0, vocab, (batch,), generator=gen).tolist()
        locs = torch.stack([slots[i * per + seq - 1] for i in range(batch)])
        fb = ForwardBatch.init_new(ModelWorkerBatch(ForwardMode.DECODE, ids, list(rows), [seq] * batch, locs), mr)
        torch.cuda.synchronize()
        t = time.perf_counter()
        if graph:
            out = mr.forward(fb)
        else:
            mr.attn_backend.init_forward_metadata(fb)
            out = mr.model.forward(fb.input_ids, fb.positions, fb)
        out.next_token_logits.argmax(-1).tolist()
        if step >= WARMUP:
            times.append(time.perf_counter() - t)
    done = engine.stats().minus(before)
    for row in rows:
        mr.req_to_token_pool.free(row)
    mr.token_to_kv_pool_allocator.free(slots)
    return times, done


def graph_ms(fn, replays: int = 200) -> float:
    """Milliseconds per replay of `fn` captured as a CUDA graph, host synchronisation included."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(replays):
        graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / replays * 1e3


def empty_step_ms(mr) -> dict:
    """A CPU-expert step with no token, captured in a graph: the stream-ordering cost per layer, whole
    (copies + hand-over) and the hand-over alone (doorbell or host functions)."""
    import ctypes

    engine = mr.model.kt_state.cpu_engine
    layer = engine.layers[0]
    x = torch.zeros(1, engine.hidden, dtype=torch.bfloat16, device="cuda")
    w = torch.zeros(1, engine.top_k, dtype=torch.float32, device="cuda")
    ids = torch.zeros(1, engine.top_k, dtype=torch.int32, device="cuda")
    real = torch.zeros(1, dtype=torch.int32, device="cuda")
    whole = graph_ms(lambda: engine.run_on_stream(layer, x, w, ids, real, lambda: torch.zeros_like(x)))

    def handover() -> None:
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        engine.lib.ktc_enqueue_submit(layer.handle, stream)
        engine.lib.ktc_enqueue_wait(layer.handle, stream)

    engine.count[0] = 0
    return {"empty_step_ms": whole, "handover_ms": graph_ms(handover), "handover": engine.handover}


def rebuild_engine(mr, threads: int, doorbell: bool) -> None:
    """Rebuild the model's CPU expert engine with `threads` threads and the doorbell or host functions (as when
    the doorbell's self-test fails), and capture the decode graphs again (they point at the engine's buffers).
    Benchmark only: the server builds the engine once."""
    import dataclasses
    from unittest import mock

    from sglang.srt.layers.moe.cpu_experts import engine as engine_module
    from sglang.srt.layers.moe.kt_ep_wrapper import KTEPWrapperMethod
    from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner

    kt = mr.model.kt_state
    kt.config = dataclasses.replace(kt.config, cpu_threads=threads)
    mr.cuda_graph_runner = None
    kt.cpu_engine = None
    gc.collect()
    no_doorbell = mock.patch.object(engine_module, "_stream_memops_fail_reason", lambda lib: "host functions asked")
    with contextlib.nullcontext() if doorbell else no_doorbell:
        for module in mr.model.modules():
            if isinstance(module, KTEPWrapperMethod) and module.cpu_layer is not None:
                module.cpu_experts = kt.register_cpu_experts(module)
    mr.cuda_graph_runner = CudaGraphRunner(mr)


def bench_model(
    shape: dict,
    method: str,
    layers: int,
    batches: list[int],
    threads: int,
    read_gbps: float,
    sweep: list[int],
    compare_host_functions: bool,
) -> list[dict]:
    """`shape`: shape_info's record. Every layer of the model is a MoE layer (SHAPES' overrides), so the CPU
    kernel's layer steps per decode step equal `layers` and step time / layers is one MoE layer's time."""
    mr = runner(shape["shape"], method, layers, max(batches), threads, shape["gpu_experts"])
    engine_layers = len(mr.model.kt_state.cpu_engine.layers)
    if engine_layers != layers:
        raise RuntimeError(f"{shape['shape']}: {engine_layers} layers with CPU experts, expected {layers} (all MoE)")
    if mr.cuda_graph_runner is None:  # ModelRunner falls back to eager decode when the capture fails
        raise RuntimeError("no decode CUDA graphs were captured: the CUDA graph rows would run eagerly")
    rows = []
    ends = sorted({1, max(batches)})
    doorbell = mr.model.kt_state.cpu_engine.handover == "doorbell"
    cases = [(threads, doorbell, True, b) for b in batches] + [(threads, doorbell, False, b) for b in ends]
    cases += [(t, doorbell, True, b) for t in sweep if t != threads for b in ends]
    if compare_host_functions and doorbell:
        cases += [(threads, False, True, b) for b in ends]
    current = (threads, doorbell)
    overhead = empty_step_ms(mr)
    for count, bell, graph, batch in cases:
        if (count, bell) != current:
            rebuild_engine(mr, count, bell)
            current = (count, bell)
            overhead = empty_step_ms(mr)
        times, done = decode_steps(mr, batch, graph)
        step_ms = statistics.median(times) * 1e3
        bytes_per_layer = done.bytes_read / done.steps
        bound = bytes_per_layer / (read_gbps * GB) * 1e3
        kernel = done.compute_ns / done.steps / 1e6
        rows.append(
            {
                "shape": shape["shape"],
                "experts_on_gpu": shape["gpu_experts"],
                "experts_on_cpu": shape["cpu_experts"],
                "method": method,
                "threads": count,
                "zero_copy": mr.model.kt_state.cpu_engine.device_inputs is not None,
                "host_wait": "block",  # KT models on CUDA (ModelRunner.init_torch_distributed)
                "int8_activations": any(layer.int8_dot for layer in mr.model.kt_state.cpu_engine.layers),
                "batch": batch,
                "layers": layers,
                "cuda_graph": graph,
                "ms_per_step": step_ms,
                "ms_per_layer": step_ms / layers,
                "bound_ms_per_layer": bound,
                "ratio_to_bound": step_ms / layers / bound,
                "tokens_per_s": batch / (step_ms / 1e3),
                "bound_tokens_per_s": batch / (bound * layers / 1e3),
                "host_read_GBps": read_gbps,
                "cpu_experts_per_layer": done.experts_read / done.steps,
                "cpu_bytes_per_layer": bytes_per_layer,
                "cpu_kernel_ms_per_layer": kernel,
                "stream_held_ms_per_layer": done.wait_blocked_ns / done.steps / 1e6,
                **overhead,
                "rest_ms_per_layer": step_ms / layers - kernel - overhead["empty_step_ms"],
                "layer_steps_timed": done.steps,
            }
        )
        r = rows[-1]
        print(
            f"{shape['shape']} {method} L{layers} bs{batch} graph={graph} threads={count}: "
            f"{r['ms_per_layer']:.3f} ms/layer, bound {bound:.3f} ({r['ratio_to_bound']:.2f}x), "
            f"{r['tokens_per_s']:.1f} tok/s, kernel {kernel:.3f} ms, "
            f"{r['cpu_experts_per_layer']:.1f} of {shape['cpu_experts']} CPU experts, {r['handover']}",
            flush=True,
        )
    mr.shutdown()
    del mr
    gc.collect()
    torch.cuda.empty_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="Qwen3-30B-A3B", choices=list(SHAPES))
    parser.add_argument("--methods", nargs="*", default=["BF16", "INT8", "INT4"])
    parser.add_argument("--layers", nargs="*", type=int, default=[12])
    parser.add_argument("--batches", nargs="*", type=int, default=[1, 4, 16, 64])
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument(
        "--gpu-experts",
        type=int,
        default=None,
        help="experts per layer on the GPU (default: 16 for Qwen3-30B-A3B, 32 for DeepSeek-V3)",
    )
    parser.add_argument("--big-methods", nargs="*", default=None, help="methods for layer counts above 12")
    parser.add_argument("--thread-sweep", nargs="*", type=int, default=[], help="also run these thread counts")
    parser.add_argument(
        "--compare-host-functions",
        action="store_true",
        help="also run batch 1 and the largest batch with host functions instead of the doorbell",
    )
    parser.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    args = parser.parse_args()
    gpu_experts = SHAPES[args.shape]["gpu_experts"] if args.gpu_experts is None else args.gpu_experts
    shape = shape_info(args.shape, gpu_experts)
    bandwidth = [host_bandwidth(args.threads), host_bandwidth(max(1, args.threads // 2))]
    read = max(bandwidth[0]["read_GBps"], bandwidth[0]["torch_sum_read_GBps"])  # the best measured read
    for b in bandwidth:
        print(
            f"host bandwidth, {b['threads']} threads: read {b['read_GBps']:.1f} GB/s (by streams per thread "
            f"{', '.join(f'{k}: {v:.1f}' for k, v in b['read_GBps_by_streams'].items())}; torch sum "
            f"{b['torch_sum_read_GBps']:.1f}), copy {b['copy_GBps']:.1f} GB/s",
            flush=True,
        )
    rows = []
    for layers in args.layers:
        methods = args.methods if layers <= 12 or args.big_methods is None else args.big_methods
        for method in methods:
            sweep = args.thread_sweep if layers == min(args.layers) and method == methods[0] else []
            compare = args.compare_host_functions and layers == min(args.layers)
            rows += bench_model(shape, method, layers, args.batches, args.threads, read, sweep, compare)
            report(args, shape, read, bandwidth, rows)  # after each model: a run cut short keeps what it measured


def report(args, shape: dict, read: float, bandwidth: list, rows: list) -> None:
    lines = [
        f"{shape['shape']} shape{SHAPES[shape['shape']]['about']}, dummy weights, {shape['gpu_experts']} of "
        f"{shape['experts']} experts per layer on the GPU, "
        f"{torch.cuda.get_device_name()}, {args.threads} CPU threads, context {CONTEXT}; host read "
        f"{read:.1f} GB/s (the bound's bandwidth)",
        "",
        "| method | layers | threads | batch | CUDA graph | ms/layer | bound ms/layer | x bound | tok/s | bound tok/s | "
        "CPU experts/layer | MB/layer | kernel ms/layer | hand-over | empty step ms | hand-over ms | rest ms/layer |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['method']} | {r['layers']} | {r['threads']} | {r['batch']} | {r['cuda_graph']} | "
            f"{r['ms_per_layer']:.3f} | {r['bound_ms_per_layer']:.3f} | {r['ratio_to_bound']:.2f} | "
            f"{r['tokens_per_s']:.1f} | {r['bound_tokens_per_s']:.1f} | {r['cpu_experts_per_layer']:.1f} | "
            f"{r['cpu_bytes_per_layer'] / 1e6:.1f} | {r['cpu_kernel_ms_per_layer']:.3f} | {r['handover']} | "
            f"{r['empty_step_ms']:.3f} | {r['handover_ms']:.3f} | {r['rest_ms_per_layer']:.3f} |"
        )
    table = "\n".join(lines)
    print(table, flush=True)
    data = {"device": torch.cuda.get_device_name(), "shape": shape, "bandwidth": bandwidth, "rows": rows}
    write_results(args.out, data, table, name=SHAPES[shape["shape"]]["results"])


if __name__ == "__main__":
    main()
