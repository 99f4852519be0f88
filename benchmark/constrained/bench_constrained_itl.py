"""The cost of constrained decoding when every request carries a JSON schema (issue 35's targets: median ITL
within 1.05x of unconstrained at concurrency 64 on the H200, Llama-3.1-8B shape; a 20-property schema
compiles in under 50 ms, then comes from the cache).

    python3 benchmark/constrained/bench_constrained_itl.py --out-dir $OUT     # the GPU machine (stage constrained-itl)
    python benchmark/constrained/bench_constrained_itl.py --smoke             # this CPU machine: tiny shape, few requests

One server (`--load-format dummy`, the shape's config with SmolLM2's vocabulary and tokenizer, staged as
benchmark/serving/bench_serving_h200.py stages them) serves two rounds of the same streamed /generate
requests at the given concurrency: unconstrained, then every request with a `json_schema` whose last field is
a long string (minLength past max_new_tokens), so that dummy-weight tokens run to max_new_tokens in both
rounds (ignore_eos) and the rounds decode the same number of tokens. ITL is the gap between a request's
streamed chunks divided by the tokens the chunk brought (stream interval 1: one token each). The schema
compile is timed in-process on the same tokenizer and vocabulary (constrained/xgrammar_backend.py): a
20-property schema cold, then from the cache; and on the server, the first-token time of a request with a
new 20-property schema next to the same request again (cached).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

import requests  # noqa: E402

from sglang.test.bench_utils import write_results  # noqa: E402
from sglang.test.test_utils import kill_process_tree, popen_launch_server  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET_ITL_RATIO = 1.05
TARGET_COMPILE_MS = 50.0


def _serving_module():
    """benchmark/serving/bench_serving_h200.py: its model directory staging (dummy shape + SmolLM2 tokenizer)."""
    path = os.path.join(ROOT, "benchmark", "serving", "bench_serving_h200.py")
    spec = importlib.util.spec_from_file_location("bench_serving_h200", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def stage_tokenizer(serving) -> None:
    """SmolLM2's tokenizer where bench_serving_h200 stages it (its --prepare); made here when missing and the
    built-in SmolLM2 is at hand (this machine). The GPU machine gets it carried in .device/upstream."""
    if os.path.isdir(serving.TOKENIZER_DIR):
        return
    from sglang.srt.utils.hf_tokenizer import get_tokenizer
    from sglang.test.upstream_clients import save_portable_tokenizer

    save_portable_tokenizer(get_tokenizer("SmolLM2-135M-Instruct"), serving.TOKENIZER_DIR)


def properties_schema(tag: str, n: int) -> dict:
    props = {f"{tag}_{i}": {"type": ["integer", "string", "boolean"][i % 3]} for i in range(n)}
    return {"type": "object", "properties": props, "required": sorted(props), "additionalProperties": False}


def long_answer_schema(max_new_tokens: int) -> dict:
    """A record whose last field cannot close before max_new_tokens: SmolLM2's longest token is 81 characters
    (a run of spaces), so 128 characters a token is more than any token writes (at 4 a token, as first written,
    a few of 256 requests closed early on the H200, 2026-12-04)."""
    return {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 16},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
            "notes": {"type": "string", "minLength": 128 * max_new_tokens},
        },
        "required": ["name", "age", "tags", "notes"],
        "additionalProperties": False,
    }


def compile_times(tokenizer_dir: str, vocab_size: int, repeats: int) -> dict:
    """In-process compile of fresh 20-property schemas (cold: a new schema each time) and of one again (cache)."""
    from transformers import AutoTokenizer

    from sglang.srt.constrained.grammar_key import GrammarKey
    from sglang.srt.constrained.xgrammar_backend import XGrammarBackend

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    t0 = time.perf_counter()
    backend = XGrammarBackend(tok, vocab_size, [tok.eos_token_id])
    setup_ms = (time.perf_counter() - t0) * 1e3
    cold, cached = [], []
    try:
        for r in range(repeats):
            key = GrammarKey("json_schema", json.dumps(properties_schema(f"cold{r}", 20)))
            t0 = time.perf_counter()
            backend.compile(key)
            cold.append((time.perf_counter() - t0) * 1e3)
            t0 = time.perf_counter()
            backend.compile(GrammarKey("json_schema", key.text))
            cached.append((time.perf_counter() - t0) * 1e3)
    finally:
        backend.shutdown()
    return {
        "tokenizer_info_ms": setup_ms,
        "cold_ms": cold,
        "cold_median_ms": statistics.median(cold),
        "cached_median_ms": statistics.median(cached),
    }


def stream_one(base_url: str, ids: List[int], params: dict) -> dict:
    """One streamed /generate: its first-token time and its per-token inter-chunk gaps (s)."""
    t0 = time.perf_counter()
    last, tokens, gaps, ttft = None, 0, [], None
    body = {"input_ids": ids, "sampling_params": params, "stream": True}
    with requests.post(f"{base_url}/generate", json=body, stream=True, timeout=1800) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            now = time.perf_counter()
            out = json.loads(line[6:])
            if "error" in out:
                raise RuntimeError(f"request failed: {out['error']}")
            got = out["meta_info"]["completion_tokens"]
            if got > tokens:
                if last is None:
                    ttft = now - t0
                else:
                    gaps += [(now - last) / (got - tokens)] * (got - tokens)
                last, tokens = now, got
    return {"ttft": ttft, "gaps": gaps, "tokens": tokens}


def run_round(base_url: str, prompts: List[List[int]], params: dict, concurrency: int) -> dict:
    results: List[dict] = []
    lock = threading.Lock()

    def one(ids: List[int]) -> None:
        res = stream_one(base_url, ids, params)
        with lock:
            results.append(res)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, prompts))
    wall = time.perf_counter() - t0
    gaps = [g for r in results for g in r["gaps"]]
    tokens = [r["tokens"] for r in results]
    return {
        "requests": len(results),
        "output_tokens": sum(tokens),
        "min_output_tokens": min(tokens),
        "median_itl_ms": statistics.median(gaps) * 1e3,
        "p90_itl_ms": sorted(gaps)[int(0.9 * (len(gaps) - 1))] * 1e3,
        "median_ttft_ms": statistics.median(r["ttft"] for r in results) * 1e3,
        "output_tok_per_s": sum(tokens) / wall,
        "wall_s": wall,
    }


def prompts_of(tokenizer_dir: str, n: int, input_len: int) -> List[List[int]]:
    """n distinct prompts of input_len tokens (no shared cached prefix), from this repository's README."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    with open(os.path.join(ROOT, "README.md")) as f:
        ids = tok.encode(f.read(), add_special_tokens=False)
    stride = max(1, (len(ids) - input_len) // n)
    return [(ids * 2)[k * stride : k * stride + input_len] for k in range(n)]


def server_first_token_ms(base_url: str, ids: List[int], schema: dict) -> float:
    t0 = time.perf_counter()
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "json_schema": json.dumps(schema)}}
    r = requests.post(f"{base_url}/generate", json=body, timeout=600)
    r.raise_for_status()
    return (time.perf_counter() - t0) * 1e3


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="Llama-3.1-8B", help="a shape of scripts/make_model_configs.py")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--num-prompts", type=int, default=256)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--compile-repeats", type=int, default=10)
    p.add_argument("--out-dir", default=HERE, help="results.json and results.md go here")
    p.add_argument("--smoke", action="store_true", help="CPU check: tiny Llama shape, 4 requests of 8 tokens")
    p.add_argument("server_args", nargs="*", help="extra server flags (after --)")
    args = p.parse_args(argv)
    if args.smoke:
        args.shape, args.concurrency, args.num_prompts = "tiny-llama", 4, 4
        args.input_len, args.output_len, args.compile_repeats = 16, 8, 2
        if args.out_dir == HERE:
            args.out_dir = tempfile.mkdtemp(prefix="bench-constrained-smoke-")

    serving = _serving_module()
    stage_tokenizer(serving)
    work = tempfile.mkdtemp(prefix="bench-constrained-")
    model_dir = serving.model_dir(work, args.shape)
    compiled = compile_times(serving.TOKENIZER_DIR, serving.SMOLLM2_VOCAB, args.compile_repeats)
    prompts = prompts_of(serving.TOKENIZER_DIR, args.num_prompts, args.input_len)

    server_cmd = ["--model-path", model_dir, "--load-format", "dummy", "--stream-interval", "1", *args.server_args]
    server_cmd += ["--max-running-requests", str(max(args.concurrency, 1))]
    proc = popen_launch_server(server_cmd, timeout=900)
    data: Dict[str, object] = {"args": vars(args), "compile": compiled}
    try:
        base = {"max_new_tokens": args.output_len, "temperature": 0, "ignore_eos": True}
        constrained = {**base, "json_schema": json.dumps(long_answer_schema(args.output_len))}
        run_round(proc.base_url, prompts[: args.concurrency], base, args.concurrency)  # warm-up (graphs, caches)
        rounds = {
            "unconstrained": run_round(proc.base_url, prompts, base, args.concurrency),
            "json_schema": run_round(proc.base_url, prompts, constrained, args.concurrency),
        }
        schema = properties_schema("server", 20)
        cold = server_first_token_ms(proc.base_url, prompts[0], schema)
        cached = server_first_token_ms(proc.base_url, prompts[0], schema)
        data.update(rounds=rounds, server_20_property_first_token_ms={"cold": cold, "cached": cached})
    finally:
        kill_process_tree(proc.pid)
        proc.wait(30)

    u, c = rounds["unconstrained"], rounds["json_schema"]
    ratio = c["median_itl_ms"] / u["median_itl_ms"]
    data["itl_ratio"] = ratio
    lines = [
        f"# Constrained decoding cost: {args.shape} (dummy weights), concurrency {args.concurrency}, "
        f"{args.num_prompts} requests of {args.input_len} in / {args.output_len} out",
        "",
        "| round | requests | output tokens | median ITL ms | p90 ITL ms | median TTFT ms | output tok/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in rounds.items():
        lines.append(
            f"| {name} | {r['requests']} | {r['output_tokens']} | {r['median_itl_ms']:.2f} | {r['p90_itl_ms']:.2f} "
            f"| {r['median_ttft_ms']:.1f} | {r['output_tok_per_s']:.0f} |"
        )
    lines += [
        "",
        f"median ITL json_schema / unconstrained: {ratio:.3f} (target <= {TARGET_ITL_RATIO})",
        f"20-property schema compile (in-process): cold {compiled['cold_median_ms']:.1f} ms median of "
        f"{len(compiled['cold_ms'])} (target < {TARGET_COMPILE_MS}), cached {compiled['cached_median_ms']:.3f} ms; "
        f"tokenizer info {compiled['tokenizer_info_ms']:.0f} ms once per server",
        f"server, 1-token request with a new 20-property schema: {cold:.1f} ms, the same again (cached): {cached:.1f} ms",
    ]
    markdown = "\n".join(lines)
    print(markdown)
    write_results(args.out_dir, data, markdown)
    print(f"results in {args.out_dir}")
    short = [n for n, r in rounds.items() if r["min_output_tokens"] < args.output_len]
    if short:  # the rounds would not compare the same decode work
        print(f"rounds with a request shorter than {args.output_len} tokens: {short}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
