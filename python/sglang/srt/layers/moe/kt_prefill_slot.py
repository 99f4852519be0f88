"""The KT prefill slot: one complete MoE layer on the GPU that every layer's long prefill streams its experts into.

A prefill batch of at least --kt-gpu-prefill-token-threshold tokens runs its MoE fully on the GPU: each
layer copies all of its experts (GPU-resident ones device to device, the rest from pinned host memory)
into this one slot, then runs the fused MoE there. One slot per model, shared by every layer.

Its size is known before any KV is planned: `nbytes` builds the very same layer on the meta device and sums
its parameter bytes (exact for every quant method, allocates nothing), and the model runner reports it as
the memory reservation RESERVATION_NAME, so both KV sizing paths keep it free. On the static path the slot
is allocated on the first qualifying prompt; on the post-capture path it is laid over memory the
scheduler lends from the KV pool's tail (scheduler_components/kt_prefill_slot_lender.py) for the prefills
that need it. If it cannot be had, the full-GPU path switches off and prefills take the hybrid path.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Optional

import torch
from torch import nn

from sglang.srt.layers.moe.layer import make_moe_layer, moe_layer_bytes, param_bytes

if TYPE_CHECKING:
    from sglang.srt.layers.moe.kt_ep_wrapper import KTEPWrapperMethod

logger = logging.getLogger(__name__)
RESERVATION_NAME = "kt_full_gpu_prefill_slot"  # its name in the memory plan's reservations


class KTPrefillSlot:
    def __init__(
        self, num_experts: int, hidden: int, inter: int, dtype: torch.dtype, method: str, device: torch.device
    ) -> None:
        """One rank's slot: every expert of a layer, this rank's slice of each (`inter`)."""
        self.shape = (num_experts, hidden, inter, dtype, method)
        self.device = device
        self.nbytes = moe_layer_bytes(*self.shape)  # the reservation, exact
        self.layer: Optional[nn.Module] = None  # built on first use
        self.loaded_layer_id: Optional[int] = None  # whose experts it holds now
        self.disabled = False  # it did not fit: no later prefill tries again
        # Post-capture path: the slot lives only in memory lent from the KV pool's tail (never allocated).
        self.lent_only = False
        self._lent_memory: Optional[torch.Tensor] = None

    # ----------------------------------------------------------- lent memory
    def use_lent_memory(self) -> None:
        """From now on the slot is built only over memory handed in with lend()."""
        self.lent_only = True
        self.release()

    def lend(self, memory: torch.Tensor) -> None:
        self._lent_memory = memory
        self.layer = None

    def reclaim(self) -> None:
        """The lent memory goes back to the KV pool: drop every view of it first."""
        self.layer = None
        self._lent_memory = None

    # ----------------------------------------------------------------- use
    def acquire(self) -> Optional[nn.Module]:
        """The slot's layer, built on first use; None when it cannot be had now (nothing lent for this batch)
        or ever (it did not fit: the full-GPU path is then switched off)."""
        if self.layer is not None or self.disabled:
            return self.layer
        if self.lent_only:
            if self._lent_memory is not None:
                self.layer = self._over_memory(self._lent_memory)
            return self.layer
        try:
            if self.device.type == "cpu":
                from sglang.srt.utils.memory import host_available_memory_bytes

                if host_available_memory_bytes() < self.nbytes:
                    raise MemoryError(f"{self.nbytes} bytes requested, {host_available_memory_bytes()} available")
            with torch.device(self.device):
                self.layer = make_moe_layer(*self.shape)
        except (torch.cuda.OutOfMemoryError, MemoryError) as e:
            self.disabled = True
            logger.error(
                "Cannot allocate the full-GPU prefill slot (%.2f GiB): %s. Prefills use the hybrid CPU/GPU path from "
                "now on. Raise --mem-fraction-static, or pass --kt-gpu-prefill-token-threshold 0 to turn the "
                "full-GPU path off.",
                self.nbytes / (1 << 30),
                e,
            )
        self.loaded_layer_id = None
        return self.layer

    def _over_memory(self, memory: torch.Tensor) -> nn.Module:
        """The layer with its parameters laid over `memory` (bytes lent from the KV pool's tail): built on the
        meta device, then each parameter becomes a view, packed without gaps (widest elements first, so every
        view is aligned to its element size), so exactly `nbytes` fit."""
        with torch.device("meta"):
            layer = make_moe_layer(*self.shape)
        params = sorted(layer.named_parameters(), key=lambda kv: -kv[1].element_size())
        if self.nbytes > memory.numel():
            raise ValueError(f"the lent memory ({memory.numel()} bytes) cannot hold the slot ({self.nbytes} bytes)")
        offset = 0
        for name, p in params:
            n = p.numel() * p.element_size()
            view = memory[offset : offset + n].view(p.dtype).view(p.shape)
            layer.register_parameter(name, nn.Parameter(view, requires_grad=False))
            offset += n
        self.loaded_layer_id = None
        return layer

    def load_from(self, wrapper: "KTEPWrapperMethod") -> None:
        """Stream all of `wrapper`'s experts in (the slot must be acquired)."""
        if self.loaded_layer_id == wrapper.layer_id:
            return
        quant = self.layer.quant_method
        for e in range(wrapper.num_experts):
            src, idx = wrapper.expert_home(e)
            quant.copy_expert_from(self.layer, e, src, idx)
        self.loaded_layer_id = wrapper.layer_id

    def release(self) -> int:
        """Free the layer if it was built (the next qualifying prefill builds it again); returns its bytes.
        The post-capture probe uses it: the slot is covered by its reservation, so the bytes it held during
        the probe are not activation memory."""
        freed = 0 if self.layer is None else param_bytes(self.layer)
        self.layer = None
        self.loaded_layer_id = None
        return freed
