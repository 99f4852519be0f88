"""The hybrid SWA pool against one pool, in the same KV memory: how many long requests run at once, and how fast.

    python benchmark/kv_sizing/bench_swa_pool.py [--requests 32] [--prompt 1024] [--new 256] [--one-pool-tokens 16384]
    python3 benchmark/kv_sizing/bench_swa_pool.py --device cuda --shape Gemma-3-27B --requests 128 --prompt 4096
        # the GPU machine (run.sh swa-pool): a real shape (scripts/make_model_configs.py), bf16 dummy weights, each
        # row's pool sized by the server's own planner from the same free memory

A Gemma-3-shaped model in miniature (dummy weights, fp32; five sliding-window layers of every six, window 256, as
Gemma 3's 5:1 with its window of 1,024 scaled down) runs `--requests` prompts of `--prompt` random tokens, each
generating `--new` tokens, all submitted at once, through the engine's scheduler in-process (no HTTP). The KV budget
is what one pool of `--one-pool-tokens` tokens takes; each hybrid row gets the same bytes: --max-total-tokens is that
budget over the planner's cell size at its --swa-full-tokens-ratio (KVGeometry.cell_size_bytes, the server's rule).
Reported per row: the pools' tokens, the most requests decoding in one step, the steps, wall time and output tokens/s,
and how many outputs equal the one-pool run's (greedy: the pool must not change a token) with the mean share of each
output equal to it before the first difference. In fp32 on the CPU every output is equal; in bf16 on the GPU a
different batch composition rounds differently and a greedy token can flip where dummy weights leave two logits
nearly tied, so `--control-max-running N` adds a row that changes only the batching (one pool, at most N requests
running): the noise floor the hybrid rows are read against.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

from sglang.test.bench_utils import write_results  # noqa: E402

LAYERS, WINDOW = 6, 256
CONFIG = {
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "hidden_size": 512,
    "intermediate_size": 1024,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "query_pre_attn_scalar": 64,
    "sliding_window": WINDOW,
    "layer_types": ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(LAYERS)],
    "vocab_size": 4096,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
    },
    "hidden_activation": "gelu_pytorch_tanh",
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
    "bos_token_id": 2,
    "eos_token_id": 1,
    "pad_token_id": 0,
}


def model_dir() -> str:
    path = tempfile.mkdtemp(prefix="gemma3-mini-")
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(CONFIG, f)
    return path


def cell_size(path: str, ratio, device: str = "cpu") -> int:
    """The planner's KV bytes per token of the full pool (one pool: ratio None)."""
    from sglang.srt.configs.engine_config import resolve_engine_config
    from sglang.srt.server_args import ServerArgs

    dtype = "float32" if device == "cpu" else "bfloat16"
    args = ServerArgs(model_path=path, load_format="dummy", skip_tokenizer_init=True, device=device, dtype=dtype)
    return resolve_engine_config(args).model.kv_geometry(swa_full_tokens_ratio=ratio).cell_size_bytes


