"""KV-cache arena on CUDA virtual memory management (VMM), driven through cuda.bindings.driver.

CUDA graphs bake in addresses, yet the KV pool can only be sized after capture. So each KV buffer
is *reserved* as a virtual range, only its first granule is backed (slot 0, where padded graph
entries write), graphs are captured over those addresses, then ``map_to`` backs as much of every
range as the measured free memory allows: same addresses, graphs stay valid. Pure Python, so TP
ranks never race on a build. Before driver calls the arena runs ``torch.cuda.synchronize(device)``
(creates torch's primary context and makes it current) and calls under ``torch.cuda.device``.
Tensors from ``tensor()`` keep the arena object alive (GC never unmaps under them), but release()
frees memory regardless: only once no tensor or CUDA graph uses the arena.

Lendable tail (elastic KT prefill slot): the call of ``map_to`` that sets the pool's final size may
back the last ``tail_bytes_per_buffer`` of every buffer with handles of their own. ``lend_tail()``
moves those handles out of the KV ranges into one separate slot range (buffer 0's tail first, then
buffer 1's, ...), ``return_tail()`` moves them back: only cuMemUnmap/cuMemMap/cuMemSetAccess, no
cuMemCreate/cuMemRelease, and no KV address moves (graphs stay valid; they must not touch the tail
while it is lent). The physical pages keep their bytes across both moves.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

logger = logging.getLogger(__name__)

# Above this a grow is split into several physical handles; a create failing with OOM is retried
# in halves down to the minimum, in case it was fragmentation rather than real exhaustion.
DEFAULT_MAX_HANDLE_BYTES = 16 << 30
DEFAULT_MIN_HANDLE_BYTES = 1 << 30


class VMMError(RuntimeError):
    """A CUDA driver call failed: ``func`` and ``error_name`` say which and why."""

    def __init__(self, func: str, error_name: str, code: int):
        super().__init__(f"{func} failed: {error_name}")
        self.func, self.error_name, self.code = func, error_name, code


class VMMOutOfMemory(VMMError):
    """Not enough physical GPU memory (CUDA_ERROR_OUT_OF_MEMORY); the arena was left unchanged."""


def _check(drv: Any, func: str, result: Any) -> Any:
    """Raise unless a driver call's CUresult (first item) is CUDA_SUCCESS; return the rest."""
    err, rest = result[0], result[1:]
    if err == drv.CUresult.CUDA_SUCCESS:
        return rest[0] if len(rest) == 1 else (rest or None)
    try:
        name = drv.cuGetErrorName(err)[1].decode()  # (CUresult, bytes)
    except Exception:
        name = getattr(err, "name", None) or f"CUresult {int(err)}"
    cls = VMMOutOfMemory if err == drv.CUresult.CUDA_ERROR_OUT_OF_MEMORY else VMMError
    raise cls(func, name, int(err))


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def vmm_supported(device_index: int, driver: Any = None) -> tuple[bool, str]:
    """(True, "") when cuda-bindings imports and the device supports VMM, else (False, reason)."""
    if driver is None:
        try:
            from cuda.bindings import driver  # lazy: absent on CPU-only machines
        except ImportError as e:
            return False, f"cuda-bindings is not installed ({e}); pip install cuda-bindings"
    drv = driver
    try:
        _check(drv, "cuInit", drv.cuInit(0))
        dev = _check(drv, "cuDeviceGet", drv.cuDeviceGet(device_index))
        attr = drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
        ok = _check(drv, "cuDeviceGetAttribute", drv.cuDeviceGetAttribute(attr, dev))
    except Exception as e:  # e.g. RuntimeError("Failed to dlopen libcuda.so.1") without a driver
        return False, f"CUDA driver unusable for device {device_index}: {e}"
    if not ok:
        return False, f"device {device_index} does not support CUDA virtual memory management"
    return True, ""


def _device_allocation_prop(drv: Any, device_index: int) -> Any:
    prop = drv.CUmemAllocationProp()
    prop.type = drv.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = device_index
    return prop


