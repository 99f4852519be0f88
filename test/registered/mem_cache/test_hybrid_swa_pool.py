"""The hybrid SWA pool's bookkeeping under pressure, through the in-process scheduler on the CPU: a Qwen2 with two
sliding-window layers (window 12) beside two full ones, 17 requests of 3-160 tokens (some extending others, so the
radix cache matches, splits and locks prefixes), twice (the second time through what the cache kept). Across page
sizes, mixed chunks, chunked prefill, overlap on and off, and window pools from the smallest the planner allows to a
roomy one, the greedy tokens equal those of the same weights on one pool, and afterwards every slot of both pools is
free or cached (none leaked, none freed twice). A window pool too small for one request's windows is refused at
start-up, naming the flag."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=15, suite="per-commit-cpu")

import random

import pytest

from sglang.srt.model_executor.pool_configurator import NotEnoughMemoryError
from sglang.test.runners import greedy_params, make_scheduler, run_scheduler, save_tiny_hf_model
from sglang.test.tiny_sliding_window import qwen2_config

NEW_TOKENS = 20


def prompts():
    rng = random.Random(5)
    out = [[rng.randrange(3, 512) for _ in range(rng.randrange(3, 90))] for _ in range(14)]
    return out + [out[0] + [7, 8, 9] * 5, out[1][:20] + [11] * 30, out[2] + out[3]]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    d = save_tiny_hf_model(qwen2_config(), str(tmp_path_factory.mktemp("qwen2-swa")))
    one_pool = make_scheduler(
        reuse_model=False, model_path=d, skip_tokenizer_init=True, max_total_tokens=4096, disable_hybrid_swa_memory=True
    )
    return d, [o.output_ids for o in run_scheduler(one_pool, prompts(), greedy_params(NEW_TOKENS))]


# (page size, mixed chunk, chunked prefill, window pool ratio, overlap off, full pool): 0.0782 of 512 is 40 tokens,
# the planner's floor for a window of 12 in pages of 4; 0.0547 of 512 is 28, the floor in pages of 1.
CASES = [
    (1, False, None, 0.0547, False, 512),
    (1, True, None, 0.06, True, 512),
    (4, False, 16, 0.0782, False, 512),
    (4, True, 16, 0.3, True, 512),
    (4, False, None, 0.3, False, 4096),
    (1, False, 16, 0.3, True, 4096),
]


@pytest.mark.parametrize("page,mixed,chunk,ratio,overlap_off,total", CASES)
def test_outputs_equal_one_pool_and_no_slot_leaks(checkpoint, page, mixed, chunk, ratio, overlap_off, total):
    d, reference = checkpoint
    sched = make_scheduler(
        reuse_model=False,
        model_path=d,
        skip_tokenizer_init=True,
        page_size=page,
        enable_mixed_chunk=mixed,
        chunked_prefill_size=chunk,
        swa_full_tokens_ratio=ratio,
        disable_overlap_schedule=overlap_off,
        max_total_tokens=total,
    )
    alloc, cache = sched.allocator, sched.tree_cache
    assert alloc.swa_size == int(total * ratio) // page * page
    for _ in range(2):
        outs = run_scheduler(sched, prompts(), greedy_params(NEW_TOKENS))
        assert [o.output_ids for o in outs] == reference
        assert alloc.available_size() + cache.evictable_size() == alloc.size
        assert alloc.swa_available_size() + cache.swa_evictable_size() == alloc.swa_size


def test_a_window_pool_below_one_requests_windows_is_refused(checkpoint):
    d, _ = checkpoint
    with pytest.raises(NotEnoughMemoryError, match="--swa-full-tokens-ratio"):
        make_scheduler(
            reuse_model=False,
            model_path=d,
            skip_tokenizer_init=True,
            page_size=4,
            swa_full_tokens_ratio=0.0547,
            max_total_tokens=512,
        )


def test_stats_report_the_window_pool_in_use(checkpoint, monkeypatch):
    """/metrics' swa_token_usage (and /server_info's num_used_swa_tokens): window slots requests hold, within the
    window pool, none once they are done."""
    d, _ = checkpoint
    sched = make_scheduler(
        reuse_model=False, model_path=d, skip_tokenizer_init=True, swa_full_tokens_ratio=0.1, max_total_tokens=512
    )
    used, step = [], sched.step

    def step_and_record() -> bool:
        busy = step()
        sched.update_stats()
        used.append(sched.stats.num_used_swa_tokens)
        return busy

    monkeypatch.setattr(sched, "step", step_and_record)
    run_scheduler(sched, prompts(), greedy_params(NEW_TOKENS))
    assert 0 < max(used) <= sched.allocator.swa_size == 51
    assert used[-1] == 0 and sched.stats.swa_token_usage == 0.0
