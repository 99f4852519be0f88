from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=3, suite="per-commit-cpu")

# RadixCache: match / insert / split / evict / lock references, page size 1 and > 1, and the
# request-level paths (cache_unfinished_req, cache_finished_req) conserving every KV slot.

from types import SimpleNamespace

import pytest
import torch

from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixCache


def make_cache(ps: int = 1, size: int = 256, disable: bool = False):
    alloc = TokenToKVPoolAllocator(size, ps, "cpu")
    pool = ReqToTokenPool(8, 128, "cpu")
    return RadixCache(pool, alloc, ps, disable=disable), alloc, pool


def vals(*xs):
    return torch.tensor(xs, dtype=torch.int64)


def test_insert_and_match_longest_prefix():
    c, _, _ = make_cache()
    assert c.insert([1, 2, 3, 4, 5], vals(11, 12, 13, 14, 15)) == 0
    v, node = c.match_prefix([1, 2, 3, 4, 5, 6])
    assert v.tolist() == [11, 12, 13, 14, 15]
    assert node.key == [1, 2, 3, 4, 5]
    v, _ = c.match_prefix([9, 1, 2])
    assert v.tolist() == []
    assert c.evictable_size() == 5 and c.total_size() == 5
    # Re-inserting a longer key reports the cached prefix and adds only the tail.
    assert c.insert([1, 2, 3, 4, 5, 6, 7], vals(0, 0, 0, 0, 0, 16, 17)) == 5
    assert c.match_prefix([1, 2, 3, 4, 5, 6, 7])[0].tolist() == [11, 12, 13, 14, 15, 16, 17]
    assert c.evictable_size() == 7


def test_partial_match_splits_the_node():
    c, _, _ = make_cache()
    c.insert([1, 2, 3, 4, 5], vals(11, 12, 13, 14, 15))
    v, node = c.match_prefix([1, 2, 3, 9])
    assert v.tolist() == [11, 12, 13]
    assert node.key == [1, 2, 3] and list(node.children.values())[0].key == [4, 5]
    assert c.total_size() == 5  # a split moves tokens, never copies them
    # Inserting a diverging key creates a sibling under the split point.
    assert c.insert([1, 2, 3, 7, 8], vals(0, 0, 0, 17, 18)) == 3
    assert sorted(ch.key[0] for ch in node.children.values()) == [4, 7]
    assert c.match_prefix([1, 2, 3, 7, 8])[0].tolist() == [11, 12, 13, 17, 18]
    assert c.match_prefix([1, 2, 3, 4, 5])[0].tolist() == [11, 12, 13, 14, 15]
    assert c.total_size() == 7 and c.evictable_size() == 7


def test_insert_split_in_the_middle_of_an_edge():
    c, _, _ = make_cache()
    c.insert([5, 6, 7, 8], vals(1, 2, 3, 4))
    assert c.insert([5, 6, 9], vals(0, 0, 30)) == 2
    root_child = c.root.children[(5,)]
    assert root_child.key == [5, 6]
    assert sorted(tuple(ch.key) for ch in root_child.children.values()) == [(7, 8), (9,)]


def test_lock_ref_protects_from_eviction():
    c, alloc, _ = make_cache(size=64)
    slots = alloc.alloc(6)
    c.insert([1, 2, 3, 4, 5, 6], slots)
    _, node = c.match_prefix([1, 2, 3])  # splits: [1,2,3] + [4,5,6]
    assert c.inc_lock_ref(node) == 3
    assert c.evictable_size() == 3 and c.protected_size() == 3
    assert c.inc_lock_ref(node) == 0  # already locked: nothing changes hands
    free_before = alloc.available_size()
    assert c.evict(100) == 3  # only the unlocked tail [4,5,6]
    assert alloc.available_size() == free_before + 3
    assert c.match_prefix([1, 2, 3, 4])[0].tolist() == slots[:3].tolist()
    assert c.dec_lock_ref(node) == 0  # still one lock
    assert c.dec_lock_ref(node) == 3
    assert c.evictable_size() == 3 and c.protected_size() == 0
    assert c.evict(1) == 3
    assert c.total_size() == 0 and alloc.available_size() == 64


