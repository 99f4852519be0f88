from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=40, suite="per-commit-cpu")

# Overlap scheduling (on by default; --disable-overlap-schedule turns it off) on SmolLM2 (real weights, CPU):
#   * the scheduler really launches decode step N + 1 before it processes step N's result, and a new
#     request's prefill before the result of the prefill in flight;
#   * greedy and seeded-sampling outputs are identical with overlap on and off, with stop tokens, stop
#     strings, min_new_tokens, penalties, chunked prefill, page size 4 and a shared cached prefix;
#   * a pool too small for the batch retracts requests under overlap and still gives identical outputs;
#   * a request aborted while its step is in flight ends with the abort, the others are unaffected;
#   * length-limited requests cost no extra forward; every KV slot is accounted for afterwards.

import pytest

from sglang.srt.managers.io_struct import AbortReq, TokenizedGenerateReqInput
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.utils.hf_tokenizer import get_tokenizer
from sglang.test.runners import SMOLLM2, greedy_params, make_scheduler, run_scheduler

NEW = 12
SYSTEM = "You are a helpful assistant. Answer briefly and precisely. Question:"
QUESTIONS = [
    "What is the capital of France?",
    "Name three colours.",
    "Why is the sky blue?",
    "Count from one to five.",
    "hi",
    "Write a haiku about rivers.",
    "What is two plus two?",
    "Describe a cat in one sentence.",
]


@pytest.fixture(scope="module")
def tok():
    return get_tokenizer(SMOLLM2)


@pytest.fixture(scope="module")
def prompts(tok):
    """Eight prompts; the even ones share a system prefix (a radix-cache hit in the second half)."""
    return [tok.encode(f"{SYSTEM} {q}" if i % 2 == 0 else q) for i, q in enumerate(QUESTIONS)]


def scheduler(overlap: bool, **args):
    args.setdefault("max_total_tokens", 4096)
    return make_scheduler(model_path=SMOLLM2, disable_overlap_schedule=not overlap, **args)


@pytest.fixture(scope="module")
def pair():
    """Overlap on and off, chunked prefill of 16 tokens, pages of 4 tokens."""
    kw = dict(chunked_prefill_size=16, page_size=4)
    return scheduler(True, **kw), scheduler(False, **kw)


def assert_pool_clean(sched):
    assert not sched.has_work() and sched.in_flight is None
    tree, alloc = sched.tree_cache, sched.allocator
    assert tree.protected_size() == 0
    assert alloc.available_size() + tree.evictable_size() == sched.max_total_num_tokens
    free = alloc.free_pages.tolist()
    assert len(free) == len(set(free)), "a page was freed twice"
    assert sched.req_to_token_pool.available_size() == sched.req_to_token_pool.size
    assert all(not r.tokens_in_flight for r in sched.waiting_queue)
    assert set(sched.collector.finishes.values()) <= {1}, "a request was reported finished twice"


def log_calls(obj, method: str, label: str, events: list) -> None:
    """Record `label` in `events` each time obj.method is called."""
    original = getattr(obj, method)

    def logged(*args):
        events.append(label)
        return original(*args)

    setattr(obj, method, logged)


def run_both(pair, prompts, params):
    on, off = pair
    got = [run_scheduler(s, prompts, params) for s in (on, off)]
    for s in pair:
        assert_pool_clean(s)
    return got


def test_overlap_launches_the_next_step_before_processing_the_last(prompts):
    """Order of events for one request: with overlap, each decode step is launched before the previous
    step's result is processed; without, every launch is processed before the next."""
    orders = {}
    for overlap in (True, False):
        sched, events = scheduler(overlap), []
        log_calls(sched, "run_batch", "launch", events)
        log_calls(sched, "process_batch_result", "process", events)
        fwd0 = sched.forward_ct
        (out,) = run_scheduler(sched, [prompts[1]], greedy_params(NEW))
        assert len(out.output_ids) == NEW
        assert sched.forward_ct - fwd0 == NEW  # a prefill and NEW - 1 decodes: no step wasted on a finished request
        orders[overlap] = events

    def launches_before_each_result(order):
        """For the k-th processed result (of the k-th launched batch), how many batches were launched by then."""
        counts, launched = [], 0
        for kind in order:
            launched += kind == "launch"
            if kind == "process":
                counts.append(launched)
        return counts

    # Without overlap: launch, process, launch, process ...
    assert orders[False] == ["launch", "process"] * NEW
    # With overlap the k-th result is processed after batch k + 1 went out, for every decode step but the last
    # (the prefill's result is needed first: its request joins the running batch).
    on = launches_before_each_result(orders[True])
    assert len(on) == NEW and on[0] == 1 and on[-1] == NEW
    assert on[1:-1] == [k + 1 for k in range(2, NEW)]


