"""Host time of one scheduler decode step at N running requests, and where it goes (issue 15's GPU idle time).

    python benchmark/serving/profile_scheduler_host.py [--requests 16 64 256] [--steps 30] [--out DIR]

A one-layer, 32-wide Llama (random weights) on the CPU, so the forward costs almost nothing and the step's
time is the scheduler's own work: forming the batch, allocating KV slots, the request table, sampling
parameters, output processing, streaming. Every step of `Scheduler.step()` is timed; cProfile then splits the
same steps into the model's forward + sampling and the rest. On a GPU, with overlap scheduling (the default),
this host work runs while the GPU computes the step launched before it: the loop keeps up while it is shorter
than the GPU step (with --disable-overlap-schedule it adds to every step). Prints a table, writes results.json + results.md
to --out (default: a temporary directory; this is a diagnostic, its numbers belong to the machine it ran on).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

import torch  # noqa: E402

from sglang.test.bench_utils import write_results  # noqa: E402

TOP = 8  # functions listed per row, by their own time


def scheduler(max_requests: int):
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.server_args import ServerArgs
    from sglang.test.runners import OutputCollector, make_tiny_hf_model

    path = make_tiny_hf_model(
        "llama", tempfile.mkdtemp(prefix="sched-host-"), num_hidden_layers=1, hidden_size=32,
        intermediate_size=64, num_attention_heads=2, num_key_value_heads=1, vocab_size=256,
    )  # fmt: skip
    args = ServerArgs(
        model_path=path, device="cpu", skip_tokenizer_init=True, max_total_tokens=65536,
        max_running_requests=max_requests, log_level="warning",
    )  # fmt: skip
    return Scheduler(args, output_sink=OutputCollector())


def profile(n: int, steps: int) -> dict:
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams

    sched = scheduler(n)
    for i in range(n):
        # Nobody finishes while it is measured: timed and profiled steps both run the full batch.
        params = SamplingParams.from_dict({"max_new_tokens": 2 * steps + 32, "temperature": 0, "ignore_eos": True})
        sched.add_request(TokenizedGenerateReqInput(str(i), "", [5 + i % 50, 6, 7, 8], params, False, False))
    while sched.running_batch is None or sched.running_batch.batch_size() < n:
        sched.step()
    for _ in range(3):
        sched.step()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        sched.step()
        times.append(time.perf_counter() - t)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        sched.step()
    prof.disable()
    assert sched.running_batch.batch_size() == n, "a request finished inside the measured steps"
    stats = pstats.Stats(prof)
    total = stats.total_tt
    by_name = {f"{os.path.basename(k[0])}:{k[2]}": v for k, v in stats.stats.items()}
    model = sum(v[3] for k, v in by_name.items() if k in ("model_runner.py:forward", "model_runner.py:sample"))
    own = sorted(((v[2], k) for k, v in by_name.items()), reverse=True)[:TOP]
    step_ms = statistics.median(times) * 1e3
    return {
        "requests": n,
        "step_ms": step_ms,
        "model_share": model / total,
        "host_ms": step_ms * (1 - model / total),
        "top_own_time": [{"function": k, "share": t / total} for t, k in own],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", nargs="*", type=int, default=[16, 64, 256])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", default=tempfile.mkdtemp(prefix="sched-host-out-"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = [profile(n, args.steps) for n in args.requests]
    lines = [
        f"Scheduler.step() on the CPU ({os.cpu_count()} CPUs, torch {torch.__version__}), one-layer 32-wide Llama",
        "",
        "| running requests | step ms | forward + sample share | host ms (the rest) | top functions by own time |",
        "|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        top = ", ".join(f"{t['function']} {t['share']:.0%}" for t in r["top_own_time"][:4])
        lines.append(f"| {r['requests']} | {r['step_ms']:.2f} | {r['model_share']:.0%} | {r['host_ms']:.2f} | {top} |")
    table = "\n".join(lines)
    print(table)
    write_results(args.out, {"rows": rows}, table)


if __name__ == "__main__":
    main()