def test_locking_a_leaf_locks_its_ancestors():
    c, alloc, _ = make_cache(size=64)
    c.insert([1, 2], alloc.alloc(2))
    c.insert([1, 2, 3, 4], torch.cat((vals(0, 0), alloc.alloc(2))))
    _, leaf = c.match_prefix([1, 2, 3, 4])
    assert c.inc_lock_ref(leaf) == 4
    assert c.evict(10) == 0
    c.dec_lock_ref(leaf)
    assert c.evict(10) == 4


def test_evict_is_lru_and_frees_parents_once_childless():
    c, alloc, _ = make_cache(size=64)
    a = alloc.alloc(4)
    b = alloc.alloc(2)
    c.insert([1, 2, 3, 4], a)
    c.insert([1, 2, 7, 8], torch.cat((a[:2], b)))
    c.match_prefix([1, 2, 3, 4])  # [3,4] is now more recent than [7,8]
    free = alloc.available_size()
    assert c.evict(1) == 2  # the least recently used leaf [7, 8] goes first
    assert alloc.available_size() == free + 2
    assert c.match_prefix([1, 2, 3, 4])[0].tolist() == a.tolist()
    assert c.match_prefix([1, 2, 7, 8])[0].tolist() == a[:2].tolist()
    assert c.evict(3) == 4  # [3,4] then its parent [1,2], now a leaf
    assert c.total_size() == 0 and alloc.available_size() == 64


@pytest.mark.parametrize("ps", [2, 4])
def test_paged_keys_are_page_aligned(ps):
    c, alloc, _ = make_cache(ps=ps, size=64)
    key = list(range(100, 100 + 3 * ps))
    slots = alloc.alloc(3 * ps)
    c.insert(key, slots)
    # A query that diverges inside the second page matches only whole pages.
    q = key[: ps + 1] + [7] * ps
    v, node = c.match_prefix(q)
    assert v.tolist() == slots[:ps].tolist()
    assert len(node.key) == ps
    # A query shorter than a page matches nothing; an unaligned tail is ignored.
    assert c.match_prefix(key[: ps - 1])[0].numel() == 0
    assert c.match_prefix(key + [1])[0].tolist() == slots.tolist()
    # Children are keyed by their first page: two keys sharing a first token but not the first page
    # are siblings.
    other = [key[0]] + [5] * (ps - 1)
    c.insert(other, alloc.alloc(ps))
    assert len(c.root.children) == 2
    assert c.evict(10 * ps) == 4 * ps
    assert alloc.available_size() == 64


def test_disabled_cache_matches_and_stores_nothing():
    c, alloc, _ = make_cache(disable=True)
    assert c.insert([1, 2, 3], vals(1, 2, 3)) == 0
    assert c.match_prefix([1, 2, 3])[0].numel() == 0
    assert c.total_size() == 0 and c.evict(10) == 0


def _req(pool, alloc, tokens, prefix=None, last_node=None):
    """A minimal request that 'prefilled' `tokens`, reusing `prefix` slots, as the scheduler would."""
    prefix = torch.empty(0, dtype=torch.int64) if prefix is None else prefix
    (idx,) = pool.alloc(1)
    new = alloc.alloc(len(tokens) - len(prefix)) if alloc.page_size == 1 else None
    if new is None:
        new = alloc.alloc_extend([len(prefix)], [len(tokens)], [int(prefix[-1]) if len(prefix) else -1])
    slots = torch.cat((prefix, new))
    pool.write(idx, 0, slots)
    return SimpleNamespace(
        origin_input_ids=list(tokens),
        output_ids=[],
        fill_ids=list(tokens),
        kv_committed_len=len(tokens),
        kv_allocated_len=len(tokens),
        req_pool_idx=idx,
        prefix_indices=prefix,
        last_node=last_node,
        cache_protected_len=len(prefix),
    )


