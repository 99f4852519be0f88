from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=125, suite="per-commit-cpu")

# Continuous batching and the radix cache on SmolLM2 (real weights, CPU), greedy:
#   * 16 prompts of mixed lengths in one batch give exactly what each gives alone;
#   * a shared prefix is served from the radix cache (cached_tokens, stats.cached_tokens_total),
#     with identical output, in-process and through sglang.Engine (meta_info.cached_tokens);
#   * a KV pool far too small for all requests (chunked prefill, page size 1 and 4) retracts
#     requests and still finishes every one with identical output, leaking no slot;
#   * chunked prefill of a long prompt equals unchunked; --disable-radix-cache works.
# "Alone" references come from a scheduler with the radix cache disabled, one request at a time.

import random

import pytest

from sglang.srt.utils.hf_tokenizer import get_tokenizer
from sglang.test.runners import SMOLLM2, greedy_params, make_scheduler, run_scheduler, smollm2_engine

NEW = 10
SYSTEM = "You are a helpful assistant. Answer briefly and precisely, and never invent facts. Question:"
WORDS = "the a cat dog runs over hill river blue green quickly slowly under sky night day bright dark".split()


@pytest.fixture(scope="module")
def tok():
    return get_tokenizer(SMOLLM2)


@pytest.fixture(scope="module")
def prompts(tok):
    """16 prompts from 1 to ~110 tokens; every third one starts with the same system prefix."""
    rng = random.Random(0)
    texts = []
    for i, n in enumerate([1, 3, 8, 20, 40, 90, 2, 12, 30, 5, 60, 1, 15, 4, 25, 7]):
        body = " ".join(rng.choice(WORDS) for _ in range(n))
        texts.append(f"{SYSTEM} {body}" if i % 3 == 0 else body)
    ids = [tok.encode(t) for t in texts]
    assert min(map(len, ids)) <= 3 and max(map(len, ids)) > 80
    return ids


@pytest.fixture(scope="module")
def plain():
    """Radix cache off, large pool: the reference, one request at a time."""
    return make_scheduler(model_path=SMOLLM2, skip_tokenizer_init=True, max_total_tokens=8192, disable_radix_cache=True)


@pytest.fixture(scope="module")
def alone(plain, prompts):
    return [run_scheduler(plain, [p], greedy_params(NEW))[0].output_ids for p in prompts]


@pytest.fixture(scope="module")
def cached():
    """Radix cache on, large pool, no chunking of these prompts."""
    return make_scheduler(model_path=SMOLLM2, skip_tokenizer_init=True, max_total_tokens=8192)


def assert_pool_clean(sched):
    """Nothing running: every KV slot is free or held (unlocked) by the radix tree, exactly once."""
    assert not sched.has_work()
    tree, alloc = sched.tree_cache, sched.allocator
    assert tree.protected_size() == 0
    assert alloc.available_size() + tree.evictable_size() == sched.max_total_num_tokens
    if not tree.disable:
        assert tree.evictable_size() == tree.total_size()
    free = alloc.free_pages.tolist()
    assert len(free) == len(set(free)), "a page was freed twice"
    assert 0 not in free, "the dummy page was handed to the allocator"
    assert sched.req_to_token_pool.available_size() == sched.req_to_token_pool.size


def test_batch_of_16_equals_each_alone(cached, prompts, alone):
    assert len({tuple(a) for a in alone}) > 8  # mostly different continuations
    cached.flush_cache()
    fwd0 = cached.forward_ct
    outs = run_scheduler(cached, prompts, greedy_params(NEW))
    for i, (out, ref) in enumerate(zip(outs, alone)):
        assert out.output_ids == ref, f"prompt {i} ({len(prompts[i])} tokens) differs in the batch"
        assert out.finish_reason == {"type": "length", "length": NEW}
    # They really ran together: one prefill and NEW - 1 decode steps, not 16 * NEW forwards.
    assert cached.forward_ct - fwd0 == NEW
    assert_pool_clean(cached)


def test_shared_prefix_is_served_from_the_radix_cache(cached, prompts, alone, tok):
    cached.flush_cache()
    shared = [i for i in range(16) if i % 3 == 0]
    system_len = len(tok.encode(SYSTEM))
    total0 = cached.stats.cached_tokens_total
    first = run_scheduler(cached, [prompts[shared[0]]], greedy_params(NEW))[0]
    assert first.cached_tokens == 0 and first.output_ids == alone[shared[0]]
    rest = run_scheduler(cached, [prompts[i] for i in shared[1:]], greedy_params(NEW))
    for i, out in zip(shared[1:], rest):
        assert out.cached_tokens >= system_len - 1, (i, out.cached_tokens)
        assert out.output_ids == alone[i]
    assert cached.stats.cached_tokens_total - total0 == sum(r.cached_tokens for r in rest)
    # The same prompt again: everything but its last token comes from the cache.
    again = run_scheduler(cached, [prompts[5]], greedy_params(NEW))[0]
    again2 = run_scheduler(cached, [prompts[5]], greedy_params(NEW))[0]
    assert again2.cached_tokens == len(prompts[5]) - 1
    assert again.output_ids == again2.output_ids == alone[5]
    assert_pool_clean(cached)


