"""The host's cost of a constrained decode step's token masks: `sampling_batch_info.grammar_bitmask` over N requests,
each with its own xgrammar matcher of one JSON schema, on SmolLM2's vocabulary (the built-in model's tokenizer; CPU
only: the masks are filled on the host while the device runs the step's forward).

    python benchmark/constrained/bench_grammar_bitmask.py [--batches 64 256] [--steps 50] [--out-dir DIR]

Every request has accepted the same JSON prefix (inside a string value: most tokens allowed), so each step fills
the same masks. Prints a table (ms per step, and per request) and writes results.json / results.md to --out-dir."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from sglang.srt.constrained.xgrammar_backend import XGrammarBackend
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.sampling.sampling_batch_info import grammar_bitmask
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.utils.hf_tokenizer import get_tokenizer
from sglang.test.bench_utils import write_results
from sglang.test.runners import SMOLLM2

VOCAB = 49152  # SmolLM2's
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array"}},
    "required": ["name", "age"],
}
PREFIX = '{"name": "Ada Lovel'


def constrained_reqs(backend: XGrammarBackend, tokenizer, n: int) -> list[Req]:
    params = SamplingParams.from_dict({"json_schema": json.dumps(SCHEMA), "temperature": 0})
    key = params.grammar_key
    compiled = backend.compile(key)
    prefix = tokenizer.encode(PREFIX, add_special_tokens=False)
    reqs = []
    for i in range(n):
        req = Req(f"r{i}", [1, 2, 3], params, [tokenizer.eos_token_id], 0)
        req.grammar = backend.matcher(compiled, key)
        for t in prefix:
            if not req.grammar.accept_token(t):
                raise RuntimeError(f"the schema refused the prefix {PREFIX!r} at token {t}")
        req.output_ids.extend(prefix)
        reqs.append(req)
    return reqs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", nargs="+", type=int, default=[64, 256])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args()
    tokenizer = get_tokenizer(SMOLLM2)
    backend = XGrammarBackend(tokenizer, VOCAB, [tokenizer.eos_token_id])
    rows = []
    try:
        for n in args.batches:
            reqs = constrained_reqs(backend, tokenizer, n)
            grammar_bitmask(reqs, VOCAB)  # warm-up
            times = []
            for _ in range(args.steps):
                t0 = time.perf_counter()
                mask = grammar_bitmask(reqs, VOCAB)
                times.append((time.perf_counter() - t0) * 1e3)
            if any(r.finished() for r in reqs) or bool((mask == -1).all()):
                raise RuntimeError("the masks are not the schema's: a request finished or every token is allowed")
            ms = statistics.median(times)
            rows.append({"requests": n, "median_ms": ms, "us_per_request": ms * 1e3 / n, "steps": args.steps})
    finally:
        backend.shutdown()
    lines = [
        f"grammar_bitmask on {os.cpu_count()} CPUs, SmolLM2's vocabulary ({VOCAB}), one JSON schema per request",
        "",
        "| requests | median ms per step | us per request |",
        "|---:|---:|---:|",
    ]
    lines += [f"| {r['requests']} | {r['median_ms']:.3f} | {r['us_per_request']:.1f} |" for r in rows]
    text = "\n".join(lines)
    print(text)
    if args.out_dir:
        write_results(args.out_dir, {"rows": rows}, text)


if __name__ == "__main__":
    main()
