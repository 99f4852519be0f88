"""The hybrid SWA pool against one pool, in the same KV memory: how many long requests run at once, and how fast.

    python benchmark/kv_sizing/bench_swa_pool.py [--requests 32] [--prompt 1024] [--new 256] [--one-pool-tokens 16384]

A Gemma-3-shaped model in miniature (dummy weights, fp32; five sliding-window layers of every six, window 256, as
Gemma 3's 5:1 with its window of 1,024 scaled down) runs `--requests` prompts of `--prompt` random tokens, each
generating `--new` tokens, all submitted at once, through the engine's scheduler in-process (no HTTP). The KV budget
is what one pool of `--one-pool-tokens` tokens takes; each hybrid row gets the same bytes: --max-total-tokens is that
budget over the planner's cell size at its --swa-full-tokens-ratio (KVGeometry.cell_size_bytes, the server's rule).
Reported per row: the pools' tokens, the most requests decoding in one step, the steps, wall time and output tokens/s,
and whether every output equals the one-pool run's (greedy: the pool must not change a token).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time

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


def cell_size(path: str, ratio) -> int:
    """The planner's KV bytes per token of the full pool (one pool: ratio None)."""
    from sglang.srt.configs.engine_config import resolve_engine_config
    from sglang.srt.server_args import ServerArgs

    config = resolve_engine_config(
        ServerArgs(model_path=path, load_format="dummy", skip_tokenizer_init=True, device="cpu")
    )
    return config.model.kv_geometry(swa_full_tokens_ratio=ratio).cell_size_bytes


def run(path: str, prompts, new_tokens: int, ratio, total_tokens: int) -> dict:
    from sglang.test.runners import greedy_params, make_scheduler, run_scheduler

    flags = {"disable_hybrid_swa_memory": True} if ratio is None else {"swa_full_tokens_ratio": ratio}
    sched = make_scheduler(
        reuse_model=False,
        poison_kv=False,
        model_path=path,
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype="float32",
        max_total_tokens=total_tokens,
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
    return {
        "pool": "one pool" if ratio is None else f"hybrid, ratio {ratio}",
        "swa_full_tokens_ratio": ratio,
        "max_total_num_tokens": allocator.size,
        "window_pool_tokens": 0 if ratio is None else allocator.swa_size,
        "kv_bytes": total_tokens * cell_size(path, ratio),
        "peak_running_requests": max(running),
        "steps": len(running),
        "retractions": sched.stats.num_retractions,
        "wall_s": round(wall, 2),
        "output_tok_s": round(sum(len(o.output_ids) for o in outs) / wall, 1),
        "outputs": [o.output_ids for o in outs],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=1024)
    parser.add_argument("--new", type=int, default=256)
    parser.add_argument("--one-pool-tokens", type=int, default=16384)
    parser.add_argument("--ratios", type=float, nargs="*", default=[0.8, 0.25])
    parser.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    args = parser.parse_args()

    path = model_dir()
    rng = random.Random(0)
    prompts = [[rng.randrange(3, CONFIG["vocab_size"]) for _ in range(args.prompt)] for _ in range(args.requests)]
    budget = args.one_pool_tokens * cell_size(path, None)
    rows = [run(path, prompts, args.new, None, args.one_pool_tokens)]
    for ratio in args.ratios:
        rows.append(run(path, prompts, args.new, ratio, budget // cell_size(path, ratio)))
    reference = rows[0].pop("outputs")
    for row in rows[1:]:
        row["outputs_equal_one_pool"] = row.pop("outputs") == reference
    rows[0]["outputs_equal_one_pool"] = True

    header = "| pool | full-pool tokens | window-pool tokens | KV MiB | peak running | steps | wall s | out tok/s | same tokens |"
    lines = [header, "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(
            f"| {r['pool']} | {r['max_total_num_tokens']:,} | {r['window_pool_tokens']:,} | {r['kv_bytes'] / 2**20:.1f} | "
            f"{r['peak_running_requests']} | {r['steps']} | {r['wall_s']} | {r['output_tok_s']} | "
            f"{r['outputs_equal_one_pool']} |"
        )
    table = "\n".join(lines)
    print(table)
    meta = {k: v for k, v in vars(args).items() if k != "out"}
    meta.update(
        window=WINDOW, layers=LAYERS, sliding_layers=sum(t == "sliding_attention" for t in CONFIG["layer_types"])
    )
    write_results(args.out, {"meta": meta, "rows": rows}, table, name="results_swa_pool")


if __name__ == "__main__":
    main()
