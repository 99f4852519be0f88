from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=3, suite="per-commit-cpu")

# TokenToKVPoolAllocator: page-granular slots over the KV pool; page 0 (slot 0..page_size-1) is the
# dummy page and must never be handed out.

import pytest
import torch

from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator


def _pages(slots, ps):
    return sorted({int(s) // ps for s in slots})


def test_token_allocator_never_hands_out_slot_zero_and_runs_dry():
    a = TokenToKVPoolAllocator(16, 1, "cpu")
    assert a.available_size() == 16
    got = a.alloc(16)
    assert sorted(got.tolist()) == list(range(1, 17))  # slot 0 is the dummy slot
    assert a.available_size() == 0
    assert a.alloc(1) is None
    a.free(got[:5])
    assert a.available_size() == 5
    again = a.alloc(5)
    assert sorted(again.tolist()) == sorted(got[:5].tolist())


@pytest.mark.parametrize("ps", [2, 4, 16])
def test_paged_pool_keeps_first_page_as_dummy(ps):
    a = TokenToKVPoolAllocator(8 * ps, ps, "cpu")
    slots = a.alloc(8 * ps)
    assert slots.min().item() == ps  # the whole first page is the dummy page
    assert slots.max().item() == 9 * ps - 1
    assert len(set(slots.tolist())) == 8 * ps
    assert a.alloc(ps) is None


def test_alloc_takes_whole_pages_only():
    a = TokenToKVPoolAllocator(32, 4, "cpu")
    with pytest.raises(ValueError):
        a.alloc(3)
    with pytest.raises(ValueError):
        TokenToKVPoolAllocator(30, 4, "cpu")


def test_alloc_extend_fills_partial_page_then_new_pages():
    ps = 4
    a = TokenToKVPoolAllocator(64, ps, "cpu")
    # Request A: a fresh prompt of 6 tokens -> pages p, q; slots p*4..p*4+3, q*4..q*4+1.
    first = a.alloc_extend([0], [6], [-1])
    assert first.shape == (6,)
    assert first[:4].tolist() == list(range(first[0].item(), first[0].item() + 4))
    assert first[0].item() % ps == 0 and first[4].item() % ps == 0
    assert a.available_size() == 64 - 2 * ps
    # A continues (chunked prefill) from position 6 to 11: 2 slots fill its last page, then one new page.
    more = a.alloc_extend([6], [11], [first[-1].item()])
    assert more[:2].tolist() == [first[-1].item() + 1, first[-1].item() + 2]
    assert more[2].item() % ps == 0 and more[2:].tolist() == list(range(more[2].item(), more[2].item() + 3))
    assert a.available_size() == 64 - 3 * ps
    # Two requests at once, one with a page-aligned cached prefix (8 tokens) -> no partial page to fill.
    both = a.alloc_extend([0, 8], [3, 13], [-1, 1234])
    assert len(both) == 3 + 5
    assert both[3].item() % ps == 0  # the second request starts on a fresh page
    assert a.available_size() == 64 - 6 * ps  # 1 page + 2 pages (positions 8..11, 12)
    used = first.tolist() + more.tolist() + both.tolist()
    assert len(set(used)) == len(used)
    assert min(used) >= ps


def test_alloc_extend_all_or_nothing():
    a = TokenToKVPoolAllocator(16, 4, "cpu")
    assert a.alloc_extend([0, 0], [9, 8], [-1, -1]) is None  # needs 3 + 2 pages, has 4
    assert a.available_size() == 16
    assert a.alloc_extend([0], [16], [-1]) is not None
    assert a.available_size() == 0


def test_alloc_decode_new_page_only_on_page_boundary():
    ps = 4
    a = TokenToKVPoolAllocator(32, ps, "cpu")
    pre = a.alloc_extend([0, 0], [4, 6], [-1, -1])
    last_a, last_b = pre[3].item(), pre[-1].item()
    before = a.available_size()
    # Request a's next token is position 4 (seq_len 5): a new page. b's is position 6 (seq_len 7): same page.
    out = a.alloc_decode([5, 7], [last_a, last_b])
    assert out[0].item() % ps == 0 and out[0].item() // ps not in _pages(pre, ps)
    assert out[1].item() == last_b + 1
    assert a.available_size() == before - ps


def test_alloc_decode_page_size_one_and_exhaustion():
    a = TokenToKVPoolAllocator(2, 1, "cpu")
    assert len(a.alloc_decode([1, 1], [-1, -1])) == 2
    assert a.alloc_decode([2], [1]) is None


def test_free_returns_whole_pages():
    ps = 4
    a = TokenToKVPoolAllocator(32, ps, "cpu")
    slots = a.alloc_extend([0], [10], [-1])  # 3 pages
    a.free(slots)
    assert a.available_size() == 32
    assert len(set(a.free_pages.tolist())) == len(a.free_pages)  # no page listed twice
    a.free(torch.empty(0, dtype=torch.int64))
    assert a.available_size() == 32


def test_resize_grow_and_shrink():
    ps = 4
    a = TokenToKVPoolAllocator(16, ps, "cpu")
    a.resize(32)
    assert a.available_size() == 32 and a.size == 32
    got = a.alloc(32)
    assert got.max().item() == 9 * ps - 1 and got.min().item() == ps
    a.free(got)
    held = a.alloc(8)  # the two lowest free pages
    a.resize(16)
    assert a.size == 16 and a.available_size() == 8
    assert all(p <= 4 for p in a.free_pages.tolist())
    with pytest.raises(ValueError):
        a.resize(4)  # two pages are in use
    with pytest.raises(ValueError):
        a.resize(18)  # not page aligned
    a.free(held)
    assert a.available_size() == 16


def test_clear_restores_everything():
    a = TokenToKVPoolAllocator(12, 1, "cpu")
    a.alloc(7)
    a.clear()
    assert a.available_size() == 12
    assert 0 not in a.alloc(12).tolist()


# --------------------------------------------------------------- lendable tail (elastic KT prefill slot)
# The last K pages form the lendable tail: handed out only after every other page, lendable only when all
# are free, excluded from available_size() while lent.


def _tail_pages(a):
    return set(range(a.tail_first_page, a.num_pages + 1))


@pytest.mark.parametrize("ps", [1, 4])
def test_alloc_hands_out_tail_pages_last(ps):
    a = TokenToKVPoolAllocator(8 * ps, ps, "cpu", lendable_tail_pages=3)
    assert a.tail_pages == 3 and a.tail_tokens == 3 * ps and a.tail_first_page == 6
    assert a.available_size() == 8 * ps  # a free tail counts as available
    got = [a.alloc(ps) for _ in range(5)]  # one page at a time: pages 1..5, never the tail
    assert sorted(p for g in got for p in _pages(g, ps)) == [1, 2, 3, 4, 5]
    assert a.tail_free() and a.tail_pages_in_use() == 0
    nxt = a.alloc(ps)  # only now the tail
    assert _pages(nxt, ps)[0] in _tail_pages(a)
    assert not a.tail_free() and a.tail_pages_in_use() == 1


@pytest.mark.parametrize("ps", [1, 4])
def test_one_alloc_spanning_the_boundary_takes_every_other_page_first(ps):
    a = TokenToKVPoolAllocator(8 * ps, ps, "cpu", lendable_tail_pages=3)
    got = a.alloc(6 * ps)
    assert _pages(got, ps) == [1, 2, 3, 4, 5, 6]  # 5 non-tail pages + the first tail page
    assert a.tail_pages_in_use() == 1


@pytest.mark.parametrize("ps", [1, 4])
def test_alloc_extend_hands_out_tail_last(ps):
    a = TokenToKVPoolAllocator(8 * ps, ps, "cpu", lendable_tail_pages=2)
    first = a.alloc_extend([0, 0], [3 * ps, 3 * ps], [-1, -1])  # 6 pages: all non-tail ones
    assert _pages(first, ps) == [1, 2, 3, 4, 5, 6]
    assert a.tail_free()
    more = a.alloc_extend([0], [ps], [-1])
    assert _pages(more, ps) == [7]
    assert a.tail_pages_in_use() == 1


def test_alloc_decode_hands_out_tail_last():
    ps = 4
    a = TokenToKVPoolAllocator(6 * ps, ps, "cpu", lendable_tail_pages=2)
    pre = a.alloc_extend([0, 0], [2 * ps, 2 * ps], [-1, -1])  # pages 1..4
    assert a.tail_free()
    last_a, last_b = pre[2 * ps - 1].item(), pre[-1].item()
    out = a.alloc_decode([2 * ps + 1, 2 * ps + 1], [last_a, last_b])  # both need a new page: the tail
    assert _pages(out, ps) == [5, 6]
    assert a.tail_pages_in_use() == 2 and a.available_size() == 0
    # Page size 1: decode slots also come from non-tail pages first.
    b = TokenToKVPoolAllocator(4, 1, "cpu", lendable_tail_pages=2)
    assert sorted(b.alloc_decode([1, 1], [-1, -1]).tolist()) == [1, 2]
    assert b.tail_free()
    assert sorted(b.alloc_decode([1], [-1]).tolist()) == [3]


@pytest.mark.parametrize("ps", [1, 4])
def test_free_puts_each_page_back_on_its_own_list(ps):
    a = TokenToKVPoolAllocator(6 * ps, ps, "cpu", lendable_tail_pages=2)
    got = a.alloc(6 * ps)
    assert a.available_size() == 0
    tail_slot = (a.tail_first_page + 1) * ps  # a slot of page 6 (tail)
    main_slot = 2 * ps  # a slot of page 2
    a.free(torch.tensor([tail_slot, main_slot]))
    assert a.tail_pages_in_use() == 1
    assert a.free_pages.tolist() == [2, 6]  # hand-out order: non-tail first
    assert _pages(a.alloc(ps), ps) == [2]  # the freed non-tail page goes out before the freed tail page
    assert _pages(a.alloc(ps), ps) == [6]
    a.free(got)
    assert a.tail_free() and a.available_size() == 6 * ps
    assert sorted(a.free_pages.tolist()) == list(range(1, 7))


def test_lend_refused_while_a_tail_page_is_held():
    from sglang.srt.mem_cache.allocator import TailInUseError

    ps = 4
    a = TokenToKVPoolAllocator(8 * ps, ps, "cpu", lendable_tail_pages=2)
    got = a.alloc(7 * ps)  # page 7 is a tail page
    with pytest.raises(TailInUseError, match="1 of its 2 pages"):
        a.lend_tail()
    assert not a.tail_lent and a.available_size() == ps  # nothing changed
    a.free(got[-ps:])
    a.lend_tail()
    assert a.tail_lent


@pytest.mark.parametrize("ps", [1, 4])
def test_lend_and_return_cycles(ps):
    a = TokenToKVPoolAllocator(8 * ps, ps, "cpu", lendable_tail_pages=3)
    for _ in range(3):
        held = a.alloc(2 * ps)  # non-tail pages in use do not stop a lend
        a.lend_tail()
        assert a.tail_lent and a.lent_tokens == 3 * ps
        assert a.available_size() == (8 - 2 - 3) * ps
        assert a.size == 8 * ps  # the pool's size is unchanged: the tail is lent, not removed
        assert a.tail_free() and a.tail_pages_in_use() == 0
        assert not (set(a.free_pages.tolist()) & _tail_pages(a))
        rest = a.alloc(3 * ps)  # the remaining non-tail pages...
        assert rest is not None and not (set(_pages(rest, ps)) & _tail_pages(a))
        assert a.alloc(ps) is None  # ...and then nothing: the tail is never handed out while lent
        assert a.alloc_extend([0], [ps], [-1]) is None
        assert a.alloc_decode([1], [-1]) is None
        a.free(rest)
        a.return_tail()
        assert not a.tail_lent and a.lent_tokens == 0
        assert a.available_size() == (8 - 2) * ps
        assert set(a.free_pages.tolist()) >= _tail_pages(a)
        a.free(held)
        assert a.available_size() == 8 * ps
        assert len(set(a.free_pages.tolist())) == len(a.free_pages) == 8


def test_lend_return_errors():
    a = TokenToKVPoolAllocator(8, 1, "cpu")
    assert a.tail_pages == 0 and a.tail_free()
    with pytest.raises(RuntimeError, match="no lendable tail"):
        a.lend_tail()
    with pytest.raises(RuntimeError, match="not lent"):
        a.return_tail()
    b = TokenToKVPoolAllocator(8, 1, "cpu", lendable_tail_pages=2)
    b.lend_tail()
    with pytest.raises(RuntimeError, match="already lent"):
        b.lend_tail()
    with pytest.raises(RuntimeError, match="lent KV tail"):
        b.free(torch.tensor([8]))  # a lent page cannot be held, so freeing it is a double free
    with pytest.raises(RuntimeError, match="lent"):
        b.resize(16, lendable_tail_pages=2)
    with pytest.raises(ValueError):
        TokenToKVPoolAllocator(8, 1, "cpu", lendable_tail_pages=9)


def test_clear_keeps_a_lent_tail_lent():
    ps = 4
    a = TokenToKVPoolAllocator(8 * ps, ps, "cpu", lendable_tail_pages=2)
    a.lend_tail()
    a.alloc(3 * ps)
    a.clear()
    assert a.tail_lent
    assert a.available_size() == 6 * ps
    assert a.alloc(7 * ps) is None
    a.return_tail()
    assert a.available_size() == 8 * ps
    a.clear()  # not lent: everything free, tail still last
    assert _pages(a.alloc(6 * ps), ps) == [1, 2, 3, 4, 5, 6]


def test_tail_slot_range():
    ps = 4
    a = TokenToKVPoolAllocator(8 * ps, ps, "cpu", lendable_tail_pages=3)
    lo, hi = a.tail_slot_range()
    assert (lo, hi) == (6 * ps, 9 * ps)  # pages 6, 7, 8; page 0 is the dummy page
    assert hi - lo == a.tail_tokens
    got = a.alloc(8 * ps)
    tail_slots = sorted(s for s in got.tolist() if lo <= s < hi)
    assert tail_slots == list(range(lo, hi))
    b = TokenToKVPoolAllocator(8, 1, "cpu")
    assert b.tail_slot_range() == (9, 9)  # no tail: an empty range at the pool's end


def test_resize_sets_the_tail():
    ps = 4
    a = TokenToKVPoolAllocator(4 * ps, ps, "cpu")
    held = a.alloc(ps)  # page 1
    a.resize(16 * ps, lendable_tail_pages=4)  # post-capture sizing: the last 4 pages are the tail
    assert a.size == 16 * ps and a.tail_pages == 4 and a.tail_slot_range() == (13 * ps, 17 * ps)
    assert a.available_size() == 15 * ps and a.tail_free()
    got = a.alloc(11 * ps)
    assert _pages(got, ps) == list(range(2, 13))  # every non-tail page before the tail
    a.free(got)
    a.free(held)
    a.lend_tail()
    a.return_tail()
    # Shrinking so that a page in use falls in the new tail: the tail is not free until it is released.
    b = TokenToKVPoolAllocator(16 * ps, ps, "cpu")
    every = b.alloc(16 * ps)  # pages 1..16 in order
    with pytest.raises(ValueError):
        b.resize(8 * ps, lendable_tail_pages=2)  # pages 9..16 are in use beyond the new end
    page8 = every[7 * ps : 8 * ps]
    b.free(torch.cat((every[: 7 * ps], every[8 * ps :])))  # only page 8 stays in use
    b.resize(8 * ps, lendable_tail_pages=2)  # tail: pages 7, 8
    assert not b.tail_free() and b.tail_pages_in_use() == 1
    assert b.available_size() == 7 * ps
    with pytest.raises(RuntimeError):
        b.lend_tail()
    b.free(page8)
    assert b.tail_free()
    b.lend_tail()
    assert b.available_size() == 6 * ps