def test_prefills_go_out_back_to_back(prompts):
    """New requests' prefills are launched before the result of the prefill in flight is processed (the device
    runs them back to back); the first decode waits for the last prefill's result (its requests join the
    running batch then). One request per prefill (a budget of one token admits only a batch's first request);
    outputs equal the overlap-off run, and the device timeline counts every batch."""
    outs = {}
    for overlap in (True, False):
        sched, events = scheduler(overlap, max_prefill_tokens=1), []
        log_calls(sched, "run_batch", "launch", events)
        log_calls(sched, "process_batch_result", "process", events)
        outs[overlap] = run_scheduler(sched, prompts[:4], greedy_params(NEW))
        assert_pool_clean(sched)
        if overlap:
            # prefill 1 out, prefill 2 out, then prefill 1's result; ... prefill 4's result before decode 1 goes out
            assert events[:7] == ["launch", "launch", "process", "launch", "process", "launch", "process"]
            assert events[7:9] == ["process", "launch"]
        else:
            assert events[:8] == ["launch", "process"] * 4
        stats = sched.stats
        assert stats.prefill_batches == 4 and stats.prefill_batches + stats.decode_batches == sched.forward_ct
        assert stats.prefill_device_seconds > 0 and stats.decode_device_seconds > 0
        assert stats.device_gap_before_prefill_seconds >= 0 and stats.device_gap_before_decode_seconds > 0
    for i, (a, b) in enumerate(zip(outs[True], outs[False])):
        assert a.output_ids == b.output_ids and len(a.output_ids) == NEW, f"prompt {i}"


def test_greedy_outputs_identical_with_stops_and_lengths(pair, prompts, tok):
    """Greedy: stop tokens and stop strings (taken from the unconstrained output, so they do fire),
    min_new_tokens and lengths from 1 to NEW give the same tokens and finish reasons with overlap on and off."""
    free_run = run_scheduler(pair[1], prompts, greedy_params(NEW))
    params = []
    for i, out in enumerate(free_run):
        p = greedy_params([1, 3, NEW, 5][i % 4])
        if i % 4 == 2:
            p["stop_token_ids"] = [out.output_ids[3]]  # fires at the 4th token (or earlier)
        if i == 6:
            p["stop"] = [tok.decode(out.output_ids[5:7])]
            p["max_new_tokens"] = NEW
        if i == 3:
            p["min_new_tokens"] = 4
            p["stop_token_ids"] = [out.output_ids[0]]
        params.append(p)
    on, off = run_both(pair, prompts, params)
    for i, (a, b) in enumerate(zip(on, off)):
        assert a.output_ids == b.output_ids, f"prompt {i}"
        assert a.finish_reason == b.finish_reason, f"prompt {i}"
    stops = [o.finish_reason["type"] for o in on]
    assert stops.count("stop") >= 2 and "length" in stops  # both kinds of finish happened
    assert len(on[3].output_ids) >= 4  # min_new_tokens held back the stop token


def test_sampled_outputs_identical_with_seeds_and_penalties(pair, prompts):
    """Seeded sampling (top-p, top-k) is a function of (seed, step): identical with overlap on and off,
    including requests with frequency / presence / repetition penalties (which wait for their tokens)."""
    params = []
    for i in range(len(prompts)):
        p = {"max_new_tokens": NEW, "temperature": 0.9, "top_p": 0.9, "top_k": 40, "sampling_seed": 100 + i}
        if i % 3 == 1:
            p.update(frequency_penalty=0.5, presence_penalty=0.3, repetition_penalty=1.1)
        params.append(p)
    on, off = run_both(pair, prompts, params)
    for i, (a, b) in enumerate(zip(on, off)):
        assert a.output_ids == b.output_ids, f"prompt {i}"
    assert len({tuple(o.output_ids) for o in on}) > 4


def test_retraction_under_overlap_gives_identical_outputs(prompts):
    """A pool of 160 tokens for 8 requests of 4-20-token prompts and 24 new tokens each (256 tokens in all):
    requests are retracted (and their KV cached) while steps are in flight; outputs equal the overlap-off run."""
    params = greedy_params(24)
    outs = {}
    for overlap in (True, False):
        sched = scheduler(overlap, max_total_tokens=160, page_size=4)
        outs[overlap] = run_scheduler(sched, prompts, params)
        assert_pool_clean(sched)
        if overlap:
            assert sched.stats.num_retractions > 0
    for i, (a, b) in enumerate(zip(outs[True], outs[False])):
        assert a.output_ids == b.output_ids and len(a.output_ids) == 24, f"prompt {i}"


def test_abort_while_a_step_is_in_flight(prompts):
    """Abort a request whose prefill is in flight, and a decoding one right after a step was launched for
    it: both finish with the abort's reason and status, the other two give exactly what they give alone."""
    sched = scheduler(True)
    reference = run_scheduler(scheduler(False), prompts[:2], greedy_params(NEW))
    rids = ["keep-0", "keep-1", "victim", "early"]
    for rid, ids in zip(rids, prompts):
        sched.add_request(
            TokenizedGenerateReqInput(rid, "", list(ids), SamplingParams.from_dict(greedy_params(NEW)), False, False)
        )
    sched.step()
    # The prefill is in flight: its requests are neither waiting nor running, and can still be aborted.
    assert sched.in_flight.forward_mode.is_extend() and not sched.waiting_queue and sched.running_batch is None
    sched.abort_request(AbortReq("early", message="gone before its first token", status_code=499))
    for _ in range(3):  # three decode steps
        sched.step()
    assert sched.in_flight is not None and sched.in_flight.forward_mode.is_decode()
    assert any(r.rid == "victim" for r in sched.in_flight.reqs)
    sched.abort_request(AbortReq("victim", message="client went away", status_code=499))
    while sched.has_work():
        sched.step()
    results = sched.collector.results
    early = results.pop("early")
    assert early.finish_reason["type"] == "abort" and early.output_ids == []
    victim = results.pop("victim")
    assert victim.finish_reason["type"] == "abort" and victim.finish_reason["status_code"] == 499
    assert 0 < len(victim.output_ids) < NEW
    for rid, ref in zip(rids[:2], reference):
        assert results.pop(rid).output_ids == ref.output_ids
    assert_pool_clean(sched)