@pytest.mark.parametrize("ps", [1, 4])
def test_request_paths_conserve_slots(ps):
    """Two requests with a shared prefix: every slot ends up either free or in the tree, exactly once."""
    size = 64
    c, alloc, pool = make_cache(ps=ps, size=size)
    shared = list(range(1, 9))  # 8 tokens, two pages at ps=4
    r1 = _req(pool, alloc, shared + [50, 51, 52])
    c.cache_unfinished_req(r1)  # prompt becomes shareable at once; r1 locks it
    assert c.protected_size() == len(r1.prefix_indices) // ps * ps
    assert c.match_prefix(shared + [50])[0].numel() >= 8
    # r2 arrives, matches the shared prefix (locked by r1), prefills its own tail.
    prefix, node = c.match_prefix(shared + [60, 61])
    assert len(prefix) == 8
    c.inc_lock_ref(node)
    r2 = _req(pool, alloc, shared + [60, 61], prefix=prefix, last_node=node)
    c.cache_finished_req(r1)
    c.cache_finished_req(r2)
    assert c.protected_size() == 0
    assert alloc.available_size() + c.total_size() == size
    free = alloc.free_pages.tolist()
    assert len(free) == len(set(free))  # no page freed twice
    tree_slots = torch.cat([n.value for n in c._all_nodes() if n is not c.root]).tolist()
    assert len(tree_slots) == len(set(tree_slots))
    assert not ({s // ps for s in tree_slots} & set(free))
    assert pool.available_size() == pool.size
    c.evict(size)
    assert alloc.available_size() == size


@pytest.mark.parametrize("ps", [1, 4])
@pytest.mark.parametrize("disable", [False, True])
def test_slots_allocated_past_the_committed_kv_are_freed_once(ps, disable):
    """A decode step launched before the request was seen to finish allocated one more slot than it
    committed; with 6 committed tokens at page size 4 that slot shares the last, unaligned page: the page
    goes back to the pool exactly once and every slot is accounted for."""
    size = 32
    c, alloc, pool = make_cache(ps=ps, size=size, disable=disable)
    r = _req(pool, alloc, [1, 2, 3, 4, 5, 6, 7])  # 7 slots allocated ...
    r.kv_committed_len = 6  # ... 6 of them written
    c.cache_finished_req(r)
    assert r.kv_allocated_len == 0 and r.req_pool_idx is None
    free = alloc.free_pages.tolist() if ps > 1 else None
    if free is not None:
        assert len(free) == len(set(free))  # no page freed twice
    assert alloc.available_size() + c.total_size() == size
    assert c.total_size() == (0 if disable else 6 // ps * ps)
    c.evict(size)
    assert alloc.available_size() == size


def test_duplicate_prefix_from_two_requests_is_freed_once():
    """Two requests computed the same prompt independently (no match at admission): the second one's
    copy of the already-cached tokens goes back to the pool."""
    c, alloc, pool = make_cache(size=32)
    toks = [3, 4, 5, 6, 7]
    r1 = _req(pool, alloc, toks)
    r2 = _req(pool, alloc, toks)
    c.cache_finished_req(r1)
    c.cache_finished_req(r2)
    assert c.total_size() == 5
    assert alloc.available_size() == 32 - 5


# ------------------------------------------------------- evict_slots (the lendable KV tail, elastic KT slot)


def make_tail_cache(ps: int, pages: int, tail_pages: int):
    alloc = TokenToKVPoolAllocator(pages * ps, ps, "cpu", lendable_tail_pages=tail_pages)
    pool = ReqToTokenPool(8, 128, "cpu")
    return RadixCache(pool, alloc, ps), alloc


def assert_accounting(c):
    """evictable/protected sizes equal the tokens of unlocked/locked nodes, exactly."""
    nodes = [n for n in c._all_nodes() if n is not c.root]
    assert c.evictable_size() == sum(len(n.key) for n in nodes if n.lock_ref == 0)
    assert c.protected_size() == sum(len(n.key) for n in nodes if n.lock_ref > 0)
    for n in nodes:
        assert len(n.key) == len(n.value)


def tree_slots(c):
    nodes = [n.value for n in c._all_nodes() if n is not c.root]
    return set(torch.cat(nodes).tolist()) if nodes else set()


def shape(c):
    return sorted((tuple(n.key), tuple(n.value.tolist()), n.lock_ref) for n in c._all_nodes() if n is not c.root)


@pytest.mark.parametrize("ps", [1, 4])
def test_evict_slots_frees_cached_tail_pages_only(ps):
    c, alloc = make_tail_cache(ps, pages=8, tail_pages=2)
    lo, hi = alloc.tail_slot_range()
    main = alloc.alloc(6 * ps)  # non-tail pages 1..6
    tail = alloc.alloc(2 * ps)  # tail pages 7, 8
    a_key, t_key = list(range(100, 100 + 6 * ps)), list(range(500, 500 + 2 * ps))
    c.insert(a_key, main)
    c.insert(t_key, tail)
    assert not alloc.tail_free()
    assert c.evict_slots(lo, hi) is True
    assert not (tree_slots(c) & set(range(lo, hi)))
    assert alloc.tail_free() and alloc.available_size() == 2 * ps
    assert c.match_prefix(a_key)[0].tolist() == main.tolist()  # the rest of the cache stays
    assert c.match_prefix(t_key)[0].numel() == 0
    assert c.evictable_size() == 6 * ps
    assert_accounting(c)
    alloc.lend_tail()  # what the scheduler does next
    assert alloc.available_size() == 0
    assert c.evict_slots(lo, hi) is True  # nothing left there: a no-op
    assert c.total_size() == 6 * ps


def test_evict_slots_splits_a_node_that_crosses_the_boundary():
    ps = 4
    c, alloc = make_tail_cache(ps, pages=12, tail_pages=2)  # tail: pages 11, 12
    lo, hi = alloc.tail_slot_range()
    alloc.alloc(8 * ps)  # pages 1..8, held elsewhere
    slots = alloc.alloc(4 * ps)  # pages 9, 10 (non-tail) then 11, 12 (tail)
    key = list(range(100, 100 + 4 * ps))
    c.insert(key, slots)
    assert len(c.root.children) == 1 and c.total_size() == 4 * ps
    assert c.evict_slots(lo, hi)
    # The node was split at the boundary page: its first two pages stay cached.
    (node,) = c.root.children.values()
    assert node.key == key[: 2 * ps] and node.value.tolist() == slots[: 2 * ps].tolist()
    assert not node.children
    assert c.match_prefix(key)[0].tolist() == slots[: 2 * ps].tolist()
    assert c.evictable_size() == 2 * ps and c.total_size() == 2 * ps
    assert alloc.tail_free()
    assert_accounting(c)


def test_evict_slots_takes_the_subtree_and_keeps_siblings():
    ps = 4
    c, alloc = make_tail_cache(ps, pages=12, tail_pages=2)
    lo, hi = alloc.tail_slot_range()
    p1, p23 = alloc.alloc(ps), alloc.alloc(2 * ps)  # pages 1 and 2, 3
    alloc.alloc(5 * ps)  # pages 4..8 elsewhere
    x = alloc.alloc(4 * ps)  # pages 9, 10, 11, 12: the last two are the tail
    key = list(range(100, 100 + 4 * ps))
    c.insert(key, x)
    c.insert(key + [7] * ps, torch.cat((x, p1)))  # a child below the tail pages, holding page 1
    c.insert(key[: 2 * ps] + [9] * (2 * ps), torch.cat((x[: 2 * ps], p23)))  # a sibling branch
    assert c.total_size() == 7 * ps
    free_before = alloc.available_size()
    assert c.evict_slots(lo, hi)
    # Gone: the tail part of `key` and the child that extends it (its page 1 is freed too).
    assert c.match_prefix(key + [7] * ps)[0].tolist() == x[: 2 * ps].tolist()
    assert c.match_prefix(key[: 2 * ps] + [9] * (2 * ps))[0].tolist() == torch.cat((x[: 2 * ps], p23)).tolist()
    assert c.total_size() == 4 * ps and c.evictable_size() == 4 * ps
    assert alloc.available_size() == free_before + 3 * ps
    assert 1 in alloc.free_pages.tolist() and alloc.tail_free()
    assert_accounting(c)


@pytest.mark.parametrize("lock_child", [False, True])
def test_evict_slots_refuses_when_a_locked_node_holds_a_tail_slot(lock_child):
    ps = 4
    c, alloc = make_tail_cache(ps, pages=12, tail_pages=2)
    lo, hi = alloc.tail_slot_range()
    p1 = alloc.alloc(ps)
    others = alloc.alloc(7 * ps)  # pages 2..8
    x = alloc.alloc(4 * ps)  # pages 9..12, one node crossing the boundary
    key = list(range(100, 100 + 4 * ps))
    c.insert(key, x)
    c.insert(key + [7] * ps, torch.cat((x, p1)))
    c.insert([1] * ps, others[:ps])  # an unrelated, unlocked branch: must survive the refusal too
    # A running request holds the crossing node, or only the child below it (which locks the node too).
    _, node = c.match_prefix(key + [7] * ps if lock_child else key)
    c.inc_lock_ref(node)
    before, free_before, ev, pr = shape(c), alloc.available_size(), c.evictable_size(), c.protected_size()
    assert c.evict_slots(lo, hi) is False
    assert shape(c) == before  # nothing evicted, nothing split
    assert alloc.available_size() == free_before and not alloc.tail_free()
    assert (c.evictable_size(), c.protected_size()) == (ev, pr)
    assert_accounting(c)
    # Once the request is done, the same call succeeds.
    c.dec_lock_ref(node)
    assert c.evict_slots(lo, hi) is True
    assert alloc.tail_free() and c.protected_size() == 0
    assert_accounting(c)


def test_evict_slots_evicts_an_unlocked_tail_child_below_a_locked_prefix():
    ps = 1
    c, alloc = make_tail_cache(ps, pages=16, tail_pages=4)  # tail slots 13..16
    lo, hi = alloc.tail_slot_range()
    main = alloc.alloc(12)
    tail = alloc.alloc(4)
    c.insert([1, 2, 3], main[:3])
    c.insert([1, 2, 3, 4, 5], torch.cat((main[:3], tail[:2])))  # child [4, 5] on tail slots
    c.insert([1, 2, 3, 6], torch.cat((main[:3], main[3:4])))  # child [6] on a main slot
    _, prefix = c.match_prefix([1, 2, 3])
    c.inc_lock_ref(prefix)  # a request reads only the shared prefix
    assert c.protected_size() == 3 and c.evictable_size() == 3
    assert c.evict_slots(lo, hi) is True
    assert c.protected_size() == 3 and c.evictable_size() == 1
    assert c.match_prefix([1, 2, 3, 6])[0].tolist() == main[:4].tolist()
    assert c.match_prefix([1, 2, 3, 4, 5])[0].tolist() == main[:3].tolist()
    assert_accounting(c)
    assert alloc.tail_pages_in_use() == 2  # tail[2:] is held outside the tree: not the cache's to free
    c.dec_lock_ref(prefix)


def test_evict_slots_with_an_empty_range_or_disabled_cache_changes_nothing():
    c, alloc = make_tail_cache(1, pages=8, tail_pages=0)
    c.insert([1, 2], alloc.alloc(2))
    before = shape(c)
    assert c.evict_slots(*alloc.tail_slot_range()) is True  # no tail: empty range
    assert shape(c) == before and c.evictable_size() == 2
    d, _, _ = make_cache(disable=True)
    assert d.evict_slots(0, 100) is True