def allocation_granularity(device_index: int, driver: Any = None) -> int:
    """The physical granularity (bytes) VMM maps device memory in: a fact of the device, read once at start-up
    so the planner has it before the arena exists."""
    if driver is None:
        from cuda.bindings import driver
    drv = driver
    _check(drv, "cuInit", drv.cuInit(0))
    minimum = drv.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
    prop = _device_allocation_prop(drv, device_index)
    return int(_check(drv, "cuMemGetAllocationGranularity", drv.cuMemGetAllocationGranularity(prop, minimum)))


@dataclass
class _PhysicalHandle:
    """One cuMemCreate allocation and its slices mapped into buffers."""

    handle: Any
    size: int
    mappings: list[tuple[int, int]] = field(default_factory=list)  # (va, size) per cuMemMap


@dataclass
class _TailPiece:
    """One tail handle: mapped whole at ``kv_va`` (in its buffer's range) or at ``slot_va`` (lent)."""

    rec: _PhysicalHandle
    buffer_index: int
    kv_va: int
    slot_va: int


class VirtualKVArena:
    """``num_buffers`` reserved ranges whose physically backed prefixes grow together."""

    def __init__(
        self,
        num_buffers: int,
        reserve_bytes_per_buffer: int,
        device_index: int,
        driver: Any = None,
        *,
        initial_bytes_per_buffer: Optional[int] = None,  # None: one granule (slot 0)
        synchronize: Optional[Callable[[], None]] = None,
        max_handle_bytes: int = DEFAULT_MAX_HANDLE_BYTES,
        min_handle_bytes: int = DEFAULT_MIN_HANDLE_BYTES,
    ):
        # Bookkeeping first, so release()/__del__ work on a half-built arena.
        self._ranges: list[tuple[int, int]] = []  # (base va, reserved size) per buffer
        self._handles: list[_PhysicalHandle] = []  # the body: never moves
        self._tail: list[_TailPiece] = []  # the lendable tail, buffer by buffer, in address order
        self._slot_range: Optional[tuple[int, int]] = None  # (base va, size) the tail is lent into
        self._tail_bytes = 0
        self._tail_lent = False
        self._tail_broken = False  # a failed move could not be undone: the tail's mappings are unknown
        self._released = False
        self.num_buffers, self.device_index = num_buffers, device_index
        self.mapped_bytes_per_buffer = 0
        self.lend_count = self.return_count = 0
        self.last_lend_ms: Optional[float] = None  # driver time of the last lend/return (after the sync)
        self.last_return_ms: Optional[float] = None
        if num_buffers <= 0 or reserve_bytes_per_buffer <= 0:
            raise ValueError(f"bad sizes: {num_buffers} buffers x {reserve_bytes_per_buffer} B")
        if driver is None:
            from cuda.bindings import driver  # lazy: optional, absent on CPU-only machines
        self._drv = drv = driver
        self._sync_fn = synchronize  # None: torch.cuda.synchronize (no bound method: no cycle)
        self._sync()  # creates torch's primary context on the device before any driver call
        with self._device_scope():
            _check(drv, "cuInit", drv.cuInit(0))
            self._prop = prop = _device_allocation_prop(drv, device_index)
            minimum = drv.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
            self.granularity: int = int(
                _check(drv, "cuMemGetAllocationGranularity", drv.cuMemGetAllocationGranularity(prop, minimum))
            )
            g = self.granularity
            self.reserved_bytes_per_buffer = _round_up(reserve_bytes_per_buffer, g)
            self.max_handle_bytes = max(g, _round_up(max_handle_bytes, g))
            self.min_handle_bytes = max(g, _round_up(min_handle_bytes, g))
            self._access = access = drv.CUmemAccessDesc()
            access.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
            access.location.id = device_index
            access.flags = drv.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
            try:
                for _ in range(num_buffers):
                    ptr = _check(
                        drv, "cuMemAddressReserve", drv.cuMemAddressReserve(self.reserved_bytes_per_buffer, 0, 0, 0)
                    )
                    self._ranges.append((int(ptr), self.reserved_bytes_per_buffer))
                initial = g if initial_bytes_per_buffer is None else initial_bytes_per_buffer
                if initial > 0:
                    self.map_to(initial)
            except BaseException:
                with contextlib.suppress(Exception):  # keep the original error (cleanup logs)
                    self.release()
                raise

    def _sync(self) -> None:
        if self._sync_fn is not None:
            self._sync_fn()
        elif torch.cuda.is_available():
            torch.cuda.synchronize(self.device_index)

    def _device_scope(self) -> contextlib.AbstractContextManager:
        # This device's primary context current for driver calls (a fake driver needs none).
        if torch.cuda.is_available():
            return torch.cuda.device(self.device_index)
        return contextlib.nullcontext()

    def _ensure_live(self) -> None:
        if self._released:
            raise RuntimeError("VirtualKVArena was released")

    @property
    def buffer_ptrs(self) -> list[int]:
        return [base for base, _ in self._ranges]

    @property
    def num_handles(self) -> int:
        """Live physical handles: the body's and the tail's."""
        return len(self._handles) + len(self._tail)

    @property
    def tail_bytes_per_buffer(self) -> int:
        """Bytes at the end of every buffer's mapped part that can be lent (0: no tail)."""
        return self._tail_bytes

    @property
    def tail_lent(self) -> bool:
        """True while the tail is mapped into the slot range (and absent from the KV ranges)."""
        return self._tail_lent

    @property
    def slot_ptr(self) -> int:
        """Base address of the slot range (0 without a tail). Mapped only while the tail is lent."""
        return self._slot_range[0] if self._slot_range else 0

    @property
    def slot_bytes(self) -> int:
        """num_buffers * tail_bytes_per_buffer (0 without a tail)."""
        return self._slot_range[1] if self._slot_range else 0

    @property
    def kv_mapped_bytes_per_buffer(self) -> int:
        """What is mapped in each KV range now: mapped_bytes_per_buffer less the tail while lent."""
        return self.mapped_bytes_per_buffer - (self._tail_bytes if self._tail_lent else 0)

    # --------------------------------------------------------------------------- growing
    def map_to(self, bytes_per_buffer: int, tail_bytes_per_buffer: int = 0) -> int:
        """Back at least ``bytes_per_buffer`` (rounded up to the granularity) of every buffer and
        return the new mapped size. Only the delta gets memory: per buffer one handle of the delta
        (split above max_handle_bytes), because cuMemMap only maps a handle from offset 0 (a
        non-zero offset is CUDA_ERROR_NOT_SUPPORTED, seen on the H200), so one handle cannot back
        several buffers. Any failure undoes this call, then raises VMMOutOfMemory / VMMError.
        Synchronizes the device first (also binds its context): never call it during capture.

        ``tail_bytes_per_buffer`` > 0 (a multiple of the granularity, inside this call's delta)
        makes this the final size: the last that many bytes of every buffer get handle(s) of their
        own, apart from the body's, so ``lend_tail`` can move them whole, and the slot range
        (num_buffers * tail bytes) is reserved. Afterwards map_to can no longer grow the arena
        (ValueError); a call that asks for no more than is mapped stays a no-op."""
        self._ensure_live()
        g = self.granularity
        target = _round_up(max(bytes_per_buffer, 0), g)
        tail = tail_bytes_per_buffer
        if target > self.reserved_bytes_per_buffer:
            raise ValueError(
                f"map_to({bytes_per_buffer}) needs {target} bytes per buffer, beyond "
                f"the {self.reserved_bytes_per_buffer} bytes reserved per buffer"
            )
        old = self.mapped_bytes_per_buffer
        if self._tail_bytes:  # the final size is set: the tail must stay the last bytes
            if target <= old and tail in (0, self._tail_bytes):
                return old
            raise ValueError(
                f"map_to({bytes_per_buffer}, {tail}): the size was final at {old} bytes per buffer "
                f"with a {self._tail_bytes}-byte tail"
            )
        if tail < 0 or tail % g:
            raise ValueError(f"tail_bytes_per_buffer={tail} is not a non-negative multiple of the granularity {g}")
        if not tail and target <= old:
            return old
        if tail > target - old:
            raise ValueError(
                f"a {tail}-byte tail does not fit in the {max(target - old, 0)} bytes per buffer this call maps "
                f"(mapped {old}, target {target}): the tail needs handles of its own"
            )
        self._sync()
        drv, body = self._drv, target - tail - old
        new_body: list[_PhysicalHandle] = []
        new_tail: list[_TailPiece] = []
        slot: Optional[tuple[int, int]] = None  # (base va, size), reserved first so a failure frees it
        slot_base = 0
        with self._device_scope():
            try:
                if tail:
                    size = self.num_buffers * tail
                    slot_base = int(_check(drv, "cuMemAddressReserve", drv.cuMemAddressReserve(size, 0, 0, 0)))
                    slot = (slot_base, size)
                chunk = self.max_handle_bytes
                for b, (base, _) in enumerate(self._ranges):
                    chunk = self._back(base + old, body, chunk, new_body)
                    if tail:
                        recs: list[_PhysicalHandle] = []
                        try:
                            chunk = self._back(base + target - tail, tail, chunk, recs)
                        finally:  # recorded even when a later handle fails, so the rollback frees them
                            new_tail += self._tail_pieces(b, base + target - tail, slot_base + b * tail, recs)
            except BaseException:
                errors = self._free_handles(new_body + [p.rec for p in new_tail])  # best effort; logged
                if slot is not None:
                    self._attempt(errors, "cuMemAddressFree", *slot)
                raise
        self._handles.extend(new_body)
        self._tail, self._slot_range, self._tail_bytes = new_tail, slot, tail
        self.mapped_bytes_per_buffer = target
        return target

    def _back(self, va: int, size: int, chunk: int, out: list[_PhysicalHandle]) -> int:
        """Create, map and open (read-write) handles over [va, va + size), appending each to ``out``
        as soon as it exists. Returns the handle size to go on with: a create failing with OOM is
        retried in halves down to min_handle_bytes, and the smaller size sticks."""
        drv, pos = self._drv, 0
        while pos < size:
            n = min(chunk, size - pos)
            try:
                handle = _check(drv, "cuMemCreate", drv.cuMemCreate(n, self._prop, 0))
            except VMMOutOfMemory:
                if n <= self.min_handle_bytes:
                    raise
                chunk = _round_up(n // 2, self.granularity)  # fragmentation: try smaller
                continue
            out.append(rec := _PhysicalHandle(handle, n))
            self._map(rec, va + pos)
            self._set_access(va + pos, n)
            pos += n
        return chunk

    @staticmethod
    def _tail_pieces(b: int, kv_start: int, slot_start: int, recs: list[_PhysicalHandle]) -> list[_TailPiece]:
        """Buffer ``b``'s tail handles, which lie end to end from kv_start, and where each goes when lent."""
        pieces, pos = [], 0
        for rec in recs:
            pieces.append(_TailPiece(rec, b, kv_start + pos, slot_start + pos))
            pos += rec.size
        return pieces

    # ------------------------------------------------------------------- driver steps
    def _map(self, rec: _PhysicalHandle, va: int) -> None:
        """Map the whole of ``rec`` at ``va`` (offset 0: the only offset the H200 accepts)."""
        _check(self._drv, "cuMemMap", self._drv.cuMemMap(va, rec.size, 0, rec.handle, 0))
        rec.mappings.append((va, rec.size))

    def _unmap(self, rec: _PhysicalHandle, va: int) -> None:
        _check(self._drv, "cuMemUnmap", self._drv.cuMemUnmap(va, rec.size))
        rec.mappings.remove((va, rec.size))

    def _set_access(self, va: int, size: int) -> None:
        """Read-write for this device over [va, va + size): whole mappings, one or several end to end."""
        _check(self._drv, "cuMemSetAccess", self._drv.cuMemSetAccess(va, size, [self._access], 1))

    # ----------------------------------------------------------------- lending the tail
    def lend_tail(self) -> float:
        """Move the tail out of the KV ranges into the slot range: synchronize, then per buffer (in
        order) and per tail handle unmap it from the KV range and map it at slot_ptr + buffer_index *
        tail_bytes_per_buffer (+ its offset in the tail), then cuMemSetAccess on each handle where it now
        is. The bytes move with the pages. On a driver failure every step is undone (the arena as
        before) and VMMError is raised. Returns the driver time in ms (also ``last_lend_ms``).
        The KV tail must be unused (no kernel, graph or allocator slot touches it) until return_tail."""
        self._check_tail(lent=False)
        ms = self._move_tail(to_slot=True)
        self._tail_lent, self.last_lend_ms = True, ms
        self.lend_count += 1
        return ms

    def return_tail(self) -> float:
        """The reverse of lend_tail: synchronize, per tail handle unmap it from the slot range and map
        it back at its KV address, then cuMemSetAccess on each handle there. Rolled back on a
        failure (VMMError). Returns the driver time in ms (also ``last_return_ms``). Tensors from
        slot_tensor() must no longer be used: their addresses are unmapped afterwards."""
        self._check_tail(lent=True)
        ms = self._move_tail(to_slot=False)
        self._tail_lent, self.last_return_ms = False, ms
        self.return_count += 1
        return ms

    def _check_tail(self, lent: bool) -> None:
        self._ensure_live()
        if not self._tail_bytes:
            raise RuntimeError("VirtualKVArena has no tail: map_to(..., tail_bytes_per_buffer=...) first")
        if self._tail_broken:
            raise RuntimeError("VirtualKVArena's tail mappings are unknown after a failed rollback; release it")
        if self._tail_lent != lent:
            raise RuntimeError(f"the tail is {'already' if self._tail_lent else 'not'} lent")

    def _move_tail(self, to_slot: bool) -> float:
        """Move every tail handle from its KV address to its slot address (or back), then open the
        destination. Undone on any failure. Returns the time of the driver calls in ms."""
        self._sync()  # nothing in flight may read the pages while they move
        # Access is set per handle, where it was mapped: one call per mapping is what the H200 has shown to
        # work (map_to does the same); a single call spanning several mappings is allowed by the CUDA docs only.
        dst_ranges = [((p.slot_va if to_slot else p.kv_va), p.rec.size) for p in self._tail]
        moved: list[tuple[_PhysicalHandle, int, int]] = []  # (rec, src, dst): unmapped from src
        start = time.perf_counter()
        with self._device_scope():
            try:
                for p in self._tail:
                    src, dst = (p.kv_va, p.slot_va) if to_slot else (p.slot_va, p.kv_va)
                    self._unmap(p.rec, src)
                    moved.append((p.rec, src, dst))
                    self._map(p.rec, dst)
                for va, size in dst_ranges:
                    self._set_access(va, size)
            except BaseException:
                self._undo_moves(moved)
                raise
        return (time.perf_counter() - start) * 1e3

    def _undo_moves(self, moved: list[tuple[_PhysicalHandle, int, int]]) -> None:
        """Put every moved handle back at its source, read-write. Best effort: a failure here leaves
        the tail's state unknown, so the arena refuses further moves (release() still frees it all,
        from what each handle's ``mappings`` records)."""
        errors: list[Exception] = []
        for rec, src, dst in reversed(moved):
            try:
                if (dst, rec.size) in rec.mappings:
                    self._unmap(rec, dst)
                self._map(rec, src)
                self._set_access(src, rec.size)
            except Exception as e:
                logger.error("VirtualKVArena: undoing a tail move failed: %s", e)
                errors.append(e)
        if errors:
            self._tail_broken = True

    def _attempt(self, errors: list[Exception], func: str, *args: Any) -> None:
        """Teardown step that records a failure instead of stopping the teardown."""
        try:
            _check(self._drv, func, getattr(self._drv, func)(*args))
        except Exception as e:
            logger.warning("VirtualKVArena: %s", e)
            errors.append(e)

    def _free_handles(self, handles: list[_PhysicalHandle]) -> list[Exception]:
        """Unmap every slice of ``handles``, then release them; keeps going past failures."""
        errors: list[Exception] = []
        for rec in reversed(handles):
            for va, n in reversed(rec.mappings):
                self._attempt(errors, "cuMemUnmap", va, n)
            rec.mappings.clear()
        for rec in reversed(handles):
            self._attempt(errors, "cuMemRelease", rec.handle)
        return errors

    # -------------------------------------------------------------------------- tensors
    def _tensor_at(self, ptr: int, nbytes: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        """A CUDA tensor over [ptr, ptr + nbytes): built as uint8 via __cuda_array_interface__, then
        viewed as ``dtype`` (bf16/fp8 have no numpy typestr)."""
        cai = {"version": 3, "shape": (nbytes,), "typestr": "|u1", "strides": None, "data": (ptr, False)}
        # torch keeps the exporter alive as long as the tensor, and the exporter keeps the arena.
        # An explicit device: some torch versions otherwise .to() the default (CPU) device.
        t = torch.as_tensor(
            types.SimpleNamespace(__cuda_array_interface__=cai, arena=self),
            device=torch.device("cuda", self.device_index),
        )
        if t.is_cuda and t.data_ptr() != ptr:
            raise RuntimeError(f"torch copied the arena range instead of viewing it ({t.device})")
        return t.view(dtype).view(shape)

    def tensor(self, buffer_index: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        """A CUDA tensor over buffer ``buffer_index``'s reserved range; it may extend past the
        mapped part (touch only what is mapped). Built as uint8 via __cuda_array_interface__,
        then viewed as ``dtype`` (bf16/fp8 have no numpy typestr). The caller owns it."""
        self._ensure_live()
        if not 0 <= buffer_index < self.num_buffers:
            raise IndexError(f"buffer_index {buffer_index} not in [0, {self.num_buffers})")
        shape = tuple(int(s) for s in shape)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > self.reserved_bytes_per_buffer:
            raise ValueError(
                f"tensor of {nbytes} bytes exceeds the {self.reserved_bytes_per_buffer} bytes reserved per buffer"
            )
        if self.kv_mapped_bytes_per_buffer == 0:  # torch asks the driver where the pointer lives
            raise RuntimeError("map at least one granule before making tensors")
        return self._tensor_at(self._ranges[buffer_index][0], nbytes, dtype, shape)

    def slot_tensor(self, dtype: torch.dtype = torch.uint8, shape: Optional[tuple[int, ...]] = None) -> torch.Tensor:
        """A CUDA tensor over the slot range while the tail is lent: buffer 0's tail bytes first, then
        buffer 1's, ... ``shape`` None: flat, slot_bytes // itemsize elements; else at most slot_bytes.
        Valid only until return_tail() (the range is unmapped then)."""
        self._ensure_live()
        if not self._tail_lent:
            raise RuntimeError("slot_tensor() needs the tail lent (lend_tail() first)")
        shape = (self.slot_bytes // dtype.itemsize,) if shape is None else tuple(int(s) for s in shape)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > self.slot_bytes:
            raise ValueError(f"slot tensor of {nbytes} bytes exceeds the {self.slot_bytes}-byte slot range")
        return self._tensor_at(self.slot_ptr, nbytes, dtype, shape)

    # ------------------------------------------------------------------------- teardown
    def release(self) -> None:
        """Free everything: synchronize -> unmap every slice (body, and the tail wherever it is
        mapped: KV ranges or slot range) -> release every handle -> free every address range (the
        slot range last). Idempotent. Call only once no tensor or CUDA graph uses the arena."""
        was_released, self._released = self._released, True
        if was_released or not (self._ranges or self._handles or self._tail or self._slot_range):
            return
        errors: list[Exception] = []
        try:
            self._sync()
        except Exception as e:  # e.g. a sticky CUDA error: still give the memory back
            errors.append(e)
        ranges = self._ranges + ([self._slot_range] if self._slot_range else [])
        with self._device_scope():
            errors += self._free_handles(self._handles + [p.rec for p in self._tail])
            for base, size in ranges:
                self._attempt(errors, "cuMemAddressFree", base, size)
        self._handles, self._ranges, self._tail, self._slot_range = [], [], [], None
        self.mapped_bytes_per_buffer = self._tail_bytes = 0
        self._tail_lent = False
        if errors:
            raise errors[0]

    def __del__(self) -> None:
        with contextlib.suppress(BaseException):  # never raise from __del__ (e.g. at shutdown)
            self.release()
