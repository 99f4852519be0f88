"""The elastic KT prefill slot on one H200: the KV pool keeps the slot's memory while no long prefill runs.

    python benchmark/kt_elastic/bench_kt_elastic.py [--methods BF16 FP8] [--out DIR]

Qwen3-30B-A3B shape cut to 12 layers (dummy weights), 16 of 128 experts per layer on the GPU, post-capture
sizing, --kt-gpu-prefill-token-threshold 1024, chunked prefill 8192. Each configuration runs the real
Scheduler in its own process:
- `none`: no threshold (no slot): the KV tokens a server without the slot gets;
- `elastic` (SGLANG_KT_ELASTIC_SLOT=1) and `permanent` (=0, the slot's memory kept out of the pool):
  16 short requests start decoding, then a 20k-token prompt arrives; its time to finish, whether it took the
  full-GPU path, the slot's take / return times, failed requests, OOMs, and every output (which must be
  identical between elastic and permanent);
- `pressure` (elastic, BF16 only): a pool capped so that 12 running requests of 2k tokens hold pages of the
  lendable tail; the 20k prompt must be served by the hybrid path with no failure.
Prints a table, writes results.json (`rows`) and results.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

from sglang.test.bench_utils import write_results  # noqa: E402

THRESHOLD = 1024
LONG_PROMPT = 20480
SHORT_PROMPT, SHORT_REQUESTS = 32, 16  # 512 prompt tokens together: their prefill stays below the threshold
NEW_TOKENS = {"BF16": 24, "FP8": 8}  # FP8 experts decode slowly on the CPU (dequantized per call)


def scheduler(method: str, threshold, max_total_tokens=None, lend: bool = True):
    """The post-capture path; lend False keeps the slot's reservation out of the pool for good (as when the
    KV heads do not split evenly over the ranks)."""
    import dataclasses

    from sglang.srt.configs.engine_config import resolve_engine_config
    from sglang.srt.managers.scheduler import build_scheduler
    from sglang.srt.server_args import ServerArgs
    from sglang.test.gpu_utils import shape_config_dir
    from sglang.test.runners import OutputCollector

    args = ServerArgs(
        model_path=shape_config_dir("Qwen3-30B-A3B-12L"),
        load_format="dummy",
        skip_tokenizer_init=True,
        kt_method=method,
        kt_num_gpu_experts=16,
        kt_gpu_prefill_token_threshold=threshold,
        kt_cpuinfer=os.cpu_count(),
        chunked_prefill_size=8192,
        max_running_requests=64,
        max_total_tokens=max_total_tokens,
        log_level="warning",
    )
    collector = OutputCollector()
    config = resolve_engine_config(args, post_capture=True)
    pool = dataclasses.replace(config.memory.pool, lend_reservations=lend)
    config = dataclasses.replace(config, memory=dataclasses.replace(config.memory, pool=pool))
    return build_scheduler(config, output_sink=collector), collector


def submit(sched, rid: str, ids, new_tokens: int) -> None:
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams

    params = SamplingParams.from_dict({"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True})
    sched.add_request(TokenizedGenerateReqInput(rid, "", list(ids), params, False, False))


def run_until(sched, done) -> None:
    while not done():
        if not sched.step():
            raise RuntimeError("the scheduler went idle before the workload finished")


def prompt(seed: int, n: int) -> list:
    return [(seed * 7919 + 31 * i) % 150000 + 10 for i in range(n)]


def workload(sched, collector, method: str, running_prompt_len: int, running: int) -> dict:
    """`running` requests start decoding, then the long prompt arrives; returns what happened."""
    import torch

    new = NEW_TOKENS[method]
    for i in range(running):
        submit(sched, f"short-{i}", prompt(i, running_prompt_len), new)
    run_until(sched, lambda: sched.running_batch is not None and sched.running_batch.batch_size() == running)
    before = dict(vars(sched.kt_slot_lender.stats)) if sched.kt_slot_lender is not None else None
    torch.cuda.synchronize()
    start = time.perf_counter()
    submit(sched, "long", prompt(999, LONG_PROMPT), 1)
    run_until(sched, lambda: collector.results.get("long") and collector.results["long"].finish_reason)
    long_s = time.perf_counter() - start
    run_until(sched, lambda: not sched.has_work())
    results = collector.results
    failed = [rid for rid, r in results.items() if (r.finish_reason or {}).get("type") == "abort"]
    after = dict(vars(sched.kt_slot_lender.stats)) if sched.kt_slot_lender is not None else None
    took_slot = after is not None and after["takes"] > before["takes"]
    full_gpu = took_slot or (after is None and sched.model_runner.kt_prefill_slot.layer is not None)
    return {
        "long_prompt_s": long_s,
        "long_prompt_path": "full-gpu" if full_gpu else "hybrid",
        "failed_requests": len(failed),
        "ooms": sched.stats.num_oom_recoveries,
        "slot": after,
        "outputs": {rid: r.output_ids for rid, r in sorted(results.items())},
    }


def worker(method: str, mode: str) -> dict:
    if mode == "none":
        sched, _ = scheduler(method, None)
        return {"tokens": sched.max_total_num_tokens}
    if mode == "pressure":
        probe, _ = scheduler(method, THRESHOLD)  # the tail's size on this machine, then a pool just above it
        tail = probe.model_runner.pool_size.prefill_slot_tail.tokens
        probe.model_runner.shutdown()
        del probe
        import gc

        import torch

        gc.collect()
        torch.cuda.empty_cache()
        sched, collector = scheduler(method, THRESHOLD, max_total_tokens=tail + 16384)
        out = workload(sched, collector, method, running_prompt_len=2048, running=12)
    else:
        sched, collector = scheduler(method, THRESHOLD, lend=mode != "permanent")
        out = workload(sched, collector, method, running_prompt_len=SHORT_PROMPT, running=SHORT_REQUESTS)
    mr = sched.model_runner
    from sglang.srt.model_executor.pool_configurator import whole_granule_tokens

    plan = mr.memory_plan
    out.update(
        tokens=sched.max_total_num_tokens,
        reservation_bytes=sum(plan.reservations_bytes.values()),
        reservation_rule=plan.reservation_rule,
        tail_tokens=plan.lendable_tail_tokens,
        granule_tokens=whole_granule_tokens(mr.readings),
        cell_size_bytes=plan.cell_size_bytes,
    )
    return out


def run_worker(method: str, mode: str) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", method, mode]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{method} {mode} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--methods", nargs="*", default=["BF16", "FP8"])
    parser.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    parser.add_argument("--worker", nargs=2, metavar=("METHOD", "MODE"))
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(*args.worker)))
        return
    rows = []
    for method in args.methods:
        none, elastic, permanent = (run_worker(method, m) for m in ("none", "elastic", "permanent"))
        slot = elastic["slot"]
        rows.append(
            {
                "method": method,
                "case": "tail free",
                "tokens_without_threshold": none["tokens"],
                "tokens_with_threshold": elastic["tokens"],
                "tokens_permanent_reservation": permanent["tokens"],
                "granule_tokens": elastic["granule_tokens"],
                "tail_tokens": elastic["tail_tokens"],
                "reservation_bytes": elastic["reservation_bytes"],
                "take_ms": slot["last_take_ms"],
                "return_ms": slot["last_return_ms"],
                "takes": slot["takes"],
                "returns": slot["returns"],
                "long_prompt_path": elastic["long_prompt_path"],
                "long_prompt_s": elastic["long_prompt_s"],
                "permanent_long_prompt_s": permanent["long_prompt_s"],
                "permanent_long_prompt_path": permanent["long_prompt_path"],
                "failed_requests": elastic["failed_requests"] + permanent["failed_requests"],
                "ooms": elastic["ooms"] + permanent["ooms"],
                "outputs_identical": elastic["outputs"] == permanent["outputs"],
            }
        )
        print(json.dumps(rows[-1]), flush=True)
        if method == "BF16":
            pressure = run_worker(method, "pressure")
            rows.append(
                {
                    "method": method,
                    "case": "KV pressure (12 running requests hold tail pages)",
                    "tokens_with_threshold": pressure["tokens"],
                    "tail_tokens": pressure["tail_tokens"],
                    "granule_tokens": pressure["granule_tokens"],
                    "long_prompt_path": pressure["long_prompt_path"],
                    "long_prompt_s": pressure["long_prompt_s"],
                    "refusals": pressure["slot"]["refusals"],
                    "takes": pressure["slot"]["takes"],
                    "failed_requests": pressure["failed_requests"],
                    "ooms": pressure["ooms"],
                }
            )
            print(json.dumps(rows[-1]), flush=True)
        write_results(args.out, {"rows": rows}, report(rows))
    print(report(rows))


def report(rows: list) -> str:
    lines = [
        f"Qwen3-30B-A3B shape, 12 layers, dummy weights, 16 of 128 experts on the GPU, threshold {THRESHOLD}, "
        f"{LONG_PROMPT}-token prompt with {SHORT_REQUESTS} short requests decoding; post-capture sizing.",
        "",
        "| method | case | KV tokens without threshold | with (elastic) | with (permanent) | granule tokens | tail tokens "
        "| take ms | return ms | long prompt path | long prompt s | permanent s | failed | OOMs | outputs identical |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:

        def f(key, fmt="{}", r=r):
            return fmt.format(r[key]) if r.get(key) is not None else "-"

        lines.append(
            f"| {r['method']} | {r['case']} | {f('tokens_without_threshold')} | {f('tokens_with_threshold')} "
            f"| {f('tokens_permanent_reservation')} | {f('granule_tokens')} | {f('tail_tokens')} "
            f"| {f('take_ms', '{:.1f}')} | {f('return_ms', '{:.1f}')} | {r['long_prompt_path']} "
            f"| {f('long_prompt_s', '{:.2f}')} | {f('permanent_long_prompt_s', '{:.2f}')} | {r['failed_requests']} "
            f"| {r['ooms']} | {f('outputs_identical')} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
