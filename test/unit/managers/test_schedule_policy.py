from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=2, suite="per-commit-cpu")

# PrefillAdder's memory budget: a matched prefix that the request locks stops counting as room
# (it was evictable when the budget was computed), and a request is never left waiting forever.

from types import SimpleNamespace

from sglang.srt.managers.schedule_policy import PrefillAdder
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.sampling.sampling_params import SamplingParams


def setup_cache(pool=64, cached=40):
    alloc = TokenToKVPoolAllocator(pool, 1, "cpu")
    tree = RadixCache(ReqToTokenPool(4, 128, "cpu"), alloc, 1)
    prefix = list(range(100, 100 + cached))
    tree.insert(prefix, alloc.alloc(cached))  # evictable: nobody holds it
    return alloc, tree, prefix


def make_req(tree, ids, max_new=0):
    req = SimpleNamespace(
        fill_ids=list(ids),
        output_ids=[],
        num_generated=0,
        sampling_params=SamplingParams.from_dict({"max_new_tokens": max_new}),
        cache_protected_len=0,
    )
    req.prefix_indices, req.last_node = tree.match_prefix(req.fill_ids[:-1])
    req.extend_input_len = len(req.fill_ids) - len(req.prefix_indices)
    return req


def adder(alloc, tree, has_running):
    return PrefillAdder(
        page_size=1,
        rem_total_tokens=alloc.available_size() + tree.evictable_size(),
        rem_input_tokens=4096,
        rem_chunk_tokens=None,
        rem_requests=8,
        has_running=has_running,
    )


def test_locked_prefix_is_not_room_for_the_request_itself():
    alloc, tree, prefix = setup_cache()
    assert alloc.available_size() == 24 and tree.evictable_size() == 40
    req = make_req(tree, prefix + list(range(30)))  # 40 cached + 30 new tokens; only 24 slots are free
    assert len(req.prefix_indices) == 40 and req.extend_input_len == 30
    a = adder(alloc, tree, has_running=True)
    assert a.add_one_req(req, tree, 0.7) == "full"  # counting the prefix as evictable would admit it
    assert tree.protected_size() == 0 and tree.evictable_size() == 40  # the trial lock was released
    assert a.rem_total_tokens == 64
    fits = make_req(tree, prefix + list(range(20)))  # 20 new tokens fit the 24 free slots
    assert a.add_one_req(fits, tree, 0.7) == "added"
    assert tree.protected_size() == 40 and fits.cache_protected_len == 40
    assert a.rem_total_tokens == 64 - 40 - 20
    assert alloc.alloc(fits.extend_input_len) is not None  # what the batch will allocate is really there


def test_idle_scheduler_admits_a_request_larger_than_its_estimate():
    alloc, tree, _ = setup_cache(pool=64, cached=0)
    req = make_req(tree, list(range(40)), max_new=100)  # 40 + 0.7 * 100 > 64
    assert adder(alloc, tree, has_running=True).add_one_req(req, tree, 0.7) == "full"
    # Nothing running and nothing admitted yet: admit it rather than wait forever; if it outgrows
    # the pool while decoding, the scheduler aborts it with a message.
    assert adder(alloc, tree, has_running=False).add_one_req(req, tree, 0.7) == "added"
