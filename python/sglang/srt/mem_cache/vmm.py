"""KV-cache arena on CUDA virtual memory management (VMM), driven through cuda.bindings.driver.

CUDA graphs bake in addresses, yet the KV pool can only be sized after capture. So each KV buffer
is *reserved* as a virtual range, only its first granule is backed (slot 0, where padded graph
entries write), graphs are captured over those addresses, then ``map_to`` backs as much of every
range as the measured free memory allows: same addresses, graphs stay valid. Pure Python, so TP
ranks never race on a build. Before driver calls the arena runs ``torch.cuda.synchronize(device)``
(creates torch's primary context and makes it current) and calls under ``torch.cuda.device``.
Tensors from ``tensor()`` keep the arena object alive (GC never unmaps under them), but release()
frees memory regardless: only once no tensor or CUDA graph uses the arena.
"""

from __future__ import annotations

import contextlib
import logging
import math
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


@dataclass
class _PhysicalHandle:
    """One cuMemCreate allocation and its slices mapped into buffers."""

    handle: Any
    size: int
    mappings: list[tuple[int, int]] = field(default_factory=list)  # (va, size) per cuMemMap


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
        self._handles: list[_PhysicalHandle] = []
        self._released = False
        self.num_buffers, self.device_index = num_buffers, device_index
        self.mapped_bytes_per_buffer = 0
        if num_buffers <= 0 or reserve_bytes_per_buffer <= 0:
            raise ValueError(f"bad sizes: {num_buffers} buffers x {reserve_bytes_per_buffer} B")
        if driver is None:
            from cuda.bindings import driver  # lazy: optional, absent on CPU-only machines
        self._drv = drv = driver
        self._sync_fn = synchronize  # None: torch.cuda.synchronize (no bound method: no cycle)
        self._sync()  # creates torch's primary context on the device before any driver call
        with self._device_scope():
            _check(drv, "cuInit", drv.cuInit(0))
            self._prop = prop = drv.CUmemAllocationProp()
            prop.type = drv.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
            prop.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
            prop.location.id = device_index
            minimum = drv.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
            self.granularity: int = int(
                _check(drv, "cuMemGetAllocationGranularity", drv.cuMemGetAllocationGranularity(prop, minimum))
            )
            g = self.granularity
            self.reserved_bytes_per_buffer = _round_up(reserve_bytes_per_buffer, g)
            self.max_handle_bytes = max(g, _round_up(max_handle_bytes, g))
            self.min_handle_bytes = max(g, _round_up(min_handle_bytes, g))
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
        return len(self._handles)

    def map_to(self, bytes_per_buffer: int) -> int:
        """Back at least ``bytes_per_buffer`` (rounded up to the granularity) of every buffer and
        return the new mapped size. Only the delta gets memory: per buffer one handle of the delta
        (split above max_handle_bytes), because cuMemMap only maps a handle from offset 0 (a
        non-zero offset is CUDA_ERROR_NOT_SUPPORTED, seen on the H200), so one handle cannot back
        several buffers. Any failure undoes this call, then raises VMMOutOfMemory / VMMError.
        Synchronizes the device first (also binds its context): never call it during capture."""
        self._ensure_live()
        target = _round_up(max(bytes_per_buffer, 0), self.granularity)
        if target > self.reserved_bytes_per_buffer:
            raise ValueError(
                f"map_to({bytes_per_buffer}) needs {target} bytes per buffer, beyond "
                f"the {self.reserved_bytes_per_buffer} bytes reserved per buffer"
            )
        old = self.mapped_bytes_per_buffer
        if target <= old:
            return old
        self._sync()
        drv, delta = self._drv, target - old
        access = drv.CUmemAccessDesc()
        access.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        access.location.id = self.device_index
        access.flags = drv.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        new: list[_PhysicalHandle] = []
        with self._device_scope():
            try:
                chunk = min(self.max_handle_bytes, delta)
                for base, _ in self._ranges:
                    pos = 0
                    while pos < delta:
                        size = min(chunk, delta - pos)
                        try:
                            handle = _check(drv, "cuMemCreate", drv.cuMemCreate(size, self._prop, 0))
                        except VMMOutOfMemory:
                            if size <= self.min_handle_bytes:
                                raise
                            chunk = _round_up(size // 2, self.granularity)  # fragmentation: try smaller
                            continue
                        new.append(rec := _PhysicalHandle(handle, size))
                        va = base + old + pos
                        _check(drv, "cuMemMap", drv.cuMemMap(va, size, 0, handle, 0))
                        rec.mappings.append((va, size))
                        _check(drv, "cuMemSetAccess", drv.cuMemSetAccess(va, size, [access], 1))
                        pos += size
            except BaseException:
                self._free_handles(new)  # best effort; errors are logged
                raise
        self._handles.extend(new)
        self.mapped_bytes_per_buffer = target
        return target

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
        if self.mapped_bytes_per_buffer == 0:  # torch asks the driver where the pointer lives
            raise RuntimeError("map at least one granule before making tensors")
        ptr = self._ranges[buffer_index][0]
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

    def release(self) -> None:
        """Free everything: synchronize -> unmap every slice -> release every handle -> free every
        address range. Idempotent. Call only once no tensor or CUDA graph uses the arena."""
        was_released, self._released = self._released, True
        if was_released or not (self._ranges or self._handles):
            return
        errors: list[Exception] = []
        try:
            self._sync()
        except Exception as e:  # e.g. a sticky CUDA error: still give the memory back
            errors.append(e)
        with self._device_scope():
            errors += self._free_handles(self._handles)
            for base, size in self._ranges:
                self._attempt(errors, "cuMemAddressFree", base, size)
        self._handles, self._ranges = [], []
        self.mapped_bytes_per_buffer = 0
        if errors:
            raise errors[0]

    def __del__(self) -> None:
        with contextlib.suppress(BaseException):  # never raise from __del__ (e.g. at shutdown)
            self.release()
