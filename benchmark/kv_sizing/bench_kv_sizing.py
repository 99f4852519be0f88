"""Static vs post-capture KV sizing on real model shapes (dummy weights), one fresh process per run.

    python benchmark/kv_sizing/bench_kv_sizing.py [--shapes Llama-3.1-8B Qwen3-8B Qwen3-30B-A3B DeepSeek-V2-Lite] [--out DIR]
    python benchmark/kv_sizing/bench_kv_sizing.py --shapes Llama-3.1-8B --flag-sets tp-2 --append   # two GPUs

For every shape and flag set (defaults; --cuda-graph-max-bs 32 --max-running-requests 256) it starts
the ModelRunner twice, flag off (static) and on (post-capture), and reports: KV tokens, the gain in
GiB and %, measured graph memory, headroom, the lowest free memory during a worst-case load, OOMs,
start-up time, and the token count SGLang's own post-capture headroom rule would have given.

The worst-case load runs at the ModelRunner level (what costs memory is the batch shape, not the
KV contents): a full chunked prefill spread over max_running_requests requests whose cached
prefixes span the whole pool, then decode steps of max_running_requests requests over the whole
pool (eager above the captured batch size), each sampled with top-p (sort over the vocabulary).
The lowest free memory is free-at-start minus the growth of torch's reserved memory at its peak.
With --tp-size 2 (flag set tp-2) each rank runs in its own process on its own GPU, both run the same
load in lock step, and the row reports the rank with the least free memory (tokens agree by design).
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

GiB = 1 << 30
FLAG_SETS = {
    "default": [],
    "graph-bs-32+max-running-256": ["--cuda-graph-max-bs", "32", "--max-running-requests", "256"],
    # Decode never runs eagerly: every running batch fits a captured graph (256 on the H200 tier).
    "max-running-256": ["--max-running-requests", "256"],
    "tp-2": ["--tp-size", "2"],  # needs two GPUs
    # KT: every routed expert in the CPU kernels as FP8, prompts of 4,096 tokens and more on the full-GPU path. The
    # static path keeps the prefill slot's bytes out of the KV pool; the post-capture path lends them from the pool's
    # tail only while such a prefill runs (the scheduler lends; at this level the load's prefill takes the hybrid path).
    "kt-fp8": "--kt-method FP8 --kt-num-gpu-experts 0 --kt-cpuinfer 16 --kt-gpu-prefill-token-threshold 4096".split(),
}
# Which flag sets each shape runs by default (the no-eager row is the Llama-3.1-8B headline).
DEFAULT_PLAN = [
    ("Llama-3.1-8B", "default"),
    ("Llama-3.1-8B", "graph-bs-32+max-running-256"),
    ("Llama-3.1-8B", "max-running-256"),
    ("Qwen3-8B", "default"),
    ("Qwen3-8B", "graph-bs-32+max-running-256"),
    ("Qwen3-30B-A3B", "default"),
    ("Qwen3-30B-A3B", "graph-bs-32+max-running-256"),
    ("DeepSeek-V2-Lite", "default"),  # MLA: one latent row per token and layer, VMM ranges on the post path
    ("DeepSeek-V3-4L", "kt-fp8"),  # MLA under KT: 3 dense + 1 MoE layer of DeepSeek-V3, FP8 experts on the CPU
]


def _sampling(bs: int, vocab: int, device: str):
    import torch

    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    return SamplingBatchInfo(
        temperatures=torch.ones(bs, 1, device=device),
        top_ps=torch.full((bs,), 0.9, device=device),
        top_ks=torch.full((bs,), vocab, dtype=torch.int64, device=device),
        min_ps=torch.zeros(bs, device=device),
        seeds=torch.arange(bs, device=device),
        steps=torch.zeros(bs, dtype=torch.int64, device=device),
        is_all_greedy=False,
        greedy_mask=torch.zeros(bs, dtype=torch.bool, device=device),
        need_top_p_top_k=True,
        need_min_p=False,
    )


def worst_case_load(mr) -> dict:
    """Returns the lowest free memory (GiB) seen and the OOM count."""
    import torch

    from sglang.srt.mem_cache.swa_allocator import SWATokenToKVPoolAllocator
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode, ModelWorkerBatch

    sa, pool = mr.config.args, mr.token_to_kv_pool_allocator
    if isinstance(pool, SWATokenToKVPoolAllocator):
        # The hybrid SWA pool: full-pool slots only (the windowed layers then store at and read the dummy slot):
        # what costs memory is the batch shape, not the KV contents.
        pool = pool.full
    n = mr.req_to_token_pool.size
    tokens = mr.max_total_num_tokens
    rows = mr.req_to_token_pool.alloc(n)
    ctx = max(1, min(tokens // n - 1, mr.model_config.context_len - 2))
    slots = pool.alloc(ctx * n // sa.page_size * sa.page_size) if sa.page_size > 1 else pool.alloc(ctx * n)
    table = mr.req_to_token_pool.req_to_token
    table[rows] = 0
    table[rows, :ctx] = slots.view(n, ctx).to(table.device, torch.int32)
    free_start = torch.cuda.mem_get_info()[0]
    reserved_start = torch.cuda.memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    ooms = 0
    chunk = sa.chunked_prefill_size
    n_prefill = min(n, chunk)
    ext = [chunk // n_prefill + (1 if i < chunk % n_prefill else 0) for i in range(n_prefill)]
    prefix = [min(ctx, mr.model_config.context_len - e - 1) for e in ext]
    batches = [
        ModelWorkerBatch(
            ForwardMode.EXTEND,
            [5] * chunk,
            rows[:n_prefill],
            [p + e for p, e in zip(prefix, ext)],
            torch.zeros(chunk, dtype=torch.int64),
            extend_seq_lens=ext,
            extend_prefix_lens=prefix,
        ),
    ] + [
        ModelWorkerBatch(ForwardMode.DECODE, [5] * bs, rows[:bs], [ctx] * bs, torch.zeros(bs, dtype=torch.int64))
        for bs in sorted({n, min(n, sa.cuda_graph_max_bs)})
        for _ in range(3)
    ]
    for batch in batches:
        batch.sampling_info = _sampling(len(batch.seq_lens), mr.model_config.vocab_size, "cuda")
        batch.return_logprob = True
        try:
            fb = ForwardBatch.init_new(batch, mr)
            mr.sample(mr.forward(fb), fb).next_token_ids.tolist()
        except torch.cuda.OutOfMemoryError:
            ooms += 1
    torch.cuda.synchronize()
    growth = torch.cuda.max_memory_reserved() - reserved_start
    for r in rows:
        mr.req_to_token_pool.free(r)
    pool.free(slots)
    return {
        "lowest_free_gb": (free_start - growth) / GiB,
        "ooms": ooms,
        "load_context_per_request": ctx,
        "load_requests": n,
    }


def worker(shape: str, flags: list[str], tp_rank: int = 0, dist_init_method: str | None = None) -> dict:
    import torch

    from sglang.srt.configs.engine_config import prepare_engine_config
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.test.gpu_utils import shape_config_dir

    config = prepare_engine_config(
        [
            "--model-path",
            shape_config_dir(shape),
            "--load-format",
            "dummy",
            "--skip-tokenizer-init",
            "--log-level",
            "warning",
            *flags,
        ]
    )
    torch.cuda.set_device(tp_rank)
    start = time.perf_counter()
    mr = ModelRunner(config, gpu_id=tp_rank, tp_rank=tp_rank, dist_init_method=dist_init_method)
    startup = time.perf_counter() - start
    plan = mr.memory_plan
    load = worst_case_load(mr)
    return {
        "shape": shape,
        "flags": " ".join(flags) or "default",
        "path": plan.path,
        "tokens": mr.max_total_num_tokens,
        "swa_tokens": plan.swa_max_total_num_tokens,
        "cell_bytes": plan.cell_size_bytes,
        "graph_gb": plan.cuda_graph_gb,
        "headroom_gb": plan.headroom_gb,
        "headroom_rule": plan.headroom_rule,
        "activation_peak_gb": plan.activation_peak_gb,
        "mem_fraction_static": plan.mem_fraction_static,
        "max_running_requests": mr.req_to_token_pool.size,
        "cuda_graph_max_bs": mr.cuda_graph_runner.max_bs if mr.cuda_graph_runner else 0,
        "sglang_rule_tokens": plan.sglang_rule_tokens,
        "static_equivalent_tokens": plan.static_equivalent_tokens,
        "startup_s": startup,
        **load,
        "device": torch.cuda.get_device_name(),
        "tp_size": config.args.tp_size,
    }


def _rank_main(shape: str, flags: list[str], rank: int, dist_init_method: str, queue) -> None:
    try:
        queue.put((rank, worker(shape, flags, rank, dist_init_method)))
    except BaseException as e:  # the parent reports it
        queue.put((rank, {"error": repr(e)}))
        raise


def tp_worker(shape: str, flags: list[str], tp: int) -> dict:
    """One process per rank; the row is the rank with the least free memory at the load's peak."""
    import multiprocessing as mp
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_rank_main, args=(shape, flags, r, f"tcp://127.0.0.1:{port}", queue)) for r in range(tp)
    ]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=900) for _ in procs)
    for p in procs:
        p.join()
    ranks = [results[r] for r in range(tp)]
    errors = [r["error"] for r in ranks if "error" in r]
    if errors:
        raise RuntimeError(f"rank failed: {errors}")
    tokens = {r["tokens"] for r in ranks}
    if len(tokens) != 1:
        raise RuntimeError(f"ranks disagree on max_total_num_tokens: {[r['tokens'] for r in ranks]}")
    row = dict(min(ranks, key=lambda r: r["lowest_free_gb"]))
    row.update(
        ooms=sum(r["ooms"] for r in ranks),
        per_rank_tokens=[r["tokens"] for r in ranks],
        per_rank_lowest_free_gb=[r["lowest_free_gb"] for r in ranks],
    )
    return row