def test_engine_reports_cached_tokens(tok):
    engine = smollm2_engine()
    assert engine.flush_cache()
    before = engine.get_server_info()["scheduler_stats"]["cached_tokens_total"]
    a = engine.generate(f"{SYSTEM} what is the sky?", greedy_params(8))
    b = engine.generate(f"{SYSTEM} where do rivers go?", greedy_params(8))
    alone_b = engine.generate(input_ids=tok.encode(f"{SYSTEM} where do rivers go?"), sampling_params=greedy_params(8))
    assert a["meta_info"]["cached_tokens"] == 0
    assert b["meta_info"]["cached_tokens"] >= len(tok.encode(SYSTEM)) - 1
    assert b["output_ids"] == alone_b["output_ids"]
    after = engine.get_server_info()["scheduler_stats"]["cached_tokens_total"]
    assert after - before >= b["meta_info"]["cached_tokens"] + alone_b["meta_info"]["cached_tokens"]
    # Sixteen prompts in one call give what each gives alone.
    texts = [f"Count: {' '.join(str(j) for j in range(i + 1))}" for i in range(16)]
    batch = engine.generate(texts, greedy_params(6))
    singles = [engine.generate(t, greedy_params(6)) for t in texts[:4]]
    assert [o["output_ids"] for o in batch[:4]] == [o["output_ids"] for o in singles]
    assert all(o["meta_info"]["completion_tokens"] == 6 for o in batch)


@pytest.mark.parametrize("page_size", [1, 4])
def test_small_pool_retracts_and_finishes_every_request(prompts, alone, page_size):
    sched = make_scheduler(
        model_path=SMOLLM2,
        skip_tokenizer_init=True,
        max_total_tokens=256,
        chunked_prefill_size=32,
        page_size=page_size,
    )
    assert sched.max_total_num_tokens == 256
    need = sum(len(p) + NEW for p in prompts)
    assert need > 2 * sched.max_total_num_tokens  # cannot all be resident at once
    outs = run_scheduler(sched, prompts, greedy_params(NEW))
    for i, (out, ref) in enumerate(zip(outs, alone)):
        assert out.output_ids == ref, f"prompt {i} differs with a 256-token pool (page {page_size})"
        assert out.finish_reason["type"] == "length"
    assert sched.stats.num_retractions > 0, "the pool was meant to be too small: no request was retracted"
    assert sched.stats.cached_tokens_total > 0  # retracted requests resume from their cached prefix
    assert_pool_clean(sched)


@pytest.fixture(scope="module")
def long_prompt(tok):
    rng = random.Random(1)
    text = "Summarise: " + " ".join(rng.choice(WORDS) for _ in range(300))
    ids = tok.encode(text)
    assert len(ids) > 250
    return ids


@pytest.fixture(scope="module")
def long_ref(plain, long_prompt):
    return run_scheduler(plain, [long_prompt], greedy_params(NEW))[0].output_ids


