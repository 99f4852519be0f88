from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="per-commit-cpu")

# A batch that fails (out of device memory, or a bug) is answered and cleaned up, and the scheduler keeps
# serving (SmolLM2, CPU, in-process, KV slots poisoned with NaN so a wrongly reused slot shows at once):
#   * a failed prefill, a failed decode step and a failed chunk of a chunked prefill each finish the
#     batch's requests with an abort (503 for out-of-memory, 500 for an error) and leak no KV slot;
#   * their half-written K/V never enters the radix cache: the same prompts afterwards give exactly the
#     output they give on a fresh scheduler.

import pytest

from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.utils.fault_injection import FaultPlan
from sglang.srt.utils.hf_tokenizer import get_tokenizer
from sglang.test.runners import SMOLLM2, greedy_params, make_scheduler, run_scheduler

NEW = 8
SYSTEM = "You are a helpful assistant. Answer briefly and precisely. Question:"


@pytest.fixture(scope="module")
def prompts():
    tok = get_tokenizer(SMOLLM2)
    texts = [f"{SYSTEM} what is {x}?" for x in ("a cat", "the sky", "a river")] + ["word " * 60]
    return [tok.encode(t) for t in texts]


@pytest.fixture(scope="module")
def reference(prompts):
    fresh = make_scheduler(model_path=SMOLLM2, skip_tokenizer_init=True, max_total_tokens=4096)
    return [r.output_ids for r in run_scheduler(fresh, prompts, greedy_params(NEW))]


def no_slot_leaked(sched) -> bool:
    """Every slot is free or held by an unlocked radix-tree node (nothing runs any more)."""
    return (
        sched.allocator.available_size() + sched.tree_cache.evictable_size() == sched.max_total_num_tokens
        and sched.tree_cache.protected_size() == 0
        and sched.req_to_token_pool.available_size() == sched.req_to_token_pool.size
    )


def submit(sched, rid: str, ids) -> None:
    params = SamplingParams.from_dict(greedy_params(NEW))
    sched.add_request(TokenizedGenerateReqInput(rid, "", list(ids), params, False, False))


def run_until_idle(sched) -> None:
    for _ in range(10_000):
        if not sched.has_work():
            return
        sched.step()
    raise AssertionError("the scheduler did not become idle")


@pytest.mark.parametrize(
    "fault,after,status",
    [
        ("forward_oom_at", 1, 503),  # the prefill of both requests
        ("forward_error_at", 3, 500),  # their second decode step
    ],
)
def test_failed_batch_is_answered_and_cleaned_up(prompts, reference, fault, after, status):
    sched = make_scheduler(model_path=SMOLLM2, skip_tokenizer_init=True, max_total_tokens=4096)
    assert run_scheduler(sched, prompts[:1], greedy_params(NEW))[0].output_ids == reference[0]  # warms the cache
    sched.faults = FaultPlan(**{fault: sched.forward_ct + after})
    submit(sched, "a", prompts[1])
    submit(sched, "b", prompts[2])
    run_until_idle(sched)
    for rid in ("a", "b"):
        fr = sched.collector.results[rid].finish_reason
        assert fr["type"] == "abort" and fr["status_code"] == status, fr
    assert no_slot_leaked(sched)
    again = run_scheduler(sched, prompts[:3], greedy_params(NEW))
    assert [r.output_ids for r in again] == reference[:3]
    assert no_slot_leaked(sched)


def test_failed_chunk_of_a_chunked_prefill(prompts, reference):
    sched = make_scheduler(model_path=SMOLLM2, skip_tokenizer_init=True, max_total_tokens=4096, chunked_prefill_size=16)
    sched.faults = FaultPlan(forward_oom_at=sched.forward_ct + 3)  # the third of the long prompt's chunks
    submit(sched, "long", prompts[3])
    run_until_idle(sched)
    assert sched.collector.results["long"].finish_reason["status_code"] == 503
    assert sched.chunked_req is None and no_slot_leaked(sched)
    assert run_scheduler(sched, prompts[3:], greedy_params(NEW))[0].output_ids == reference[3]
    assert no_slot_leaked(sched)
