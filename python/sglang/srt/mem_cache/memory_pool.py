"""The two pools a request's KV lives in.

ReqToTokenPool maps (request slot, position) -> KV slot index. MHATokenToKVPool holds, per layer, one
K and one V buffer of shape [slots, kv_heads, head_dim] (token-major: each layer's tokens contiguous);
MLATokenToKVPool (multi-head latent attention, DeepSeek-V2/V3) one buffer per layer of [slots, 1,
kv_lora_rank + qk_rope_head_dim]: the compressed latent and the rotated shared key of each token.
Slot 0 (the whole first page) is the dummy slot: padded CUDA-graph entries write there, it is never
handed to a request. The buffers may be ordinary tensors or tensors over CUDA virtual memory whose
backed size grows after graph capture. How many tokens are usable is the allocator's to say
(TokenToKVPoolAllocator.size); the pool only holds the memory.
"""

from __future__ import annotations

from types import ModuleType
from typing import List, Optional, Sequence, Tuple

import torch

FP8_KV_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)  # --kv-cache-dtype fp8_e4m3 / fp8_e5m2


def kv_storage_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype KV buffers are allocated in: fp8 is stored as bytes (index_put on float8 tensors is
    not supported everywhere) and viewed back as fp8 when read."""
    return torch.uint8 if dtype in FP8_KV_DTYPES else dtype


def scaled_to_kv_dtype(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """x / scale in the fp8 KV dtype, saturating at its largest value (a checkpoint's calibrated KV scale
    maps the layer's largest K or V near it; a value beyond must not become NaN). Computed in fp32."""
    limit = torch.finfo(dtype).max
    return (x.float() / scale).clamp_(-limit, limit).to(dtype)


def _fused_store_module(device: str) -> Optional[ModuleType]:
    """The triton K/V store kernel on CUDA (triton comes with CUDA torch; CPU installs may lack it)."""
    if torch.device(device).type != "cuda":
        return None
    from sglang.srt.mem_cache import kv_store_kernel

    return kv_store_kernel


REQ_TO_TOKEN_DTYPE = torch.int32
REQ_TO_TOKEN_SPARE_POSITIONS = 4  # a row holds the context plus a few positions of slack


def req_to_token_bytes(rows: int, context_len: int) -> int:
    """Device bytes of a request table of `rows` rows for `context_len` (the runner's and plan_memory's one rule)."""
    return rows * (context_len + REQ_TO_TOKEN_SPARE_POSITIONS) * REQ_TO_TOKEN_DTYPE.itemsize


class ReqToTokenPool:
    """The request table, on the device (attention reads it) with a host copy (the scheduler reads it).

    The scheduler writes every slot it assigns through write() / write_positions(), which update both
    copies, and reads rows back from the host copy: reading the device table would be a host sync that
    waits for the forward in flight, the one the overlap scheduler prepares the next batch beside. The host
    copy is allocated uninitialised (the OS backs only the pages written: running requests' slots).
    """

    def __init__(self, size: int, context_len: int, device: str) -> None:
        self.size = size
        self.max_context_len = context_len + REQ_TO_TOKEN_SPARE_POSITIONS
        self.device = device
        shape = (size, self.max_context_len)
        self.req_to_token = torch.zeros(shape, dtype=REQ_TO_TOKEN_DTYPE, device=device)
        on_host = torch.device(device).type == "cpu"
        self.host = self.req_to_token if on_host else torch.empty(shape, dtype=REQ_TO_TOKEN_DTYPE)
        self.free_slots: List[int] = list(range(size))

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        """Positions [start, start + len(slots)) of request row `row` hold `slots` (host indices)."""
        values = slots.to("cpu", torch.int32)
        end = start + values.shape[0]
        self.host[row, start:end] = values
        if self.host is not self.req_to_token:
            # From pageable memory a non-blocking copy is staged at once: the host may reuse `values`.
            self.req_to_token[row, start:end].copy_(values, non_blocking=True)

    def write_positions(self, rows: List[int], positions: List[int], slots: torch.Tensor) -> None:
        """Position positions[i] of request row rows[i] holds slots[i], for every i (a decode step)."""
        r, p = torch.tensor(rows, dtype=torch.int64), torch.tensor(positions, dtype=torch.int64)
        values = slots.to("cpu", torch.int32)
        self.host[r, p] = values
        if self.host is not self.req_to_token:
            dev = lambda t: t.to(self.req_to_token.device, non_blocking=True)  # noqa: E731
            self.req_to_token[dev(r), dev(p)] = dev(values)

    def read(self, row: int, end: int, start: int = 0) -> torch.Tensor:
        """Slots at positions [start, end) of request row `row`, from the host copy (int64, a copy)."""
        return self.host[row, start:end].to(torch.int64)

    def read_positions(self, rows: List[int], positions: List[int]) -> List[int]:
        """The slot at position positions[i] of request row rows[i], for every i, from the host copy."""
        r, p = torch.tensor(rows, dtype=torch.int64), torch.tensor(positions, dtype=torch.int64)
        return self.host[r, p].tolist()

    def available_size(self) -> int:
        return len(self.free_slots)

    def alloc(self, need_size: int) -> Optional[List[int]]:
        if need_size > len(self.free_slots):
            return None
        out, self.free_slots = self.free_slots[:need_size], self.free_slots[need_size:]
        return out

    def free(self, index: int) -> None:
        self.free_slots.append(index)

    def clear(self) -> None:
        self.free_slots = list(range(self.size))

    def nbytes(self) -> int:
        return self.req_to_token.numel() * self.req_to_token.element_size()


class MHATokenToKVPool:
    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        head_num: int,
        head_dim: int,
        v_head_dim: int,
        layer_num: int,
        device: str,
        buffers: Optional[Sequence[torch.Tensor]] = None,
    ) -> None:
        """Room for `size` usable tokens (a multiple of page_size) plus one dummy page in front.

        `buffers`, when given, are 2 * layer_num tensors (K0, V0, K1, V1, ...) already shaped
        [>= size + page_size, head_num, head_dim]; otherwise they are allocated here.
        """
        self.page_size = page_size
        self.dtype = dtype
        self.store_dtype = kv_storage_dtype(dtype)
        self.head_num = head_num
        self.head_dim = head_dim
        self.v_head_dim = v_head_dim
        self.layer_num = layer_num
        self.device = device
        if buffers is None:
            slots = size + page_size
            # torch.empty, not zeros: every slot is written before it is read, and on the CPU an
            # untouched buffer costs no RAM until the cache fills.
            self.k_buffer = [
                torch.empty((slots, head_num, head_dim), dtype=self.store_dtype, device=device)
                for _ in range(layer_num)
            ]
            self.v_buffer = [
                torch.empty((slots, head_num, v_head_dim), dtype=self.store_dtype, device=device)
                for _ in range(layer_num)
            ]
        else:
            if len(buffers) != 2 * layer_num:
                raise ValueError(f"expected {2 * layer_num} KV buffers, got {len(buffers)}")
            self.k_buffer = list(buffers[0::2])
            self.v_buffer = list(buffers[1::2])
            if size + page_size > self.k_buffer[0].shape[0]:
                raise ValueError(f"{size} tokens do not fit in buffers of {self.k_buffer[0].shape[0]} slots")
        self._fused_store = _fused_store_module(device)

    def _view(self, buf: torch.Tensor) -> torch.Tensor:
        return buf.view(self.dtype) if self.store_dtype != self.dtype else buf

    # Every layer reads and writes at the slots the request table holds (swa_memory_pool.SWAKVPool: not so).
    has_window_pool = False

    def is_swa_layer(self, layer_id: int) -> bool:
        return False

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self._view(self.k_buffer[layer_id])

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self._view(self.v_buffer[layer_id])

    def set_kv_buffer(
        self,
        layer_id: int,
        loc: torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: Optional[float] = None,
        v_scale: Optional[float] = None,
    ) -> None:
        """Store this step's K/V rows at `loc`. With the checkpoint's KV scales (an fp8 cache only) the rows
        are stored as k / k_scale and v / v_scale; readers multiply by the same scales."""
        if k_scale is not None or v_scale is not None:
            if self.dtype not in FP8_KV_DTYPES:
                raise ValueError(f"KV scales apply to an fp8 KV cache; this one is {self.dtype}")
            cache_k = scaled_to_kv_dtype(cache_k, 1.0 if k_scale is None else k_scale, self.dtype)
            cache_v = scaled_to_kv_dtype(cache_v, 1.0 if v_scale is None else v_scale, self.dtype)
        if cache_k.dtype != self.dtype:
            cache_k = cache_k.to(self.dtype)
            cache_v = cache_v.to(self.dtype)
        if self.store_dtype != self.dtype:
            cache_k = cache_k.view(self.store_dtype)
            cache_v = cache_v.view(self.store_dtype)
        k_buf, v_buf = self.k_buffer[layer_id], self.v_buffer[layer_id]
        fused = self._fused_store
        if fused is not None and fused.can_store_kv_fused(cache_k, cache_v, k_buf, v_buf):
            fused.store_kv(cache_k, cache_v, k_buf, v_buf, loc)  # one kernel instead of two index_puts
            return
        k_buf[loc] = cache_k
        v_buf[loc] = cache_v

    def fused_store_buffers(
        self, layer_id: int, k: torch.Tensor, v: torch.Tensor
    ) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """The layer's (K, V) buffers when a kernel may write k/v ([T, H, D] views) into them as they
        are (CUDA, pool dtype == activation dtype, contiguous rows); else None (use set_kv_buffer)."""
        k_buf, v_buf = self.k_buffer[layer_id], self.v_buffer[layer_id]
        fused = self._fused_store
        if fused is None or self.store_dtype != self.dtype or not fused.can_store_kv_fused(k, v, k_buf, v_buf):
            return None
        return k_buf, v_buf

    def buffers(self) -> List[torch.Tensor]:
        """Every tensor of the pool (as stored)."""
        return self.k_buffer + self.v_buffer

    def release_buffers(self) -> None:
        """Drop the tensors (a VMM arena may only be unmapped after this)."""
        self.k_buffer = []
        self.v_buffer = []


