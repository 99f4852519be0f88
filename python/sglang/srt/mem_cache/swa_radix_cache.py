"""The radix cache over the hybrid SWA pool (swa_allocator.py): prefixes are reused only where their window is kept.

A cached token always keeps its full-pool slot (full-attention layers read every earlier token), but its window
slot may be gone: requests free the window slots of their tokens as those leave the window, before they finish, and
cached tokens lose theirs when the window pool needs room (`evict_swa`, least recently used first, nodes no running
request's window reaches).
A prefix of length L can be reused only if every token a query at position L can see in a windowed layer, positions
L - W + 1 .. L - 1, still has its window slot; `match_prefix` returns the longest such page-aligned prefix.

When the window pool runs short, running requests free the window slots of the tokens they own that have left
their window (`release_out_of_window`): those past their cached prefix (`cache_protected_len`), earlier prefill chunks
included (they stay the request's until it finishes, instead of entering the tree chunk by chunk, so a long prompt's
window slots can be freed while it is still being prefilled). Until then they keep them, so a finished request's
whole sequence stays reusable. A running request's window reaches into its cached prefix: the last W - 1 tokens of
its path are window-locked (`inc_lock_ref`); window slots further up may be evicted while their nodes stay locked
for the full-attention layers.
"""

from __future__ import annotations

import heapq
import itertools
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

import torch

from sglang.srt.mem_cache.radix_cache import RadixCache, TreeNode

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.mem_cache.swa_allocator import SWATokenToKVPoolAllocator


def visible_from(next_len: int, window: int) -> int:
    """The first position a query at position next_len - 1 sees through a window of `window` keys."""
    return max(0, next_len - window)


