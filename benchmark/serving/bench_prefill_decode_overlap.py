"""Can a prefill chunk and decode steps share the GPU at once? (Llama-3.1-8B shape, one GPU)

    python benchmark/serving/bench_prefill_decode_overlap.py [--decode-batches 248 64] [--green-sms 24 40 64]
        [--out DIR]

At concurrency 256 the serving benchmark's time is prefill chunks (compute-bound GEMMs, ~190 ms for 8 prompts
x 1,024 tokens) and decode steps (at batch 256 more than half of a 14.8 ms step is attention reading the KV
cache: memory-bound), one after the other on one stream. Running them at the same time could hide one under the
other. This measures that without the scheduler: one prefill forward (eager, as the server runs it) and as many
decode CUDA-graph replays as take about as long alone (batch 248 by default: at concurrency 256, 8 requests are in
the prefill chunk and the rest decode), launched

- `serial`: on one stream, the decodes after the prefill (what the server does today);
- `streams`: on two streams of equal priority (the hardware interleaves their thread blocks);
- `streams-decode-first`: the decode stream at the highest priority (its blocks are scheduled first);
- `green-N`: on two green contexts (CUDA SM partitions): the decodes on N SMs (their graph captured on that
  partition's stream: a graph captured on an ordinary stream runs on every SM wherever it is launched), the
  prefill on the rest.

Each row: the wall time until both are done, when the prefill and the last decode ended, the decode steps'
mean, and the wall time's saving against `serial`. Every variant runs `--repeats` times; the medians are
reported. `green-N` rows need cuda-bindings and a driver with green contexts; when they cannot be made the row
says why. Prints a table, writes JSON + markdown.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from typing import Optional

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "benchmark", "decode_roofline"))

from bench_decode_roofline import extend_batch, our_runner  # noqa: E402

from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner  # noqa: E402
from sglang.test.bench_utils import write_results  # noqa: E402
from sglang.test.gpu_utils import random_decode_batch, shape_config_dir  # noqa: E402


@dataclass(frozen=True)
class Timing:
    wall_ms: float  # from the common start until both streams are done
    prefill_end_ms: Optional[float]  # from the common start
    decode_end_ms: Optional[float]


def driver_call(fn, *args):
    """A cuda.bindings driver call's values; raises with the error's name when it failed."""
    err, *values = fn(*args)
    if int(err) != 0:
        raise RuntimeError(f"{fn.__name__} failed: {err}")
    return values[0] if len(values) == 1 else tuple(values)


def green_context_streams(decode_sms: int, cleanup: ExitStack) -> tuple:
    """Two streams on disjoint SM partitions: (decode stream on >= decode_sms SMs, prefill stream on the rest,
    the two SM counts). The driver rounds the first partition up to its granularity (8 SMs on Hopper)."""
    from cuda.bindings import driver

    device = driver_call(driver.cuDeviceGet, torch.cuda.current_device())
    whole = driver_call(driver.cuDeviceGetDevResource, device, driver.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM)
    groups, count, rest = driver_call(driver.cuDevSmResourceSplitByCount, 1, whole, 0, decode_sms)
    if count != 1:
        raise RuntimeError(f"no partition of {decode_sms} SMs (the driver made {count})")
    streams = []
    for resource in (groups[0], rest):
        desc = driver_call(driver.cuDevResourceGenerateDesc, [resource], 1)
        green = driver_call(
            driver.cuGreenCtxCreate, desc, device, driver.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM
        )
        cleanup.callback(driver_call, driver.cuGreenCtxDestroy, green)
        raw = driver_call(driver.cuGreenCtxStreamCreate, green, driver.CUstream_flags.CU_STREAM_NON_BLOCKING, 0)
        cleanup.callback(driver_call, driver.cuStreamDestroy, raw)
        streams.append(torch.cuda.ExternalStream(int(raw)))
    cleanup.callback(torch.cuda.empty_cache)  # runs first: blocks cached for these streams go before they do
    cleanup.callback(torch.cuda.synchronize)
    return streams[0], streams[1], groups[0].sm.smCount, rest.sm.smCount


def run_once(mr, prefill_fb, decode_fb, steps: int, decode_stream, prefill_stream) -> Timing:
    """The decode replays are launched first (a graph launch takes microseconds of host time), then the prefill
    (whose eager launches keep the host busy for part of its device time); both wait on one start event."""
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    start.record()
    decode_end = prefill_end = None
    if steps:
        decode_stream.wait_event(start)
        with torch.cuda.stream(decode_stream):
            for _ in range(steps):
                mr.forward(decode_fb)
            decode_end = torch.cuda.Event(enable_timing=True)
            decode_end.record()
    if prefill_fb is not None:
        prefill_stream.wait_event(start)
        with torch.cuda.stream(prefill_stream):
            mr.forward(prefill_fb)
            prefill_end = torch.cuda.Event(enable_timing=True)
            prefill_end.record()
    torch.cuda.synchronize()
    ends = [start.elapsed_time(e) if e is not None else None for e in (prefill_end, decode_end)]
    return Timing(max(t for t in ends if t is not None), ends[0], ends[1])


def median_timing(runs: list) -> Timing:
    def med(values):
        values = [v for v in values if v is not None]
        return round(statistics.median(values), 3) if values else None

    return Timing(
        med([r.wall_ms for r in runs]), med([r.prefill_end_ms for r in runs]), med([r.decode_end_ms for r in runs])
    )


def measure(mr, prefill_fb, decode_fb, steps: int, decode_stream, prefill_stream, repeats: int) -> Timing:
    run_once(mr, prefill_fb, decode_fb, steps, decode_stream, prefill_stream)  # warm-up (allocator, clocks)
    return median_timing(
        [run_once(mr, prefill_fb, decode_fb, steps, decode_stream, prefill_stream) for _ in range(repeats)]
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prefill", default="8x1024", help="BxL: B new prompts of L tokens (one 8k chunk)")
    parser.add_argument("--decode-batches", nargs="*", type=int, default=[248, 64])
    parser.add_argument("--context", type=int, default=1024, help="decode requests' context length")
    parser.add_argument("--green-sms", nargs="*", type=int, default=[24, 40, 64])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=os.path.join(HERE, "prefill_decode_overlap"))
    args = parser.parse_args()
    mr = our_runner(shape_config_dir("Llama-3.1-8B"))
    assert mr.cuda_graph_runner is not None, "the decode steps must be CUDA-graph replays"
    batch, length = (int(v) for v in args.prefill.lower().split("x"))
    prefill_fb, release_prefill = extend_batch(mr, batch, length)
    main_stream = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    urgent = torch.cuda.Stream(priority=-100)  # clamped to the device's highest (lower numbers run first)
    rows = []
    for bs in args.decode_batches:
        # One graph, of this batch size (quick to capture; captured again on each green context's stream below).
        mr.cuda_graph_runner = CudaGraphRunner(mr, capture_bs=[bs])
        decode_fb, req_rows, slots = random_decode_batch(mr, bs, args.context)
        prefill_alone = measure(mr, prefill_fb, decode_fb, 0, main_stream, main_stream, args.repeats)
        step_alone = measure(mr, None, decode_fb, 10, main_stream, main_stream, args.repeats).wall_ms / 10
        steps = max(1, round(prefill_alone.wall_ms / step_alone))
        variants = [("serial", main_stream, main_stream), ("streams", side, main_stream)]
        variants.append(("streams-decode-first", urgent, main_stream))
        serial_ms = None
        for name, decode_stream, prefill_stream in variants:
            t = measure(mr, prefill_fb, decode_fb, steps, decode_stream, prefill_stream, args.repeats)
            serial_ms = serial_ms or t.wall_ms
            rows.append(row(bs, steps, name, t, serial_ms, prefill_alone.wall_ms, step_alone, None))
            print_row(rows[-1])
        for sms in args.green_sms:
            try:
                with ExitStack() as cleanup:
                    decode_stream, prefill_stream, got, rest = green_context_streams(sms, cleanup)
                    # Captured on the decode partition's stream: a graph captured elsewhere runs on every SM.
                    mr.cuda_graph_runner = CudaGraphRunner(mr, capture_bs=[bs], capture_stream=decode_stream)
                    cleanup.callback(setattr, mr, "cuda_graph_runner", None)  # before its streams go
                    decode_part = measure(mr, None, decode_fb, 10, decode_stream, decode_stream, args.repeats)
                    prefill_part = measure(mr, prefill_fb, decode_fb, 0, prefill_stream, prefill_stream, args.repeats)
                    t = measure(mr, prefill_fb, decode_fb, steps, decode_stream, prefill_stream, args.repeats)
                    extra = {
                        "decode_sms": got,
                        "prefill_sms": rest,
                        "decode_step_alone_on_partition_ms": round(decode_part.wall_ms / 10, 3),
                        "prefill_alone_on_partition_ms": prefill_part.wall_ms,
                    }
                    rows.append(row(bs, steps, f"green-{got}", t, serial_ms, prefill_alone.wall_ms, step_alone, extra))
            except Exception as exc:  # noqa: BLE001 - a variant this driver cannot make: the row says why
                torch.cuda.synchronize()
                rows.append({"decode_batch": bs, "variant": f"green-{sms}", "error": f"{type(exc).__name__}: {exc}"})
            print_row(rows[-1])
        for r in req_rows:
            mr.req_to_token_pool.free(r)
        mr.token_to_kv_pool_allocator.free(slots.flatten())
    release_prefill()
    table = format_table(rows, args)
    print(table)
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "prefill": args.prefill,
        "context": args.context,
        "decode_first_stream_priority": urgent.priority,
        "rows": rows,
    }
    write_results(args.out, result, table)


def row(bs, steps, name, t: Timing, serial_ms, prefill_alone_ms, step_alone_ms, extra) -> dict:
    decode_mean = t.decode_end_ms / steps if t.decode_end_ms is not None else None
    return {
        "decode_batch": bs,
        "decode_steps": steps,
        "variant": name,
        **asdict(t),
        "decode_step_mean_ms": round(decode_mean, 3) if decode_mean is not None else None,
        "prefill_alone_ms": prefill_alone_ms,
        "decode_step_alone_ms": round(step_alone_ms, 3),
        "saving_vs_serial": round(1 - t.wall_ms / serial_ms, 3),
        **(extra or {}),
    }


def print_row(r: dict) -> None:
    print({k: v for k, v in r.items() if v is not None}, flush=True)


def format_table(rows: list, args) -> str:
    lines = [
        f"Llama-3.1-8B shape, {torch.cuda.get_device_name()}: one prefill of {args.prefill} tokens and N decode "
        f"graph replays (context {args.context}); medians of {args.repeats} runs",
        "",
        "| decode batch | N | variant | wall ms | prefill ends ms | decodes end ms | decode step ms | "
        "saving vs serial | partition alone: decode step / prefill ms |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['decode_batch']} | - | {r['variant']} | {r['error']} | | | | | |")
            continue
        alone = (
            f"{r['decode_step_alone_on_partition_ms']} / {r['prefill_alone_on_partition_ms']} "
            f"({r['decode_sms']} / {r['prefill_sms']} SMs)"
            if "decode_sms" in r
            else f"{r['decode_step_alone_ms']} / {r['prefill_alone_ms']} (all SMs)"
        )
        lines.append(
            f"| {r['decode_batch']} | {r['decode_steps']} | {r['variant']} | {r['wall_ms']} | {r['prefill_end_ms']} | "
            f"{r['decode_end_ms']} | {r['decode_step_mean_ms']} | {r['saving_vs_serial']:.1%} | {alone} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