class MLATokenToKVPool:
    """Multi-head latent attention's cache: per layer and token one row of ``kv_lora_rank`` latent values
    (c_kv, after kv_a_layernorm) followed by ``qk_rope_head_dim`` values of the rotated key shared by all
    heads. Keys and values of every head are linear maps of that row (kv_b_proj), so nothing else is kept:
    576 values per token and layer for DeepSeek-V3 instead of 128 heads x (192 + 128).

    The interface the attention backends use is the MHA pool's: ``get_key_buffer`` is the whole row
    [slots, 1, kv_lora + rope], ``get_value_buffer`` its first kv_lora columns (a strided view: the
    absorbed attention's values are the latent itself), ``set_kv_buffer`` stores a whole row.
    """

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        layer_num: int,
        device: str,
        buffers: Optional[Sequence[torch.Tensor]] = None,
    ) -> None:
        """Room for `size` usable tokens plus the dummy page; `buffers`, when given, are layer_num tensors
        already shaped [>= size + page_size, 1, kv_lora_rank + qk_rope_head_dim]."""
        self.page_size = page_size
        self.dtype = dtype
        self.store_dtype = kv_storage_dtype(dtype)
        self.kv_lora_rank = kv_lora_rank
        self.qk_rope_head_dim = qk_rope_head_dim
        self.row_dim = kv_lora_rank + qk_rope_head_dim
        self.layer_num = layer_num
        self.device = device
        if buffers is None:
            slots = size + page_size
            self.kv_buffer = [
                torch.empty((slots, 1, self.row_dim), dtype=self.store_dtype, device=device) for _ in range(layer_num)
            ]
        else:
            if len(buffers) != layer_num:
                raise ValueError(f"expected {layer_num} latent KV buffers, got {len(buffers)}")
            self.kv_buffer = list(buffers)
            if size + page_size > self.kv_buffer[0].shape[0]:
                raise ValueError(f"{size} tokens do not fit in buffers of {self.kv_buffer[0].shape[0]} slots")

    def _view(self, buf: torch.Tensor) -> torch.Tensor:
        return buf.view(self.dtype) if self.store_dtype != self.dtype else buf

    has_window_pool = False  # the MHA pool's interface: latent rows have no sliding-window layers

    def is_swa_layer(self, layer_id: int) -> bool:
        return False

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """[slots, 1, kv_lora_rank + qk_rope_head_dim]: latent then rotated key, in the KV dtype."""
        return self._view(self.kv_buffer[layer_id])

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """[slots, 1, kv_lora_rank]: the latent part of each row (a view)."""
        return self.get_key_buffer(layer_id)[..., : self.kv_lora_rank]

    def set_kv_buffer(
        self, layer_id: int, loc: torch.Tensor, cache_k: torch.Tensor, cache_v: Optional[torch.Tensor] = None
    ) -> None:
        """Store whole rows: `cache_k` [T, 1, kv_lora + rope] (`cache_v` is part of it and ignored)."""
        self.kv_buffer[layer_id][loc] = self._stored(cache_k.reshape(-1, 1, self.row_dim))

    def set_mla_kv_buffer(self, layer_id: int, loc: torch.Tensor, latent: torch.Tensor, k_rope: torch.Tensor) -> None:
        """Store `latent` [T, kv_lora] and `k_rope` [T, rope] as the rows at `loc`. On the GPU, rows already in
        the cache's dtype go in one triton kernel (a decode layer's cat and index_put were two)."""
        buf = self.kv_buffer[layer_id]
        if latent.is_cuda and latent.dtype == k_rope.dtype == buf.dtype and latent.stride(-1) == k_rope.stride(-1) == 1:
            from sglang.srt.mem_cache.latent_store import store_latent_rows

            store_latent_rows(buf, loc, latent, k_rope)
            return
        self.set_kv_buffer(layer_id, loc, torch.cat([latent, k_rope], dim=-1))

    def _stored(self, rows: torch.Tensor) -> torch.Tensor:
        if rows.dtype != self.dtype:
            rows = rows.to(self.dtype)
        return rows.view(self.store_dtype) if self.store_dtype != self.dtype else rows

    def fused_store_buffers(
        self, layer_id: int, k_rope: torch.Tensor, latent: torch.Tensor
    ) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """The MHA pool's hook for rotary to store this step's rows itself (``models/utils.py``): the layer's rope
        columns [slots, rope] (where the rotated key goes, as K) and latent columns [slots, kv_lora] (where the
        normed latent goes, as V), views of its rows; None where the rows must go through ``set_mla_kv_buffer``
        (a cache dtype other than the activations', e.g. fp8, or rows not contiguous)."""
        buf = self.kv_buffer[layer_id][:, 0]
        if self.store_dtype != self.dtype or not (buf.dtype == k_rope.dtype == latent.dtype):
            return None
        if k_rope.stride(-1) != 1 or latent.stride(-1) != 1:
            return None
        return buf[:, self.kv_lora_rank :], buf[:, : self.kv_lora_rank]

    def buffers(self) -> List[torch.Tensor]:
        return list(self.kv_buffer)

    def release_buffers(self) -> None:
        self.kv_buffer = []