def run_worker(shape: str, flag_set: str, post_capture: bool) -> dict:
    env = dict(os.environ, SGLANG_ENABLE_POST_CAPTURE_KV_SIZING="1" if post_capture else "0")
    cmd = [sys.executable, __file__, "--worker", shape, flag_set]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        return {"shape": shape, "flags": flag_set, "error": out.stderr[-3000:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", nargs="*", help="run every flag set for these shapes instead of DEFAULT_PLAN")
    parser.add_argument("--flag-sets", nargs="*", default=list(FLAG_SETS))
    parser.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    parser.add_argument("--worker", nargs=2, metavar=("SHAPE", "FLAG_SET"))
    parser.add_argument("--append", action="store_true", help="add these rows to the committed results")
    args = parser.parse_args()
    if args.worker:
        flags = FLAG_SETS[args.worker[1]]
        tp = int(flags[flags.index("--tp-size") + 1]) if "--tp-size" in flags else 1
        print(json.dumps(tp_worker(args.worker[0], flags, tp) if tp > 1 else worker(args.worker[0], flags)))
        return
    plan = [(s, f) for s in args.shapes for f in args.flag_sets] if args.shapes else DEFAULT_PLAN
    rows = []
    if args.append:  # keep the committed rows this run does not redo (e.g. add the two-GPU rows)
        with open(os.path.join(args.out, "results.json")) as f:
            rows = [
                r
                for r in json.load(f)
                if (r["static"]["shape"], r["static"]["flags"])
                not in {(s, " ".join(FLAG_SETS[f]) or "default") for s, f in plan}
            ]
    for shape, flag_set in plan:
        static = run_worker(shape, flag_set, post_capture=False)
        post = run_worker(shape, flag_set, post_capture=True)
        rows.append({"static": static, "post_capture": post})
        print(json.dumps(rows[-1]), flush=True)
        write_report(rows, args.out, quiet=True)  # a run cut short still leaves its rows
    write_report(rows, args.out)


def write_report(rows: list, out_dir: str, quiet: bool = False) -> None:
    lines = [
        "| shape | flags | static tokens | post-capture tokens | gain GiB | gain % | SGLang-rule tokens | graph GiB (static/post) "
        "| headroom GiB (post) | lowest free GiB (static/post) | OOMs | start-up s (static/post) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        s, p = row["static"], row["post_capture"]
        if "error" in s or "error" in p:
            lines.append(f"| {s['shape']} | {s['flags']} | error: {(s.get('error') or p.get('error'))[-200:]!r} |")
            continue
        gain = (p["tokens"] - s["tokens"]) * p["cell_bytes"] / GiB
        lines.append(
            f"| {s['shape']} | {s['flags']} | {s['tokens']} | {p['tokens']} | {gain:.2f} | "
            f"{100 * (p['tokens'] - s['tokens']) / s['tokens']:.1f} | {p['sglang_rule_tokens']} | "
            f"{s['graph_gb']:.2f} / {p['graph_gb']:.2f} | {p['headroom_gb']:.2f} ({p['headroom_rule']}) | "
            f"{s['lowest_free_gb']:.2f} / {p['lowest_free_gb']:.2f} | {s['ooms'] + p['ooms']} | "
            f"{s['startup_s']:.1f} / {p['startup_s']:.1f} |"
        )
    table = "\n".join(lines)
    if not quiet:
        print(table)
    write_results(out_dir, rows, table)


if __name__ == "__main__":
    main()
