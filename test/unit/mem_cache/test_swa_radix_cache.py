from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=2, suite="per-commit-cpu")

# SWARadixCache: a cached prefix is reused only up to where its window is still held; window slots of unlocked
# nodes are evicted LRU while the nodes stay cached; running requests give back the window slots of their own
# tokens out of the window only when the window pool is short, never what a launched batch can still read; and
# every slot comes back.

from types import SimpleNamespace

import torch

from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.swa_allocator import SWATokenToKVPoolAllocator
from sglang.srt.mem_cache.swa_radix_cache import SWARadixCache

WINDOW = 4


def make_cache(size: int = 64, swa_size: int = 32, ps: int = 1):
    alloc = SWATokenToKVPoolAllocator(size, swa_size, ps, "cpu")
    pool = ReqToTokenPool(4, 64, "cpu")
    return SWARadixCache(pool, alloc, ps, WINDOW), alloc, pool


def test_match_stops_where_the_window_is_gone():
    c, a, _ = make_cache()
    slots = a.alloc(10)
    a.free_swa(slots[:6])  # positions 0..5 left the window of the request that wrote them
    c.insert(list(range(10)), slots)
    value, node = c.match_prefix(list(range(10)))
    assert len(value) == 10  # a query at 10 sees 7..9: held
    assert len(c.match_prefix(list(range(9)))[0]) == 9  # at 9: 6..8
    # A prefix of 8 would need 5..7, and 5 is gone: nothing shorter down to 0 has its window either.
    value, node = c.match_prefix(list(range(8)) + [99])
    assert len(value) == 0 and node is c.root
    assert c.total_size() == 10


def test_evict_swa_takes_unlocked_nodes_window_slots_lru_and_keeps_the_nodes():
    c, a, _ = make_cache()
    old, new = a.alloc(4), a.alloc(4)
    c.insert([1, 2, 3, 4], old)
    c.insert([5, 6, 7, 8], new)
    assert c.swa_evictable_size() == 8 and c.swa_room() == 32
    _, locked = c.match_prefix([5, 6, 7, 8])
    c.inc_lock_ref(locked)
    assert c.swa_evictable_size() == 4
    assert c.evict_swa(100) == 4  # only the unlocked node gives its window slots back
    assert a.swa_held(old).tolist() == [False] * 4 and a.swa_held(new).all()
    assert c.total_size() == 8 and len(c.match_prefix([1, 2, 3, 4])[0]) == 0
    c.dec_lock_ref(locked)
    assert c.swa_evictable_size() == 4
    c.evict(64)  # the full pool's eviction takes nodes, and their window slots with them
    assert (a.available_size(), a.swa_available_size()) == (64, 32)
    assert c.swa_evictable_size() == 0


def test_split_nodes_keep_the_window_accounting():
    c, a, _ = make_cache()
    slots = a.alloc(6)
    a.free_swa(slots[:2])
    c.insert(list(range(6)), slots)
    assert c.swa_evictable_size() == 4
    c.insert([0, 1, 2, 9, 9], torch.cat((slots[:3], a.alloc(2))))  # splits the node after 3 tokens
    assert c.swa_evictable_size() == 6
    c.evict(64)
    assert c.swa_evictable_size() == 0 and a.swa_available_size() == 32


def _running(pool, slots, committed, protected=0):
    row = pool.alloc(1)[0]
    pool.write(row, 0, slots)
    return SimpleNamespace(
        req_pool_idx=row, kv_committed_len=committed, cache_protected_len=protected, swa_released_len=0
    )


def test_running_requests_release_only_what_no_launched_query_sees_and_only_when_short():
    c, a, pool = make_cache(swa_size=32)
    slots = a.alloc(20)
    req = _running(pool, slots, committed=12, protected=3)
    c.release_out_of_window([req], need=4)  # 12 free window slots: nothing released
    assert a.swa_held(slots).all()
    assert c.swa_room() == 12 and c.swa_room([req]) == 12 + 6  # what it would release (3..8) counts as room
    c.release_out_of_window([req], need=13)
    # Queries still to run are at 12 or later and see 9 on: 3..8 go (0..2 are the tree's).
    assert a.swa_held(slots).tolist() == [True] * 3 + [False] * 6 + [True] * 11
    assert req.swa_released_len == 9
    req.kv_committed_len = 14
    c.release_out_of_window([req], need=100)
    assert a.swa_held(slots).tolist() == [True] * 3 + [False] * 8 + [True] * 9


def test_paged_release_frees_whole_pages_only():
    c, a, pool = make_cache(size=64, swa_size=32, ps=4)
    slots = a.alloc(16)
    req = _running(pool, slots, committed=13)
    c.release_out_of_window([req], need=100)  # queries at 13+ see 10+: pages 0 and 1 (0..7) go, 8..11 stays
    assert a.swa_held(slots).tolist() == [False] * 8 + [True] * 8
    assert a.swa_available_size() == 32 - 8


def test_a_lock_holds_only_its_paths_last_window_and_survives_splits():
    c, a, _ = make_cache()
    head, tail = a.alloc(8), a.alloc(4)
    c.insert(list(range(1, 9)), head)
    c.insert(list(range(1, 13)), torch.cat((head, tail)))
    _, end = c.match_prefix(list(range(1, 13)))
    c.inc_lock_ref(end)  # a request whose next query is at 12 sees 9..11: the last node only
    assert (end.lock_ref, end.swa_lock_ref, end.parent.lock_ref, end.parent.swa_lock_ref) == (1, 1, 1, 0)
    assert c.swa_evictable_size() == 8
    assert c.evict_swa(100) == 8  # the locked parent's window slots go; its full slots stay locked
    assert not a.swa_held(head).any() and a.swa_held(tail).all()
    # Another prefix splits the window-locked node: its head takes the lock and the lock's top mark.
    c.match_prefix(list(range(1, 11)) + [99])
    assert end.key == [11, 12] and end.parent.key == [9, 10] and end.parent.swa_lock_ref == 1
    assert c.swa_evictable_size() == 0
    c.dec_lock_ref(end)
    assert all(n.swa_lock_ref == 0 and n.lock_ref == 0 for n in c._all_nodes() if n is not c.root)
    assert c.swa_evictable_size() == 4
    c.evict(64)
    assert (a.available_size(), a.swa_available_size(), c.swa_evictable_size()) == (64, 32, 0)


def test_locking_the_root_records_nothing():
    """A request with no cached prefix locks the root: no window lock, nothing kept per admission."""
    c, _, _ = make_cache()
    for _ in range(3):
        c.inc_lock_ref(c.root)
        c.dec_lock_ref(c.root)
    assert c.root.swa_lock_tops == [] and c.swa_evictable_size() == 0