@pytest.mark.parametrize("chunk,page_size", [(16, 1), (64, 1), (24, 8)])
def test_chunked_prefill_equals_unchunked(long_prompt, long_ref, chunk, page_size):
    sched = make_scheduler(
        model_path=SMOLLM2,
        skip_tokenizer_init=True,
        max_total_tokens=2048,
        chunked_prefill_size=chunk,
        page_size=page_size,
    )
    out = run_scheduler(sched, [long_prompt], greedy_params(NEW))[0]
    assert out.output_ids == long_ref
    aligned_chunk = chunk // page_size * page_size
    expected_chunks = -(-len(long_prompt) // aligned_chunk)
    assert sched.forward_ct == expected_chunks + NEW - 1  # prefill chunks, then decode steps
    assert out.cached_tokens == 0
    assert_pool_clean(sched)


def test_disable_radix_cache(plain, prompts, alone):
    total0 = plain.stats.cached_tokens_total
    shared = [prompts[0], prompts[3], prompts[0]]
    outs = run_scheduler(plain, shared, greedy_params(NEW))
    assert [o.output_ids for o in outs] == [alone[0], alone[3], alone[0]]
    assert all(o.cached_tokens == 0 for o in outs)
    assert plain.stats.cached_tokens_total == total0 == 0
    assert plain.tree_cache.total_size() == 0
    assert plain.allocator.available_size() == plain.max_total_num_tokens  # everything went back
    assert_pool_clean(plain)


def test_requests_that_cannot_fit_are_refused_not_hung(prompts):
    sched = make_scheduler(model_path=SMOLLM2, skip_tokenizer_init=True, max_total_tokens=64, chunked_prefill_size=16)
    too_long = (prompts[5] * 2)[:80]
    outs = run_scheduler(sched, [too_long, prompts[1]], [greedy_params(4), greedy_params(4)])
    assert outs[0].finish_reason["type"] == "abort" and "KV cache" in outs[0].finish_reason["message"]
    assert outs[1].finish_reason["type"] == "length"
    # Fits at admission but outgrows the whole pool while decoding: aborted with a message, not hung.
    grows = run_scheduler(sched, [prompts[4][:40]], greedy_params(100))[0]
    assert grows.finish_reason["type"] == "abort" and "cannot hold" in grows.finish_reason["message"]
    assert 0 < len(grows.output_ids) < 100
    assert_pool_clean(sched)


def test_seeded_sampling_is_batch_invariant(cached, prompts):
    """A seeded, sampled request draws the same tokens alone and inside a batch of others."""
    params = [
        {"max_new_tokens": 8, "temperature": 0.8, "top_p": 0.9, "seed": 1234 + i, "ignore_eos": True} for i in range(4)
    ]
    picks = [prompts[i] for i in (1, 4, 7, 9)]
    cached.flush_cache()
    together = run_scheduler(cached, picks, params)
    cached.flush_cache()
    apart = [run_scheduler(cached, [p], [sp])[0] for p, sp in zip(picks, params)]
    assert [o.output_ids for o in together] == [o.output_ids for o in apart]
    greedy = run_scheduler(cached, picks, greedy_params(8))
    assert [o.output_ids for o in together] != [o.output_ids for o in greedy]  # it did sample


def test_stop_token_ids_and_min_new_tokens(cached, prompts, alone):
    ref = alone[2]
    stop = ref[3]
    first = ref.index(stop)
    out = run_scheduler(cached, [prompts[2]], {"max_new_tokens": NEW, "temperature": 0, "stop_token_ids": [stop]})[0]
    assert out.output_ids == ref[: first + 1]
    assert out.finish_reason == {"type": "stop", "matched": stop}
    # min_new_tokens masks the stop token until enough tokens exist, so the continuation changes.
    later = run_scheduler(
        cached,
        [prompts[2]],
        {"max_new_tokens": NEW, "temperature": 0, "stop_token_ids": [stop], "min_new_tokens": first + 2},
    )[0]
    assert len(later.output_ids) >= first + 2 and stop not in later.output_ids[: first + 1]
    assert_pool_clean(cached)


def test_abort_running_and_waiting_requests(cached, prompts):
    from sglang.srt.managers.io_struct import AbortReq, TokenizedGenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams

    cached.flush_cache()
    col = cached.output_sink
    for rid, p in (("keep", prompts[1]), ("drop-running", prompts[2]), ("drop-waiting", prompts[3])):
        cached.add_request(
            TokenizedGenerateReqInput(rid, "", p, SamplingParams.from_dict(greedy_params(NEW)), False, False)
        )
    cached.max_running_requests, saved = 2, cached.max_running_requests  # keep the third one waiting
    try:
        cached.step()  # prefill of the first two
        cached.step()  # one decode step
        cached.abort_request(AbortReq("drop-running"))
        cached.abort_request(AbortReq("drop-waiting"))
        while cached.has_work():
            cached.step()
    finally:
        cached.max_running_requests = saved
    res = {rid: col.results.pop(rid) for rid in ("keep", "drop-running", "drop-waiting")}
    assert res["keep"].finish_reason["type"] == "length" and len(res["keep"].output_ids) == NEW
    assert res["drop-running"].finish_reason["type"] == "abort" and len(res["drop-running"].output_ids) < NEW
    assert res["drop-waiting"].finish_reason["type"] == "abort" and res["drop-waiting"].output_ids == []
    assert_pool_clean(cached)


def test_ttft_metric_uses_the_first_token_time_for_non_streamed_requests():
    """Non-streamed tokens reach the tokenizer manager only with the last one; TTFT must still be the
    time of the first token (from the scheduler), not the end-to-end latency."""
    engine = smollm2_engine()
    metrics = engine.tokenizer_manager.metrics

    def sums():
        reg = metrics.registry
        return (
            reg.get_sample_value("sglang:time_to_first_token_seconds_sum", metrics.labels) or 0.0,
            reg.get_sample_value("sglang:e2e_request_latency_seconds_sum", metrics.labels) or 0.0,
        )

    ttft0, e2e0 = sums()
    out = engine.generate("Count from one to twenty:", greedy_params(24))
    ttft1, e2e1 = sums()
    assert len(out["output_ids"]) == 24
    ttft, e2e = ttft1 - ttft0, e2e1 - e2e0
    assert 0 < ttft < 0.5 * e2e  # 23 decode steps follow the first token
