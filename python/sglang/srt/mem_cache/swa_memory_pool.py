"""The hybrid SWA pool: full-attention layers in one MHA pool, sliding-window layers in a second, smaller one.

A windowed layer's query sees only its request's last W keys, so that layer needs K/V for about W tokens of each
running request, not for every token. Its K/V live in the window pool (`swa_size` tokens, upstream's
--swa-full-tokens-ratio of the full pool), addressed by the window slots swa_allocator.SWATokenToKVPoolAllocator
assigns. Callers keep using full-pool slots everywhere (request table, radix tree, out_cache_loc, kv indices): for
a windowed layer this pool stores at, and the attention backends read from, `full_to_swa[slot]` (`to_swa_slots`).
A token whose window slot was freed maps to the window pool's dummy slot 0, which the backends never let a query
see (it is outside every window that reads it).
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool


class SWAKVPool:
    def __init__(
        self,
        full_pool: MHATokenToKVPool,
        swa_pool: MHATokenToKVPool,
        layer_windows: Sequence[int],
        full_to_swa: torch.Tensor,
    ) -> None:
        """`full_pool` holds the full-attention layers, `swa_pool` the windowed ones, in model order; `layer_windows`
        has one entry per layer, > 0 for a windowed layer; `full_to_swa` is the allocator's device map."""
        self.full_pool, self.swa_pool = full_pool, swa_pool
        self.page_size = full_pool.page_size
        self.dtype = full_pool.dtype
        self.layer_num = len(layer_windows)
        self.device = full_pool.device
        self.full_to_swa = full_to_swa
        self.is_swa = [w > 0 for w in layer_windows]
        full_ids = [i for i, swa in enumerate(self.is_swa) if not swa]
        swa_ids = [i for i, swa in enumerate(self.is_swa) if swa]
        if (len(full_ids), len(swa_ids)) != (full_pool.layer_num, swa_pool.layer_num):
            raise ValueError(
                f"pools of {full_pool.layer_num} + {swa_pool.layer_num} layers for windows {layer_windows}"
            )
        # The window pool's dummy page holds zeros: a freed token's reads land there, and a zero (unlike an
        # uninitialised NaN) stays harmless however a backend masks it.
        for buf in swa_pool.buffers():
            buf[: self.page_size].zero_()
        # Each model layer's place: its pool and its index there.
        self._place: List[Tuple[MHATokenToKVPool, int]] = [(full_pool, 0)] * self.layer_num
        for local, layer in enumerate(full_ids):
            self._place[layer] = (full_pool, local)
        for local, layer in enumerate(swa_ids):
            self._place[layer] = (swa_pool, local)

    # ------------------------------------------------------------------- layers
    has_window_pool = True

    def is_swa_layer(self, layer_id: int) -> bool:
        return self.is_swa[layer_id]

    def to_swa_slots(self, slots: torch.Tensor) -> torch.Tensor:
        """The window pool's slots of these tokens (full-pool slots, any shape, on the device); 0 where freed."""
        return self.full_to_swa[slots.long()].to(slots.dtype)

    def layer_slots(self, layer_id: int, slots: torch.Tensor) -> torch.Tensor:
        """`slots` (full-pool) in the address space of layer `layer_id`'s buffers."""
        return self.to_swa_slots(slots) if self.is_swa[layer_id] else slots

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        pool, local = self._place[layer_id]
        return pool.get_key_buffer(local)

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        pool, local = self._place[layer_id]
        return pool.get_value_buffer(local)

    def set_kv_buffer(
        self,
        layer_id: int,
        loc: torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: Optional[float] = None,
        v_scale: Optional[float] = None,
    ) -> None:
        """Store at full-pool slots `loc` (a windowed layer stores at their window slots)."""
        pool, local = self._place[layer_id]
        pool.set_kv_buffer(local, self.layer_slots(layer_id, loc), cache_k, cache_v, k_scale, v_scale)

    def fused_store_buffers(
        self, layer_id: int, k: torch.Tensor, v: torch.Tensor
    ) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """A full-attention layer's buffers for the fused rotary + store kernel (it writes at out_cache_loc, the
        full pool's slots); a windowed layer stores through set_kv_buffer, which maps the slots."""
        if self.is_swa[layer_id]:
            return None
        pool, local = self._place[layer_id]
        return pool.fused_store_buffers(local, k, v)

    # ------------------------------------------------------------------- memory
    def buffers(self) -> List[torch.Tensor]:
        return self.full_pool.buffers() + self.swa_pool.buffers()

    def release_buffers(self) -> None:
        self.full_pool.release_buffers()
        self.swa_pool.release_buffers()
