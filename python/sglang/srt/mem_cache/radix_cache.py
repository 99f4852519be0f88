"""Radix tree over token ids whose values are KV slot indices: shared prefixes are computed once.

Keys are page-aligned (a node's key length is a multiple of page_size), so a matched prefix is
always whole pages. Nodes referenced by running requests are locked (lock_ref > 0) and never
evicted; unlocked leaves are evicted least-recently-used first when the allocator runs dry.
"""

from __future__ import annotations

import heapq
import itertools
import time
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

import torch

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool

_counter = itertools.count()


class TreeNode:
    def __init__(self, parent: Optional["TreeNode"] = None) -> None:
        self.children: Dict[tuple, TreeNode] = {}
        self.parent = parent
        self.key: List[int] = []
        self.value: torch.Tensor = torch.empty(0, dtype=torch.int64)
        self.lock_ref = 0
        # The hybrid SWA pool only (swa_radix_cache.py): tokens of this node that still hold a window slot, the
        # locks that keep them (running requests whose window reaches into this node), and the id that marks this
        # node as the top of such locks.
        self.swa_held = 0
        self.swa_lock_ref = 0
        self.swa_top_id: Optional[int] = None
        self.swa_lock_tops: List[Optional[int]] = []
        self.last_access_time = time.monotonic()
        self.id = next(_counter)

    def __lt__(self, other: "TreeNode") -> bool:
        return self.last_access_time < other.last_access_time


