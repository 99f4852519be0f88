"""The KT prefill slot's lender: the KV pool keeps the slot's memory while no long prefill runs.

On the post-capture path the planner sizes the pool as if the slot took nothing and marks its last
tokens as the prefill slot's tail (whole pages, whole VMM granules of every K and V buffer; the allocator
hands them out last). When the next prefill batch can be large enough for KT's full-GPU path
(--kt-gpu-prefill-token-threshold), the scheduler takes the tail before that batch takes any KV
page, if no running request holds a page of it: cached radix-tree pages there are evicted, the
arena moves the tail's physical memory from the KV ranges into the slot's own range (no allocation,
no address a CUDA graph holds changes), the allocator stops handing the tail out (admission then
counts the pool without it), and the slot's parameters are laid over that memory (KTPrefillSlot.lend). If a running
request holds tail pages the batch takes the hybrid CPU/GPU path instead (logged once per episode).
Once no long prefill is in flight or waiting, the memory goes back to the pool at the end of the step.

Every tensor-parallel rank takes the same decision: it depends only on the scheduler's state, which
is identical on every rank.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence

import torch

from sglang.srt.mem_cache.vmm import VMMError

if TYPE_CHECKING:
    from sglang.srt.layers.moe.kt_prefill_slot import KTPrefillSlot
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.radix_cache import RadixCache
    from sglang.srt.mem_cache.vmm import VirtualKVArena

logger = logging.getLogger(__name__)


@dataclass
class KTPrefillSlotStats:
    """What /server_info reports of the slot under memory_plan.kt_slot."""

    tail_tokens: int
    lent: bool = False
    takes: int = 0
    returns: int = 0
    refusals: int = 0  # prefills that wanted the slot and ran hybrid: the tail was in use
    last_take_ms: float = 0.0
    last_return_ms: float = 0.0


class HostSlotMemory:
    """Stands for VirtualKVArena's tail lending on the CPU (tests: SGLANG_TEST_CPU_ELASTIC_SLOT_TAIL_TOKENS): the
    slot's memory is host bytes and nothing is remapped, so the scheduling around it runs as on the GPU."""

    def __init__(self, slot_bytes: int) -> None:
        self._memory = torch.zeros(slot_bytes, dtype=torch.uint8)
        self.tail_lent = False

    def lend_tail(self) -> float:
        self.tail_lent = True
        return 0.0

    def return_tail(self) -> float:
        self.tail_lent = False
        return 0.0

    def slot_tensor(self) -> torch.Tensor:
        if not self.tail_lent:
            raise RuntimeError("the slot's memory exists only while the tail is lent")
        return self._memory


def _remaining(req: "Req") -> int:
    """Tokens of `req` still to prefill (a chunked request has some already)."""
    return len(req.origin_input_ids) + len(req.output_ids) - req.kv_committed_len


class KTPrefillSlotLender:
    def __init__(
        self,
        arena: "VirtualKVArena",
        allocator: "TokenToKVPoolAllocator",
        tree_cache: "RadixCache",
        slot: "KTPrefillSlot",
        threshold: int,
    ) -> None:
        """`arena`: where the tail's memory is lent from (the VMM arena, or HostSlotMemory on the CPU)."""
        self.arena, self.allocator, self.tree_cache, self.slot = arena, allocator, tree_cache, slot
        self.threshold = threshold
        self.stats = KTPrefillSlotStats(tail_tokens=allocator.tail_tokens)
        self._refusal_logged = False  # one log line per episode of refusals
        slot.use_lent_memory()

    def should_take(self, chunked_req, waiting: Sequence["Req"], chunk: Optional[int], room_without_tail: int) -> bool:
        """Whether to lend the tail before the next prefill batch is formed: that batch can reach the threshold
        (what is left to prefill, the chunked request's rest and the waiting prompts, at most one chunk), and
        its first request's next chunk fits in the pool without the tail (`room_without_tail`: free + evictable
        tokens outside it). A prompt that needs the tail's pages gets them, and runs hybrid. Cached prefixes
        may make the batch smaller than foreseen: then the slot is lent for one batch that runs hybrid."""
        if self.stats.lent or self.slot.disabled or (chunked_req is None and not waiting):
            return False
        pending = sum(_remaining(r) for r in waiting) + (0 if chunked_req is None else _remaining(chunked_req))
        if min(pending, chunk or pending) < self.threshold:
            return False
        head = _remaining(chunked_req if chunked_req is not None else waiting[0])
        if min(head, chunk or head) > room_without_tail:
            self._refuse("the next prompt needs pages of the KV pool's last {} tokens")
            return False
        return True

    def _refuse(self, why: str) -> None:
        """A prefill that wanted the slot runs the hybrid path; logged once per episode."""
        self.stats.refusals += 1
        if not self._refusal_logged:
            self._refusal_logged = True
            logger.info(
                "KT prefill slot: %s; long prefills take the hybrid CPU/GPU path until it is free",
                why.format(self.stats.tail_tokens),
            )

    def take(self, step: int) -> bool:
        """Lend the tail to the slot before forward `step`; False (the batch runs hybrid) when a running
        request holds part of it."""
        if self.stats.lent:
            return True
        lo, hi = self.allocator.tail_slot_range()
        if not (self.tree_cache.evict_slots(lo, hi) and self.allocator.tail_free()):
            self._refuse("running requests hold part of the KV pool's last {} tokens")
            return False
        start = time.perf_counter()
        try:
            self.arena.lend_tail()  # synchronizes first: kernels of finished requests may still touch the tail
        except VMMError as e:  # the arena rolled back: the pool keeps its tail, this batch runs hybrid
            self.stats.refusals += 1
            logger.error("KT prefill slot: could not remap the KV pool's tail (%s); this prefill runs hybrid", e)
            return False
        self.allocator.lend_tail()
        self.slot.lend(self.arena.slot_tensor())
        self.stats.last_take_ms = (time.perf_counter() - start) * 1000
        self.stats.lent, self._refusal_logged = True, False
        self.stats.takes += 1
        logger.info("KT prefill slot: taken from the KV pool's tail before step %d (%.1f ms)", step,
                    self.stats.last_take_ms)  # fmt: skip
        return True

    def give_back(self, step: int) -> None:
        """Return the tail to the pool after forward `step` (the slot's views of it are dropped first)."""
        if not self.stats.lent:
            return
        start = time.perf_counter()
        self.slot.reclaim()
        try:
            self.arena.return_tail()  # synchronizes first: the slot's last kernels must be done with it
        except VMMError as e:  # rolled back: the memory is still the slot's, and stays lent
            logger.error("KT prefill slot: could not return the tail to the KV pool (%s); it stays lent", e)
            self.slot.lend(self.arena.slot_tensor())
            return
        self.allocator.return_tail()
        self.stats.last_return_ms = (time.perf_counter() - start) * 1000
        self.stats.lent = False
        self.stats.returns += 1
        logger.info("KT prefill slot: given back to the KV pool after step %d (%.1f ms)", step,
                    self.stats.last_return_ms)  # fmt: skip
