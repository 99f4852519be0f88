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