class SWARadixCache(RadixCache):
    allocator: "SWATokenToKVPoolAllocator"

    def __init__(
        self,
        req_to_token_pool: "ReqToTokenPool",
        token_to_kv_pool_allocator: "SWATokenToKVPoolAllocator",
        page_size: int,
        window: int,
        disable: bool = False,
    ) -> None:
        """`window`: the widest sliding window of the model's layers (a token is kept while any layer sees it)."""
        self.window = window
        self._top_ids = itertools.count(1)  # marks of the top node of each window lock (dec_lock_ref walks to it)
        super().__init__(req_to_token_pool, token_to_kv_pool_allocator, page_size, disable)

    def reset(self) -> None:
        super().reset()
        self.swa_evictable_size_ = 0  # window slots held by nodes without a window lock

    # ----------------------------------------------------------------- lookup
    def match_prefix(self, key: List[int]) -> Tuple[torch.Tensor, TreeNode]:
        value, node = super().match_prefix(key)
        usable = self._usable_prefix_len(value)
        if usable == len(value):
            return value, node
        return super().match_prefix(key[:usable])  # ends (split if need be) where the usable prefix does

    def _usable_prefix_len(self, value: torch.Tensor) -> int:
        """The longest page-aligned L <= len(value) whose positions L - W + 1 .. L - 1 all hold window slots."""
        if len(value) == 0:
            return 0
        missing = torch.cat((torch.zeros(1, dtype=torch.int64), (~self.allocator.swa_held(value)).long().cumsum(0)))
        lens = torch.arange(len(value), 0, -self.page_size)  # candidate lengths, longest first (page-aligned)
        first = (lens - self.window + 1).clamp(min=0)
        usable = (missing[lens] - missing[first]) == 0
        hits = usable.nonzero()
        return int(lens[hits[0, 0]]) if len(hits) else 0

    # ------------------------------------------------------- window accounting
    def _count(self, node: TreeNode) -> None:
        node.swa_held = int(self.allocator.swa_held(node.value).sum()) if len(node.value) else 0

    def _added(self, node: TreeNode) -> None:
        self._count(node)
        self.swa_evictable_size_ += node.swa_held  # a new leaf has no window lock

    def _dropped(self, node: TreeNode) -> None:
        if node.swa_lock_ref == 0:
            self.swa_evictable_size_ -= node.swa_held
        node.swa_held = 0

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        new = super()._split(child, n)
        # Every window lock on `child` covers the new head too as far as the lock's walk knows: the head takes the
        # count, and the top mark, so a lock whose walk ended at `child` now ends at the head.
        new.swa_lock_ref = child.swa_lock_ref
        new.swa_top_id, child.swa_top_id = child.swa_top_id, None
        self._count(new)
        self._count(child)  # the halves share one window-lock state: the evictable total is unchanged
        return new

    # ---------------------------------------------------------- window locks
    def inc_lock_ref(self, node: TreeNode) -> int:
        """Lock `node` and its ancestors (super), and lock the window slots of the last W - 1 tokens of its path:
        what the next query of the request ending there sees. Window slots further up stay evictable."""
        delta = super().inc_lock_ref(node)
        if node is None or node is self.root:  # nothing cached to lock (dec_lock_ref then finds nothing either)
            return delta
        top = None
        covered, n = 0, node
        while n is not self.root and n is not None and covered < self.window - 1:
            if n.swa_lock_ref == 0:
                self.swa_evictable_size_ -= n.swa_held
            n.swa_lock_ref += 1
            covered += len(n.key)
            top, n = n, n.parent
        if top is not None and top.swa_top_id is None:
            top.swa_top_id = next(self._top_ids)
        node.swa_lock_tops.append(None if top is None else top.swa_top_id)
        return delta

    def dec_lock_ref(self, node: Optional[TreeNode]) -> int:
        """Unlock what inc_lock_ref(node) locked: the window locks up to the node marked with that lock's top id
        (splits since may have moved the mark up to a new head, which took the count too)."""
        delta = super().dec_lock_ref(node)
        if node is None or node is self.root:
            return delta
        top_id, n = node.swa_lock_tops.pop(), node
        while top_id is not None and n is not self.root:
            n.swa_lock_ref -= 1
            if n.swa_lock_ref == 0:
                self.swa_evictable_size_ += n.swa_held
            if n.swa_top_id == top_id:
                break
            n = n.parent
        return delta

    def swa_room(self, running: Sequence["Req"] = ()) -> Optional[int]:
        releasable = sum(end - start for start, end in map(self._releasable, running) if end > start)
        return self.allocator.swa_available_size() + self.swa_evictable_size_ + releasable

    def swa_pool_size(self) -> int:
        return self.allocator.swa_size

    def swa_evictable_size(self) -> int:
        return self.swa_evictable_size_

    # --------------------------------------------------------------- eviction
    def evict(self, num_tokens: int) -> int:
        """Make `num_tokens` slots available in both pools: cached leaves leave the tree (their window slots go
        with them) while the full pool is short, then nodes without a window lock give up their window slots while
        the window pool is."""
        freed = 0
        full_short = num_tokens - self.allocator.available_size()
        if full_short > 0:
            freed = super().evict(full_short)
        swa_short = num_tokens - self.allocator.swa_available_size()
        if swa_short > 0:
            self.evict_swa(swa_short)
        return freed

    def evict_swa(self, num_tokens: int) -> int:
        """Free the window slots of nodes no running request's window reaches (no window lock: the node may still be
        locked for its full slots), least recently used first, until num_tokens are freed; the nodes stay cached
        for the full-attention layers (a prefix ending within W after them can no longer be reused). Returns the
        window slots freed."""
        if self.disable or num_tokens <= 0:
            return 0
        nodes = [n for n in self._all_nodes() if n.swa_lock_ref == 0 and n.swa_held and n is not self.root]
        heapq.heapify(nodes)
        freed = 0
        while freed < num_tokens and nodes:
            node = heapq.heappop(nodes)
            self.allocator.free_swa(node.value)
            freed += node.swa_held
            self.swa_evictable_size_ -= node.swa_held
            node.swa_held = 0
        return freed

    # -------------------------------------------------------------- requests
    def cache_unfinished_req(self, req: "Req") -> None:
        """After a prefill chunk the request keeps its chunks (it frees their window slots as it goes); they
        enter the tree when it finishes."""
        req.prefix_indices = self.req_to_token_pool.read(req.req_pool_idx, len(req.fill_ids))

    def release_out_of_window(self, reqs: List["Req"], need: int) -> None:
        """When the window pool has fewer than `need` free slots: free the window slots of these requests' own
        tokens (past their cached prefix) that no query still to run can see, whole pages. Every batch launched
        and not yet processed (the overlap scheduler runs one beside the next one's preparation) has its
        queries at kv_committed_len or later. Until then those tokens keep their slots, so that a request that
        finishes leaves its whole sequence reusable (a repeated prompt, a shared system prompt)."""
        if self.allocator.swa_available_size() >= need:
            return
        for req in reqs:
            start, end = self._releasable(req)
            if end > start:
                self.allocator.free_swa(self.req_to_token_pool.read(req.req_pool_idx, end, start=start))
                req.swa_released_len = end

    def _releasable(self, req: "Req") -> Tuple[int, int]:
        """The positions [start, end) whose window slots `req` may give back now (empty when none)."""
        if req.req_pool_idx is None:
            return 0, 0
        end = visible_from(req.kv_committed_len + 1, self.window) // self.page_size * self.page_size
        return max(req.swa_released_len, req.cache_protected_len), end
