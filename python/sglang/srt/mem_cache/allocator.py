"""Token-slot allocator over the KV pool, page by page (page_size 1 is the token allocator).

Page 0 is the dummy page and is never handed out. Requests get whole pages; a request's partially
filled last page keeps being filled by its next tokens (alloc_extend / alloc_decode do that).

Lendable tail (the elastic KT prefill slot, DESIGN.md section 8): the last `lendable_tail_pages`
pages of the pool can be lent to another user of their physical memory. They sit on their own free
list and are handed out only after every other page is in use, so that under light load they stay
free and can be lent without moving anyone's KV. `lend_tail()` takes them out of circulation (only
when all are free); `return_tail()` puts them back.
"""

from __future__ import annotations

from typing import Iterator, List, Optional, Tuple

import torch


def extend_pages(prefix_lens: List[int], seq_lens: List[int], page_size: int) -> int:
    """New pages alloc_extend takes: a request's partly filled last page is continued, not replaced."""
    return sum(-(-s // page_size) - (-(-p // page_size)) for p, s in zip(prefix_lens, seq_lens))


def decode_pages(seq_lens: List[int], page_size: int) -> int:
    """New pages alloc_decode takes: one per request whose new token (seq_len - 1) starts a page."""
    return sum((s - 1) % page_size == 0 for s in seq_lens)


class TailInUseError(RuntimeError):
    """lend_tail() was called while some tail page is held (by a request or the radix cache)."""


class TokenToKVPoolAllocator:
    """Page allocator. `size` is always the whole pool (lent tail included): the scheduler reads it
    as max_total_num_tokens. `available_size()` counts only pages that alloc can hand out now, so while
    the tail is lent, `size - available_size()` includes the `lent_tokens` that no request holds."""

    def __init__(self, size: int, page_size: int, device: str, lendable_tail_pages: int = 0) -> None:
        if size % page_size:
            raise ValueError(f"pool size {size} is not a multiple of the page size {page_size}")
        self.size = size
        self.page_size = page_size
        self.device = device
        self._check_tail_pages(lendable_tail_pages, size // page_size)
        self.tail_pages = lendable_tail_pages
        self._tail_lent = False
        self.clear()

    # ------------------------------------------------------------- geometry
    @property
    def num_pages(self) -> int:
        return self.size // self.page_size

    @property
    def tail_first_page(self) -> int:
        """First page id of the tail (num_pages + 1 when there is no tail)."""
        return self.num_pages - self.tail_pages + 1

    @property
    def tail_tokens(self) -> int:
        return self.tail_pages * self.page_size

    @property
    def tail_lent(self) -> bool:
        return self._tail_lent

    @property
    def lent_tokens(self) -> int:
        """Tokens of the pool out on loan now (tail_tokens while lent, else 0)."""
        return self.tail_tokens if self._tail_lent else 0

    def tail_slot_range(self) -> Tuple[int, int]:
        """[first_slot, end_slot) of the tail's token slots (slot = page * page_size + offset); an empty
        range at the pool's end when there is no tail."""
        end = (self.num_pages + 1) * self.page_size
        return self.tail_first_page * self.page_size, end

    @staticmethod
    def _check_tail_pages(tail_pages: int, num_pages: int) -> None:
        if not 0 <= tail_pages <= num_pages:
            raise ValueError(f"lendable tail of {tail_pages} pages does not fit a pool of {num_pages} pages")

    # ------------------------------------------------------------ free lists
    @property
    def free_pages(self) -> torch.Tensor:
        """Pages alloc can hand out, in hand-out order (non-tail first, then the tail unless lent)."""
        if self._tail_lent or not len(self._free_tail):
            return self._free_main
        return torch.cat((self._free_main, self._free_tail))

    def _num_free_pages(self) -> int:
        return len(self._free_main) + (0 if self._tail_lent else len(self._free_tail))

    def clear(self) -> None:
        """Every page free again (flush_cache). A lent tail stays lent: its memory is elsewhere."""
        first = self.tail_first_page
        self._free_main = torch.arange(1, first, dtype=torch.int64)
        self._free_tail = torch.arange(first, self.num_pages + 1, dtype=torch.int64)

    def available_size(self) -> int:
        """Tokens alloc can hand out now; a lent tail is not counted."""
        return self._num_free_pages() * self.page_size

    def has_free_pages(self, n: int) -> bool:
        return n <= self._num_free_pages()

    def _take_pages(self, n: int) -> torch.Tensor:
        """n pages (caller checked n <= _num_free_pages()): non-tail pages first, tail pages last."""
        from_main = min(n, len(self._free_main))
        pages, self._free_main = self._free_main[:from_main], self._free_main[from_main:]
        rest = n - from_main
        if rest:
            pages = torch.cat((pages, self._free_tail[:rest]))
            self._free_tail = self._free_tail[rest:]
        return pages

    # ---------------------------------------------------------------- alloc
    def alloc(self, need_size: int) -> torch.Tensor | None:
        """`need_size` fresh slots, page-aligned (need_size must be a multiple of the page size)."""
        if need_size % self.page_size:
            raise ValueError("alloc() takes whole pages; use alloc_extend for partial pages")
        n = need_size // self.page_size
        if n > self._num_free_pages():
            return None
        pages = self._take_pages(n)
        offsets = torch.arange(self.page_size, dtype=torch.int64)
        return (pages[:, None] * self.page_size + offsets[None, :]).reshape(-1)

    def alloc_extend(
        self, prefix_lens: List[int], seq_lens: List[int], last_locs: Optional[List[int]]
    ) -> torch.Tensor | None:
        """Slots for tokens prefix_len..seq_len-1 of each request; last_loc is the slot of token prefix_len-1
        (None is allowed with one-token pages: no page is continued)."""
        ps = self.page_size
        if ps == 1:
            return self.alloc(sum(s - p for p, s in zip(prefix_lens, seq_lens)))
        if last_locs is None:
            raise ValueError(f"alloc_extend needs last_locs with page_size {ps}")
        need_pages = extend_pages(prefix_lens, seq_lens, ps)
        if need_pages > self._num_free_pages():
            return None
        pages: Iterator[int] = iter(self._take_pages(need_pages).tolist())
        out: List[int] = []
        for p, s, last in zip(prefix_lens, seq_lens, last_locs):
            pos = p
            # Fill the rest of the partially used last page first.
            while pos < s and pos % ps:
                last += 1
                out.append(last)
                pos += 1
            while pos < s:
                page = next(pages)
                take = min(ps, s - pos)
                out.extend(range(page * ps, page * ps + take))
                pos += take
        return torch.tensor(out, dtype=torch.int64)

    def alloc_decode(self, seq_lens: List[int], last_locs: Optional[List[int]]) -> torch.Tensor | None:
        """One slot per request for token seq_len-1 (seq_len counts the new token); last_locs as in
        alloc_extend (None with one-token pages)."""
        ps = self.page_size
        if ps == 1:
            return self.alloc(len(seq_lens))
        if last_locs is None:
            raise ValueError(f"alloc_decode needs last_locs with page_size {ps}")
        new_page = [(s - 1) % ps == 0 for s in seq_lens]
        n = decode_pages(seq_lens, ps)
        if n > self._num_free_pages():
            return None
        pages = iter(self._take_pages(n).tolist())
        out = [next(pages) * ps if fresh else last + 1 for fresh, last in zip(new_page, last_locs)]
        return torch.tensor(out, dtype=torch.int64)

    def free(self, indices: torch.Tensor) -> None:
        """Give back the pages holding these slots, each to the free list it belongs to."""
        if indices.numel() == 0:
            return
        indices = indices.to("cpu", torch.int64)
        pages = torch.unique(indices // self.page_size)
        in_tail = (pages >= self.tail_first_page) & (pages <= self.num_pages)
        tail = pages[in_tail]
        if len(tail):
            if self._tail_lent:
                # No request can hold a lent page (lend_tail needs them all free): a double free.
                raise RuntimeError(f"freeing page {int(tail[0])} of the lent KV tail")
            self._free_tail = torch.cat((self._free_tail, tail))
            pages = pages[~in_tail]
        self._free_main = torch.cat((self._free_main, pages))

    # --------------------------------------------------------- lendable tail
    def tail_pages_in_use(self) -> int:
        """Tail pages held by requests or the radix cache (0 while lent: nobody may hold them)."""
        return 0 if self._tail_lent else self.tail_pages - len(self._free_tail)

    def tail_free(self) -> bool:
        """True when no tail page is held (so lend_tail() would succeed unless already lent)."""
        return self.tail_pages_in_use() == 0

    def lend_tail(self) -> None:
        """Take the whole tail out of circulation; every tail page must be free."""
        if self._tail_lent:
            raise RuntimeError("the KV tail is already lent")
        if not self.tail_pages:
            raise RuntimeError("this pool has no lendable tail")
        in_use = self.tail_pages_in_use()
        if in_use:
            lo, hi = self.tail_slot_range()
            raise TailInUseError(
                f"cannot lend the KV tail: {in_use} of its {self.tail_pages} pages (slots {lo}..{hi - 1}) are in use; "
                "evict cached ones first (RadixCache.evict_slots)"
            )
        self._tail_lent = True

    def return_tail(self) -> None:
        """The lent tail is back in the pool: all its pages are free again."""
        if not self._tail_lent:
            raise RuntimeError("the KV tail is not lent")
        self._tail_lent = False
        self._free_tail = torch.arange(self.tail_first_page, self.num_pages + 1, dtype=torch.int64)

    # --------------------------------------------------------------- resize
    def resize(self, new_size: int, lendable_tail_pages: int = 0) -> None:
        """Grow (post-capture sizing) or shrink the pool; pages beyond the old size become free. The
        last `lendable_tail_pages` pages of the new pool form the lendable tail."""
        if new_size % self.page_size:
            raise ValueError(f"pool size {new_size} is not a multiple of the page size {self.page_size}")
        if self._tail_lent:
            raise RuntimeError("cannot resize the pool while its tail is lent")
        new_pages = new_size // self.page_size
        self._check_tail_pages(lendable_tail_pages, new_pages)
        free = torch.cat((self._free_main, self._free_tail))
        if new_size < self.size:
            keep = free[free <= new_pages]
            if len(keep) + (self.num_pages - len(free)) > new_pages:
                raise ValueError("cannot shrink the pool below the pages in use")
            free = keep
        else:
            added = torch.arange(self.num_pages + 1, new_pages + 1, dtype=torch.int64)
            free = torch.cat((free, added))
        self.size = new_size
        self.tail_pages = lendable_tail_pages
        # Re-split by the new boundary; pages in use that fall in the tail keep it from being free.
        in_tail = free >= self.tail_first_page
        self._free_main, self._free_tail = free[~in_tail], free[in_tail]