class RadixCache:
    def __init__(
        self,
        req_to_token_pool: "ReqToTokenPool",
        token_to_kv_pool_allocator: "TokenToKVPoolAllocator",
        page_size: int,
        disable: bool = False,
    ) -> None:
        self.req_to_token_pool = req_to_token_pool
        self.allocator = token_to_kv_pool_allocator
        self.page_size = page_size
        self.disable = disable
        self.reset()

    def reset(self) -> None:
        self.root = TreeNode()
        self.root.lock_ref = 1  # the root is never evicted
        self.evictable_size_ = 0
        self.protected_size_ = 0

    # ------------------------------------------------------------------ keys
    def _child_key(self, key: List[int]) -> tuple:
        return tuple(key[: self.page_size])

    def _match_len(self, a: List[int], b: List[int]) -> int:
        n = 0
        for x, y in zip(a, b):
            if x != y:
                break
            n += 1
        return n // self.page_size * self.page_size

    # ----------------------------------------------------------------- lookup
    def match_prefix(self, key: List[int]) -> Tuple[torch.Tensor, TreeNode]:
        """Slots of the longest cached page-aligned prefix of `key`, and the node where it ends."""
        if self.disable or not key:
            return torch.empty(0, dtype=torch.int64), self.root
        key = key[: len(key) // self.page_size * self.page_size]
        values: List[torch.Tensor] = []
        node = self.root
        now = time.monotonic()
        node.last_access_time = now
        while key:
            step = self._descend(node, key, now)
            if step is None:
                break
            node, n = step
            values.append(node.value)
            key = key[n:]
        value = torch.cat(values) if values else torch.empty(0, dtype=torch.int64)
        return value, node

    def _descend(self, node: TreeNode, key: List[int], now: float) -> Optional[Tuple[TreeNode, int]]:
        """The child of `node` whose key starts like `key`, split so that all of it matches, and the
        matched length; None when no child shares the first page. After a partial match the next
        lookup finds nothing (the keys differ within that page), so callers simply loop."""
        child = node.children.get(self._child_key(key))
        if child is None:
            return None
        child.last_access_time = now
        n = self._match_len(child.key, key)
        if n < len(child.key):
            child = self._split(child, n)
        return child, n

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Split `child` so that its first n tokens become a new parent node; returns that node."""
        new = TreeNode(child.parent)
        new.key, new.value = child.key[:n], child.value[:n]
        new.lock_ref = child.lock_ref
        new.last_access_time = child.last_access_time
        child.parent.children[self._child_key(new.key)] = new
        child.key, child.value = child.key[n:], child.value[n:]
        child.parent = new
        new.children[self._child_key(child.key)] = child
        return new

    def insert(self, key: List[int], value: torch.Tensor) -> int:
        """Insert a page-aligned key; returns how many leading tokens were already cached."""
        if self.disable:
            return 0
        node = self.root
        now = time.monotonic()
        prefix_len = 0
        while key:
            step = self._descend(node, key, now)
            if step is None:
                break
            node, n = step
            prefix_len += n
            key, value = key[n:], value[n:]
        if key:
            leaf = TreeNode(node)
            leaf.key, leaf.value = list(key), value.clone().to("cpu", torch.int64)
            node.children[self._child_key(key)] = leaf
            self.evictable_size_ += len(key)
            self._added(leaf)
        return prefix_len

    # ------------------------------------------------------------ requests
    def _insert_page_aligned(self, req: "Req", token_ids: List[int], kv: torch.Tensor) -> int:
        """Insert the request's whole pages; free its copies of tokens the tree already held.
        Returns the aligned length inserted."""
        aligned = len(kv) // self.page_size * self.page_size
        new_prefix_len = self.insert(token_ids[:aligned], kv[:aligned])
        self.allocator.free(kv[req.cache_protected_len : max(new_prefix_len, req.cache_protected_len)])
        return aligned

    def cache_finished_req(self, req: "Req") -> None:
        """Move a finished request's KV into the tree (or free it) and release its request slot."""
        token_ids = (req.origin_input_ids + req.output_ids)[: req.kv_committed_len]
        pool, row = self.req_to_token_pool, req.req_pool_idx
        kv = pool.read(row, len(token_ids))
        # Slots allocated past the committed K/V (a decode step launched before the request was seen to
        # finish, or a failed batch's) hold nothing to keep. They are freed in the same call as the unaligned
        # tail, whose last page they may share: the allocator frees whole pages.
        beyond = pool.read(row, req.kv_allocated_len, start=len(token_ids))
        req.kv_allocated_len = 0
        if self.disable:
            self.allocator.free(torch.cat((kv, beyond)))
        else:
            aligned = self._insert_page_aligned(req, token_ids, kv)
            self.allocator.free(torch.cat((kv[aligned:], beyond)))  # the unaligned tail goes back to the pool
            self.dec_lock_ref(req.last_node)
        self.req_to_token_pool.free(req.req_pool_idx)
        req.req_pool_idx = None

    def cache_unfinished_req(self, req: "Req") -> None:
        """After a prefill chunk: share the computed prefix through the tree, keep the request's slot."""
        token_ids = req.fill_ids
        kv = self.req_to_token_pool.read(req.req_pool_idx, len(token_ids))
        if self.disable:
            req.prefix_indices = kv  # the request keeps every slot it computed
            return
        aligned = self._insert_page_aligned(req, token_ids, kv)
        new_indices, new_node = self.match_prefix(token_ids[:aligned])
        start = req.cache_protected_len
        self.req_to_token_pool.write(req.req_pool_idx, start, new_indices[start:])
        self.dec_lock_ref(req.last_node)
        self.inc_lock_ref(new_node)
        req.last_node = new_node
        req.cache_protected_len = len(new_indices)
        req.prefix_indices = torch.cat((new_indices, kv[len(new_indices) :]))

    # ------------------------------------------------ hooks (the window pool's accounting)
    def _added(self, node: TreeNode) -> None:
        """A new node holds slots."""

    def _dropped(self, node: TreeNode) -> None:
        """An unlocked node leaves the tree; its slots are freed right after."""

    def release_out_of_window(self, reqs: List["Req"], need: int) -> None:
        """Free the slots no later query of these requests can see, if the pool has fewer than `need` free;
        without a window pool there are none."""

    def swa_room(self, running: Sequence["Req"] = ()) -> Optional[int]:
        """Tokens the window pool can hold now, evicting cached ones and releasing what `running` requests no
        longer see; None without a window pool."""
        return None

    def swa_pool_size(self) -> int:
        """The window pool's tokens (0 without one)."""
        return 0

    # -------------------------------------------------------------- locking
    def inc_lock_ref(self, node: TreeNode) -> int:
        """Lock `node` and its ancestors; returns how many tokens stopped being evictable."""
        delta = 0
        while node is not self.root and node is not None:
            if node.lock_ref == 0:
                self.evictable_size_ -= len(node.key)
                self.protected_size_ += len(node.key)
                delta += len(node.key)
            node.lock_ref += 1
            node = node.parent
        return delta

    def dec_lock_ref(self, node: Optional[TreeNode]) -> int:
        """Unlock `node` and its ancestors; returns how many tokens became evictable again."""
        delta = 0
        while node is not self.root and node is not None:
            if node.lock_ref == 1:
                self.evictable_size_ += len(node.key)
                self.protected_size_ -= len(node.key)
                delta += len(node.key)
            node.lock_ref -= 1
            node = node.parent
        return delta

    # ------------------------------------------------------------- eviction
    def evict(self, num_tokens: int) -> int:
        """Free at least num_tokens slots from unlocked leaves, LRU first; returns tokens freed."""
        if self.disable or num_tokens <= 0:
            return 0
        leaves = [n for n in self._all_nodes() if not n.children and n.lock_ref == 0 and n is not self.root]
        heapq.heapify(leaves)
        freed = 0
        while freed < num_tokens and leaves:
            leaf = heapq.heappop(leaves)
            self._dropped(leaf)
            self.allocator.free(leaf.value)
            freed += len(leaf.key)
            self.evictable_size_ -= len(leaf.key)
            parent = leaf.parent
            del parent.children[self._child_key(leaf.key)]
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(leaves, parent)
        return freed

    def evict_slots(self, lo: int, hi: int) -> bool:
        """Free every cached node holding a KV slot in [lo, hi) (the lendable tail), with its subtree
        (descendants extend its prefix, so they cannot outlive it). A node whose slots only start in
        the range partway is split first, at a page boundary, so its leading pages stay cached.
        All or nothing: if a locked node would have to go, nothing changes and this returns False.
        Returns True when no node holds a slot in [lo, hi) afterwards."""
        if self.disable or lo >= hi:
            return True
        hits = self._topmost_nodes_holding(lo, hi)
        if any(n.lock_ref > 0 for hit, _ in hits for n in self._subtree(hit)):
            return False  # a running request reads those slots; checked before anything is split
        for hit, first in hits:
            if first:
                self._split(hit, first)  # `hit` keeps the part from `first` on (the split adds its parent)
            self._remove_subtree(hit)
        return True

    def _topmost_nodes_holding(self, lo: int, hi: int) -> List[Tuple[TreeNode, int]]:
        """Nodes holding a slot in [lo, hi) that have no such ancestor, each with the page-aligned
        position of its first such slot. Their subtrees go whole, so the walk stops at them."""
        out: List[Tuple[TreeNode, int]] = []
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            inside = ((node.value >= lo) & (node.value < hi)).nonzero()
            if len(inside):
                out.append((node, int(inside[0]) // self.page_size * self.page_size))
            else:
                stack.extend(node.children.values())
        return out

    def _subtree(self, node: TreeNode) -> List[TreeNode]:
        out, stack = [], [node]
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(n.children.values())
        return out

    def _remove_subtree(self, node: TreeNode) -> None:
        """Detach an unlocked subtree and give its slots back to the allocator."""
        del node.parent.children[self._child_key(node.key)]
        for n in self._subtree(node):
            self._dropped(n)
            self.allocator.free(n.value)
            self.evictable_size_ -= len(n.key)

    def _all_nodes(self) -> List[TreeNode]:
        return self._subtree(self.root)

    def evictable_size(self) -> int:
        return self.evictable_size_

    def protected_size(self) -> int:
        return self.protected_size_

    def total_size(self) -> int:
        return sum(len(n.key) for n in self._all_nodes())
