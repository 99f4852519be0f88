from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=2, suite="per-commit-cpu")

# SWATokenToKVPoolAllocator (the hybrid SWA pool's slots): every token a full-pool slot and a window slot at the
# same page offset, the map between them, window slots freed alone or with the full slot, and all-or-nothing
# allocation when either pool is dry.

import pytest
import torch

from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
from sglang.srt.mem_cache.swa_allocator import SWATokenToKVPoolAllocator
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool


def test_tokens_get_a_slot_in_both_pools_and_the_map_names_it():
    a = SWATokenToKVPoolAllocator(16, 8, 1, "cpu")
    full = a.alloc(5)
    swa = a.full_to_swa[full]
    assert (swa > 0).all() and len(set(swa.tolist())) == 5
    assert (a.available_size(), a.swa_available_size()) == (11, 3)
    a.free_swa(full[:2])  # two tokens leave every window: their full slots stay
    assert a.swa_held(full).tolist() == [False, False, True, True, True]
    assert (a.available_size(), a.swa_available_size()) == (11, 5)
    a.free(full)  # both slots of the rest, the full slots of the first two
    assert (a.available_size(), a.swa_available_size()) == (16, 8)
    assert int(a.full_to_swa.abs().sum()) == 0


def test_a_dry_window_pool_fails_the_allocation_and_takes_nothing():
    a = SWATokenToKVPoolAllocator(16, 4, 1, "cpu")
    assert a.alloc(5) is None
    assert (a.available_size(), a.swa_available_size()) == (16, 4)
    assert a.alloc_decode([1, 1, 1, 1, 1], None) is None
    assert a.alloc(4) is not None and a.alloc(1) is None


@pytest.mark.parametrize("ps", [1, 4])
def test_paged_window_slots_keep_the_full_slots_page_offsets(ps):
    a = SWATokenToKVPoolAllocator(64, 32, ps, "cpu")
    full = a.alloc_extend([0, 0], [6, 9], [-1, -1] if ps > 1 else None)
    swa = a.full_to_swa[full]
    assert (full % ps).tolist() == (swa % ps).tolist()
    # A decode step continues each request's last page in both pools.
    last = [int(full[5]), int(full[-1])]
    more = a.alloc_decode([7, 10], last if ps > 1 else None)
    assert (more % ps).tolist() == (a.full_to_swa[more] % ps).tolist()
    if ps > 1:
        assert (a.full_to_swa[more] // ps).tolist() == (a.full_to_swa[torch.tensor(last)] // ps).tolist()


def test_continuing_a_page_whose_token_left_the_window_is_a_bookkeeping_error():
    a = SWATokenToKVPoolAllocator(32, 16, 4, "cpu")
    full = a.alloc_extend([0], [2], [-1])
    a.free_swa(full)
    with pytest.raises(RuntimeError, match="no window slot"):
        a.alloc_decode([3], [int(full[-1])])


def test_pool_stores_windowed_layers_at_their_window_slots():
    a = SWATokenToKVPoolAllocator(16, 8, 1, "cpu")
    pools = [MHATokenToKVPool(n, 1, torch.float32, 1, 2, 2, 1, "cpu") for n in (16, 8)]
    pool = SWAKVPool(*pools, layer_windows=(-1, 4), full_to_swa=a.full_to_swa)
    full = a.alloc(3)
    k = torch.arange(6, dtype=torch.float32).view(3, 1, 2)
    for layer in (0, 1):
        pool.set_kv_buffer(layer, full, k, -k)
    assert torch.equal(pool.get_key_buffer(0)[full], k)  # the full layer at the full slots
    assert torch.equal(pool.get_key_buffer(1)[a.full_to_swa[full]], k)  # the windowed one at the window slots
    assert torch.equal(pool.get_value_buffer(1)[pool.to_swa_slots(full)], -k)
    assert pool.get_key_buffer(1).shape[0] == 9 and pool.get_key_buffer(0).shape[0] == 17
    assert pool.fused_store_buffers(1, k, k) is None  # a windowed layer's store maps its slots


def test_a_dry_window_pool_leaves_a_continued_page_alone():
    """A request's partly filled last page is continued in both pools: when the window pool lacks the new pages,
    nothing is taken, and the continued page is not given back (it is still the request's)."""
    a = SWATokenToKVPoolAllocator(32, 8, 4, "cpu")
    first = a.alloc_extend([0], [2], [-1])  # one page in each pool, half used
    other = a.alloc(4)  # the window pool's last free page
    assert a.swa_available_size() == 0 and a.available_size() == 24
    assert a.alloc_extend([2], [7], [int(first[-1])]) is None  # would continue the page and take one more
    assert a.available_size() == 24 and a.swa_available_size() == 0
    a.free(other)
    more = a.alloc_extend([2], [7], [int(first[-1])])
    assert (more[:2] // 4).tolist() == [int(first[0]) // 4] * 2  # the page continued, then a new one
    assert a.available_size() == 24 and a.swa_available_size() == 0


def test_post_capture_resize_grows_both_pools_within_the_slot_map():
    """Post-capture sizing: the pools start at what one granule holds and grow to the planner's sizes; the slot map
    (held by attention and the decode graphs) is allocated once for the bound, and a pool past it is refused."""
    a = SWATokenToKVPoolAllocator(8, 4, 4, "cpu", max_size=64)
    assert a.full_to_swa.shape[0] == 68
    held = a.alloc(4)
    a.resize(64, 16)
    assert (a.size, a.swa_size) == (64, 16)
    assert (a.available_size(), a.swa_available_size()) == (60, 12)  # the page in use stays in use in both
    assert a.alloc(16) is None  # every new token needs a window slot too: 12 left
    more = a.alloc(12)
    assert more is not None and int(more.max()) < 68 and bool((a.full_to_swa[more] > 0).all())
    a.free(torch.cat([held, more]))
    assert (a.available_size(), a.swa_available_size()) == (64, 16)
    with pytest.raises(ValueError, match="larger than the slot map"):
        a.resize(68, 16)