def run(path: str, prompts, new_tokens: int, ratio, total_tokens, device: str, max_running: int | None = None) -> dict:
    """One row; total_tokens None: the planner sizes the pool from free memory (the GPU rows)."""
    from sglang.test.runners import greedy_params, make_scheduler, run_scheduler

    flags = {"disable_hybrid_swa_memory": True} if ratio is None else {"swa_full_tokens_ratio": ratio}
    if total_tokens is not None:
        flags["max_total_tokens"] = total_tokens
    if max_running is not None:
        flags["max_running_requests"] = max_running
    sched = make_scheduler(
        reuse_model=False,
        poison_kv=False,
        model_path=path,
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype="float32" if device == "cpu" else "bfloat16",
        device=device,
        **flags,
    )
    running, step = [], sched.step

    def step_and_count() -> bool:
        busy = step()
        batch = sched.running_batch
        running.append(batch.batch_size() if batch is not None else 0)
        return busy

    sched.step = step_and_count
    start = time.perf_counter()
    outs = run_scheduler(sched, prompts, greedy_params(new_tokens))
    wall = time.perf_counter() - start
    allocator = sched.allocator
    kv_bytes = allocator.size * cell_size(path, ratio, device)
    pools = (allocator.size, 0 if ratio is None else allocator.swa_size)
    retractions = sched.stats.num_retractions
    name = "one pool" if ratio is None else f"hybrid, ratio {ratio}"
    return {
        "pool": name if max_running is None else f"{name}, at most {max_running} running",
        "swa_full_tokens_ratio": ratio,
        "max_total_num_tokens": pools[0],
        "window_pool_tokens": pools[1],
        "kv_bytes": kv_bytes,
        "peak_running_requests": max(running),
        "steps": len(running),
        "retractions": retractions,
        "wall_s": round(wall, 2),
        "output_tok_s": round(sum(len(o.output_ids) for o in outs) / wall, 1),
        "outputs": [o.output_ids for o in outs],
    }


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens two outputs share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=1024)
    parser.add_argument("--new", type=int, default=256)
    parser.add_argument("--one-pool-tokens", type=int, default=16384)
    parser.add_argument("--ratios", type=float, nargs="*", default=[0.8, 0.25])
    parser.add_argument(
        "--control-max-running",
        type=int,
        default=None,
        help="add a one-pool row capped at this many running requests (the batching's own effect on the tokens)",
    )
    parser.add_argument("--name", default="results_swa_pool", help="the results' file name (without .json/.md)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument(
        "--shape", default=None, help="a shape of scripts/make_model_configs.py (default: the miniature)"
    )
    parser.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    args = parser.parse_args()

    if args.shape is None:
        path, vocab = model_dir(), CONFIG["vocab_size"]
    else:
        from sglang.test.gpu_utils import shape_config_dir

        path = shape_config_dir(args.shape)
        with open(os.path.join(path, "config.json")) as f:
            vocab = json.load(f)["vocab_size"]
    rng = random.Random(0)
    prompts = [[rng.randrange(3, vocab) for _ in range(args.prompt)] for _ in range(args.requests)]
    # The miniature on the CPU: every row the bytes of one pool of --one-pool-tokens; a shape: the planner's pools.
    planned = args.shape is not None
    budget = args.one_pool_tokens * cell_size(path, None, args.device)
    rows = []
    runs = [(None, None), *((ratio, None) for ratio in args.ratios)]
    if args.control_max_running is not None:
        runs.append((None, args.control_max_running))
    for ratio, max_running in runs:
        tokens = budget // cell_size(path, ratio, args.device)
        rows.append(run(path, prompts, args.new, ratio, None if planned else tokens, args.device, max_running))
        gc.collect()  # the last row's model and pools go before the next row's start (its planner reads free memory)
        if args.device == "cuda":
            torch.cuda.empty_cache()
    reference = rows[0]["outputs"]
    for row in rows:
        outputs = row.pop("outputs")
        row["outputs_equal_one_pool"] = outputs == reference
        row["identical_requests"] = sum(a == b for a, b in zip(outputs, reference))
        row["mean_share_equal_before_first_difference"] = round(
            sum(common_prefix(a, b) / len(b) for a, b in zip(outputs, reference)) / len(reference), 4
        )

    header = (
        "| pool | full-pool tokens | window-pool tokens | KV MiB | peak running | steps | wall s | out tok/s "
        "| outputs equal to one pool's | equal share before the first difference |"
    )
    lines = [header, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['pool']} | {r['max_total_num_tokens']:,} | {r['window_pool_tokens']:,} | {r['kv_bytes'] / 2**20:.1f} | "
            f"{r['peak_running_requests']} | {r['steps']} | {r['wall_s']} | {r['output_tok_s']} | "
            f"{r['identical_requests']}/{args.requests} | {r['mean_share_equal_before_first_difference']:.1%} |"
        )
    table = "\n".join(lines)
    print(table)
    meta = {k: v for k, v in vars(args).items() if k not in ("out", "name")}
    if not planned:
        sliding = sum(t == "sliding_attention" for t in CONFIG["layer_types"])
        meta.update(window=WINDOW, layers=LAYERS, sliding_layers=sliding)
    write_results(args.out, {"meta": meta, "rows": rows}, table, name=args.name)


if __name__ == "__main__":
    main()
