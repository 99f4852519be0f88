"""Token-slot allocator over the KV pool, page by page (page_size 1 is the token allocator).

Page 0 is the dummy page and is never handed out. Requests get whole pages; a request's partially
filled last page keeps being filled by its next tokens (alloc_extend / alloc_decode do that).
"""

from __future__ import annotations

from typing import List

import torch


class TokenToKVPoolAllocator:
    def __init__(self, size: int, page_size: int, device: str) -> None:
        if size % page_size:
            raise ValueError(f"pool size {size} is not a multiple of the page size {page_size}")
        self.size = size
        self.page_size = page_size
        self.device = device
        self.clear()

    @property
    def num_pages(self) -> int:
        return self.size // self.page_size

    def clear(self) -> None:
        self.free_pages = torch.arange(1, self.num_pages + 1, dtype=torch.int64)

    def available_size(self) -> int:
        return len(self.free_pages) * self.page_size

    def _take_pages(self, n: int) -> torch.Tensor:
        pages, self.free_pages = self.free_pages[:n], self.free_pages[n:]
        return pages

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """`need_size` fresh slots, page-aligned (need_size must be a multiple of the page size)."""
        if need_size % self.page_size:
            raise ValueError("alloc() takes whole pages; use alloc_extend for partial pages")
        n = need_size // self.page_size
        if n > len(self.free_pages):
            return None
        pages = self._take_pages(n)
        offsets = torch.arange(self.page_size, dtype=torch.int64)
        return (pages[:, None] * self.page_size + offsets[None, :]).reshape(-1)

    def alloc_extend(self, prefix_lens: List[int], seq_lens: List[int], last_locs: List[int]) -> torch.Tensor | None:
        """Slots for tokens prefix_len..seq_len-1 of each request; last_loc is the slot of token prefix_len-1."""
        ps = self.page_size
        if ps == 1:
            return self.alloc(sum(s - p for p, s in zip(prefix_lens, seq_lens)))
        need_pages = sum(-(-s // ps) - (-(-p // ps)) for p, s in zip(prefix_lens, seq_lens))
        if need_pages > len(self.free_pages):
            return None
        pages = self._take_pages(need_pages).tolist()
        out: List[int] = []
        for p, s, last in zip(prefix_lens, seq_lens, last_locs):
            pos = p
            # Fill the rest of the partially used last page first.
            while pos < s and pos % ps:
                last += 1
                out.append(last)
                pos += 1
            while pos < s:
                page = pages.pop(0)
                take = min(ps, s - pos)
                out.extend(range(page * ps, page * ps + take))
                pos += take
        return torch.tensor(out, dtype=torch.int64)

    def alloc_decode(self, seq_lens: List[int], last_locs: List[int]) -> torch.Tensor | None:
        """One slot per request for token seq_len-1 (seq_len counts the new token)."""
        ps = self.page_size
        if ps == 1:
            return self.alloc(len(seq_lens))
        new_page = [(s - 1) % ps == 0 for s in seq_lens]
        n = sum(new_page)
        if n > len(self.free_pages):
            return None
        pages = self._take_pages(n).tolist()
        out = [pages.pop(0) * ps if fresh else last + 1 for fresh, last in zip(new_page, last_locs)]
        return torch.tensor(out, dtype=torch.int64)

    def free(self, indices: torch.Tensor) -> None:
        if indices.numel() == 0:
            return
        indices = indices.to("cpu", torch.int64)
        pages = torch.unique(indices // self.page_size)
        self.free_pages = torch.cat((self.free_pages, pages))

    def resize(self, new_size: int) -> None:
        """Grow (post-capture sizing) the pool; pages beyond the old size become free."""
        if new_size % self.page_size:
            raise ValueError(f"pool size {new_size} is not a multiple of the page size {self.page_size}")
        if new_size < self.size:
            keep = self.free_pages[self.free_pages <= new_size // self.page_size]
            if len(keep) + (self.num_pages - len(self.free_pages)) > new_size // self.page_size:
                raise ValueError("cannot shrink the pool below the pages in use")
            self.free_pages = keep
        else:
            added = torch.arange(self.num_pages + 1, new_size // self.page_size + 1, dtype=torch.int64)
            self.free_pages = torch.cat((self.free_pages, added))
        self.size = new_size
