"""What a KT CPU-expert step costs the GPU's stream per layer with nothing to compute, by mechanism (GPU machine).

    python3 benchmark/kt_decode/probe_doorbell.py [--layers 48] [--replays 50]

A decode step hands every MoE layer's tokens to the host and waits for the CPU experts' mixture. With no
token to compute, what is left is the hand-over itself. Each variant is captured as one CUDA graph of
--layers hand-overs (so the graph launch is amortised) and timed per layer:

- kernels only:    the GPU writes the inputs into mapped pinned memory and reads an output back (no host);
- host functions:  cuLaunchHostFunc start + wait (the engine's path, zero tokens), without / with the kernels;
- stream memops:   cuStreamWriteValue32 of a doorbell word in pinned memory, which a host thread polls and
                   answers by writing a done word, cuStreamWaitValue32 on it; without / with the kernels.
                   The answering thread here is Python: an upper bound;
- doorbell:        the engine's own: its C++ pool threads answer, zero tokens.

The memops variant also checks that every replay's read of the host's answer is fresh (a stale cached read
would show as a wrong value). Prints a table; writes results.json / results.md to --out.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

import torch  # noqa: E402

from sglang.test.bench_utils import write_results  # noqa: E402

WAIT_EQ = 1  # CU_STREAM_WAIT_VALUE_EQ


def graph_ms_per_layer(enqueue_layer, layers: int, replays: int, before_replay=None) -> float:
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for layer in range(layers):
            enqueue_layer(layer)
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for layer in range(layers):
                enqueue_layer(layer)
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(replays):
            if before_replay is not None:
                before_replay()
            graph.replay()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t) / replays / layers * 1e3)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--replays", type=int, default=50)
    parser.add_argument("--out", default=tempfile.mkdtemp(prefix="kt-doorbell-"))
    args = parser.parse_args()
    sys.setswitchinterval(1e-5)  # the answering thread spins in Python; let the main thread in quickly

    from sglang.srt.layers.moe.cpu_experts import CpuExpertsEngine
    from sglang.srt.layers.moe.layer import make_moe_layer

    hidden, inter, top_k, experts = 2048, 768, 8, 8
    engine = CpuExpertsEngine(8, hidden, inter, top_k, experts, 0, 64, True, 2000)
    moe = make_moe_layer(experts, hidden, inter, torch.bfloat16, "BF16")
    handle = engine.add_layer(moe, moe.quant_method)
    x = torch.zeros(1, hidden, dtype=torch.bfloat16, device="cuda")
    w = torch.zeros(1, top_k, device="cuda")
    ids = torch.zeros(1, top_k, dtype=torch.int32, device="cuda")
    real = torch.zeros(1, dtype=torch.int32, device="cuda")

    libcuda = ctypes.CDLL("libcuda.so.1")
    write32, wait32 = libcuda.cuStreamWriteValue32_v2, libcuda.cuStreamWaitValue32_v2
    for fn in (write32, wait32):
        fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
        fn.restype = ctypes.c_int

    words = torch.zeros(64, dtype=torch.int32, pin_memory=True)  # go at 0, done at 16: separate cache lines
    view = words.numpy()
    go_addr, done_addr = words.data_ptr(), words.data_ptr() + 64
    counter = torch.zeros(1, dtype=torch.float32, device="cuda")  # changes every replay
    results = torch.zeros(args.layers, dtype=torch.float32, device="cuda")
    data_in, data_out = engine.device_inputs, engine.device_out  # mapped pinned buffers
    host_in, host_out = engine.inputs.numpy(), engine.out.numpy()

    stop = threading.Event()
    answered = [0]

    def answer() -> None:  # the host side of the doorbell: poll go, compute a fresh value, ring done
        while not stop.is_set():
            v = int(view[0])
            if v == 0:
                continue
            view[0] = 0
            host_out[0, 0] = 2.0 * host_in[16] + 1.0  # a value only this replay's input gives
            view[16] = v
            answered[0] += 1

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()

    def stream_handle() -> ctypes.c_void_p:
        return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

    def kernels(layer: int) -> None:
        data_in[16:17].copy_(counter + layer)
        results[layer : layer + 1].copy_(data_out[0, :1])

    def memops(layer: int, with_kernels: bool) -> None:
        if with_kernels:
            data_in[16:17].copy_(counter + layer)
        s = stream_handle()
        assert write32(s, go_addr, layer + 1, 0) == 0
        assert wait32(s, done_addr, layer + 1, WAIT_EQ) == 0
        assert write32(s, done_addr, 0, 0) == 0
        if with_kernels:
            results[layer : layer + 1].copy_(data_out[0, :1])
            if layer == args.layers - 1:
                counter.add_(1.0)

    def host_functions(layer: int, with_kernels: bool) -> None:
        if with_kernels:
            engine.run_on_stream(handle, x, w, ids, real, lambda: torch.zeros_like(x))
        else:
            s = stream_handle()
            engine.lib.ktc_enqueue_submit(handle.handle, s)
            engine.lib.ktc_enqueue_wait(handle.handle, s)

    rows = []

    def record(name: str, enqueue_layer) -> None:
        try:
            us = graph_ms_per_layer(enqueue_layer, args.layers, args.replays) * 1e3
        except (AssertionError, RuntimeError) as e:  # e.g. a call the capture refused
            print(f"{name}: failed: {e!r}", flush=True)
            us = float("nan")
        rows.append({"variant": name, "us_per_layer": us})
        print(f"{name}: {us:.1f} us per layer", flush=True)

    record("kernels only (mapped write + read)", kernels)
    record("host functions", lambda i: host_functions(i, False))
    record("host functions + kernels (engine step)", lambda i: host_functions(i, True))
    record("stream memops", lambda i: memops(i, False))
    record("stream memops + kernels", lambda i: memops(i, True))
    # The engine's own doorbell (C++ pool threads answer), zero tokens: what a decode step pays per layer.
    bell = CpuExpertsEngine(8, hidden, inter, top_k, experts, 0, 64, True, 2000, doorbell=True)
    bell_handle = bell.add_layer(moe, moe.quant_method)
    assert bell.handover == "doorbell"
    record(
        "doorbell + kernels (engine step)",
        lambda i: bell.run_on_stream(bell_handle, x, w, ids, real, lambda: torch.zeros_like(x)),
    )
    bell.close()

    # Freshness: replay the memops + kernels graph and check each layer read this replay's answer.
    counter.zero_()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for layer in range(args.layers):
                memops(layer, True)
    torch.cuda.synchronize()
    stale = 0
    for replay in range(20):
        graph.replay()
        torch.cuda.synchronize()
        expected = 2.0 * (replay + torch.arange(args.layers, dtype=torch.float32)) + 1.0
        stale += int((results.cpu() != expected).sum())
    stop.set()
    thread.join()
    engine.close()
    print(f"freshness: {stale} stale reads of {20 * args.layers}; answered {answered[0]} doorbells", flush=True)
    lines = [
        f"KT step hand-over with no token, {args.layers} layers per graph, {torch.cuda.get_device_name()}",
        "",
        "| variant | us per layer |",
        "|---|---:|",
    ] + [f"| {r['variant']} | {r['us_per_layer']:.1f} |" for r in rows]
    lines.append(f"\nfreshness: {stale} stale reads of {20 * args.layers}")
    table = "\n".join(lines)
    print(table)
    write_results(args.out, {"rows": rows, "stale_reads": stale}, table)


if __name__ == "__main__":
    main()
