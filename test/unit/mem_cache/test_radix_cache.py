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
    pool.req_to_token[idx, : len(tokens)] = slots.to(torch.int32)
    return SimpleNamespace(
        origin_input_ids=list(tokens),
        output_ids=[],
        fill_ids=list(tokens),
        kv_committed_len=len(tokens),
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
