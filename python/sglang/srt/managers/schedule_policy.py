"""Which waiting requests join the next prefill batch, within memory, request and chunk budgets."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, List, Optional

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.mem_cache.radix_cache import RadixCache

# Future decode tokens of one request counted against the pool are capped at this (SGLang's clip).
CLIP_MAX_NEW_TOKENS = 4096


def estimated_future_tokens(req: "Req", new_token_ratio: float) -> int:
    remaining = max(req.sampling_params.max_new_tokens - req.num_generated, 0)
    return int(min(remaining, CLIP_MAX_NEW_TOKENS) * new_token_ratio)


def sort_waiting_queue(queue: List["Req"], policy: str, tree_cache: "RadixCache") -> None:
    """fcfs keeps arrival order; lpm (longest prefix match) puts the best cache hits first."""
    if policy == "lpm" and not tree_cache.disable and len(queue) > 1:
        for req in queue:
            req.init_next_round_input(tree_cache)
        queue.sort(key=lambda r: -len(r.prefix_indices))


@dataclass
class PrefillAdder:
    page_size: int
    rem_total_tokens: int  # free + evictable slots minus what running requests will still need
    rem_input_tokens: int  # --max-prefill-tokens budget for new tokens in this batch
    rem_chunk_tokens: Optional[int]  # --chunked-prefill-size budget, None when chunking is off
    rem_requests: int  # room left under max_running_requests
    has_running: bool = False  # requests are decoding (or a chunked prefill is in flight)
    # The hybrid SWA pool's room for new tokens (free + evictable window slots, less the running requests' next
    # step); None without that pool. A prefill's new tokens all take window slots until the batch ran, so a
    # request's chunk is cut to it.
    rem_swa_tokens: Optional[int] = None
    can_run_list: List["Req"] = field(default_factory=list)
    new_chunked_req: Optional["Req"] = None

    def _lock(self, req: "Req", tree_cache: "RadixCache") -> None:
        req.cache_protected_len = len(req.prefix_indices)

    def _chunk_budget(self) -> Optional[int]:
        """New tokens one request may prefill in this batch: the chunk budget, within the window pool's room."""
        budgets = [b for b in (self.rem_chunk_tokens, self.rem_swa_tokens) if b is not None]
        return min(budgets) if budgets else None

    def add_chunked_req(self, req: "Req") -> Optional["Req"]:
        """Schedule the next chunk of an in-flight chunked prefill; returns it if more chunks remain (it waits a
        batch, scheduling nothing, while the window pool has not a page of room)."""
        if self.rem_swa_tokens is not None and self.rem_swa_tokens < self.page_size:
            return req
        budget = self._chunk_budget()
        budget = budget if budget is not None else req.extend_input_len
        truncated = req.extend_input_len > budget
        if truncated:
            req.extend_input_len = max(budget // self.page_size * self.page_size, self.page_size)
            req.fill_ids = req.fill_ids[: len(req.prefix_indices) + req.extend_input_len]
        self.can_run_list.append(req)
        self._spend(req.extend_input_len)
        return req if truncated else None

    def _spend(self, tokens: int) -> None:
        self.rem_total_tokens -= tokens
        self.rem_input_tokens -= tokens
        if self.rem_swa_tokens is not None:
            # Whole pages of the window pool: the budget stays a multiple of the page size, so a request's tokens
            # fit it exactly when their pages do.
            self.rem_swa_tokens -= -(-tokens // self.page_size) * self.page_size
        if self.rem_chunk_tokens is not None:
            self.rem_chunk_tokens -= tokens

    def add_one_req(self, req: "Req", tree_cache: "RadixCache", new_token_ratio: float) -> str:
        """Try to admit `req`; returns "added", "chunked" (admitted partially, stop), or "full" (stop)."""
        if self.rem_requests <= 0:
            return "full"
        # Lock the matched prefix before checking the budget: locked slots are no longer evictable,
        # so they stop counting as room (rem_total_tokens included them as evictable; so did the window pool's).
        swa_room = tree_cache.swa_room()
        locked = tree_cache.inc_lock_ref(req.last_node)
        swa_locked = 0 if swa_room is None else swa_room - tree_cache.swa_room()
        self.rem_total_tokens -= locked
        if self.rem_swa_tokens is not None:
            self.rem_swa_tokens -= swa_locked
        verdict = self._add_locked(req, tree_cache, new_token_ratio)
        if verdict == "full":
            tree_cache.dec_lock_ref(req.last_node)
            self.rem_total_tokens += locked
            if self.rem_swa_tokens is not None:
                self.rem_swa_tokens += swa_locked
        return verdict

    def _add_locked(self, req: "Req", tree_cache: "RadixCache", new_token_ratio: float) -> str:
        future = estimated_future_tokens(req, new_token_ratio)
        idle = not self.can_run_list and not self.has_running
        # When nothing else runs, admit anyway: its prompt fits the pool (checked on arrival), and a
        # request that later outgrows the pool is aborted by the decode step instead of waiting forever.
        if req.extend_input_len + future > self.rem_total_tokens and not idle:
            return "full"
        if self.can_run_list and req.extend_input_len > self.rem_input_tokens:
            return "full"
        chunk = self._chunk_budget()
        if chunk is not None and req.extend_input_len > chunk:
            aligned = chunk // self.page_size * self.page_size
            if aligned <= 0:
                return "full"
            req.extend_input_len = aligned
            req.fill_ids = req.fill_ids[: len(req.prefix_indices) + aligned]
            self._lock(req, tree_cache)
            self.can_run_list.append(req)
            self.new_chunked_req = req
            self._spend(aligned)
            self.rem_requests -= 1
            return "chunked"
        self._lock(req, tree_cache)
        self.can_run_list.append(req)
        self._spend(req.extend_input_len)
        self.rem_total_tokens -= future
        self.rem_requests -= 1
        return "added"
