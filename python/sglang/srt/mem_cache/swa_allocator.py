"""Slot allocation for the hybrid SWA pool: every token a slot in the full pool, and a window slot while in a window.

A model with sliding-window layers (Gemma 2/3, Mistral, Qwen2 with use_sliding_window) reads, in those layers, only
the last W keys of each query. The hybrid pool (swa_memory_pool.py) keeps those layers' K/V in a second, smaller
pool; this allocator hands out slots of both. A request's row in the request table and the radix tree hold the
full pool's slots, as without windows; `full_to_swa[full_slot]` names the window pool's slot of the same token
(0, the dummy slot, once the token's window slot is freed). Both pools are paged alike: a token's window slot sits
at the same offset of its page as its full slot, so whole pages can be freed from either pool.

Window slots are freed (`free_swa`) when no query can see the token any more (the scheduler's running requests,
radix_cache.SWARadixCache for cached ones); `free` gives back both slots of a token.
"""

from __future__ import annotations

from typing import List, Optional

import torch

from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator, decode_pages, extend_pages


class SWATokenToKVPoolAllocator:
    """The full pool's allocator (its `size` is max_total_num_tokens), the window pool's, and the map between them.

    Allocation calls take and return full-pool slots, as TokenToKVPoolAllocator's do, and assign the same tokens
    window slots. `available_size()` is the full pool's; the window pool's room is `swa_available_size()`."""

    def __init__(self, size: int, swa_size: int, page_size: int, device: str, max_size: Optional[int] = None) -> None:
        """`max_size`: the largest full pool `resize` may grow to (post-capture sizing; default `size`): the slot
        map is allocated for it once, since attention and the decode graphs hold it."""
        self.full = TokenToKVPoolAllocator(size, page_size, device)
        self.swa = TokenToKVPoolAllocator(swa_size, page_size, device)
        self.page_size = page_size
        self.device = device
        slots = max(size, max_size or 0) + page_size
        # The device copy is what attention and the K/V stores read; the host copy what the scheduler reads
        # (a device read would wait for the forward in flight). Both are written together.
        self.full_to_swa = torch.zeros(slots, dtype=torch.int64, device=device)
        on_host = torch.device(device).type == "cpu"
        self.full_to_swa_host = self.full_to_swa if on_host else torch.zeros(slots, dtype=torch.int64)

    # ------------------------------------------------------------- geometry
    @property
    def size(self) -> int:
        return self.full.size

    @property
    def swa_size(self) -> int:
        return self.swa.size

    @property
    def lent_tokens(self) -> int:
        return 0  # the KT prefill slot is never lent from a hybrid pool (pool_configurator.can_lend_reservations)

    def available_size(self) -> int:
        return self.full.available_size()

    def resize(self, size: int, swa_size: int) -> None:
        """Post-capture sizing: both pools to their final sizes (pages beyond the old sizes become free)."""
        if size + self.page_size > self.full_to_swa.shape[0]:
            raise ValueError(f"pool of {size} tokens is larger than the slot map ({self.full_to_swa.shape[0]} slots)")
        self.full.resize(size)
        self.swa.resize(swa_size)

    def swa_available_size(self) -> int:
        return self.swa.available_size()

    def clear(self) -> None:
        self.full.clear()
        self.swa.clear()
        self._set_map(
            torch.arange(self.full_to_swa.shape[0]), torch.zeros(self.full_to_swa.shape[0], dtype=torch.int64)
        )

    # ---------------------------------------------------------------- alloc
    def _swa_last_locs(self, last_locs: Optional[List[int]]) -> Optional[List[int]]:
        """The window slots continuing each request's last page (its last token is always in its window)."""
        if last_locs is None:
            return None
        out = []
        for loc in last_locs:
            swa = int(self.full_to_swa_host[loc]) if loc >= 0 else -1
            if loc >= 0 and swa == 0:
                raise RuntimeError(f"full slot {loc} continues a page but has no window slot")
            out.append(swa)
        return out

    def _paired(self, new_pages: int, alloc_full, alloc_swa) -> Optional[torch.Tensor]:
        """Full slots and their window slots, or None with nothing taken: both pools need `new_pages` new pages
        (a request's partly filled last page is continued in both), checked before either is touched."""
        if not (self.full.has_free_pages(new_pages) and self.swa.has_free_pages(new_pages)):
            return None
        full, swa = alloc_full(), alloc_swa()
        self._set_map(full, swa)
        return full

    def alloc(self, need_size: int) -> Optional[torch.Tensor]:
        return self._paired(
            need_size // self.page_size, lambda: self.full.alloc(need_size), lambda: self.swa.alloc(need_size)
        )

    def alloc_extend(
        self, prefix_lens: List[int], seq_lens: List[int], last_locs: Optional[List[int]]
    ) -> Optional[torch.Tensor]:
        swa_last = self._swa_last_locs(last_locs)
        return self._paired(
            extend_pages(prefix_lens, seq_lens, self.page_size),
            lambda: self.full.alloc_extend(prefix_lens, seq_lens, last_locs),
            lambda: self.swa.alloc_extend(prefix_lens, seq_lens, swa_last),
        )

    def alloc_decode(self, seq_lens: List[int], last_locs: Optional[List[int]]) -> Optional[torch.Tensor]:
        swa_last = self._swa_last_locs(last_locs)
        return self._paired(
            decode_pages(seq_lens, self.page_size),
            lambda: self.full.alloc_decode(seq_lens, last_locs),
            lambda: self.swa.alloc_decode(seq_lens, swa_last),
        )

    # ----------------------------------------------------------------- free
    def free(self, indices: torch.Tensor) -> None:
        """Give back both slots of these tokens (full-pool slots)."""
        if indices.numel() == 0:
            return
        self.free_swa(indices)
        self.full.free(indices)

    def free_swa(self, indices: torch.Tensor) -> None:
        """Give back the window slots of these tokens (full-pool slots; tokens without one are skipped). Callers
        free whole pages: every token of a page they name leaves its window together."""
        if indices.numel() == 0:
            return
        indices = indices.to("cpu", torch.int64)
        swa = self.full_to_swa_host[indices]
        held = swa > 0
        if bool(held.any()):
            self.swa.free(swa[held])
            self._set_map(indices[held], torch.zeros(int(held.sum()), dtype=torch.int64))

    def swa_held(self, indices: torch.Tensor) -> torch.Tensor:
        """For each full-pool slot, whether its token still has a window slot (host, bool)."""
        return self.full_to_swa_host[indices.to("cpu", torch.int64)] > 0

    def _set_map(self, full: torch.Tensor, swa: torch.Tensor) -> None:
        full, swa = full.to("cpu", torch.int64), swa.to("cpu", torch.int64)
        self.full_to_swa_host[full] = swa
        if self.full_to_swa_host is not self.full_to_swa:
            dev = lambda t: t.to(self.full_to_swa.device, non_blocking=True)  # noqa: E731
            self.full_to_swa[dev(full)] = dev(swa)
