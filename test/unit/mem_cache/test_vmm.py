from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="per-commit-cpu")

# VirtualKVArena against a fake cuda.bindings.driver that records calls and checks the VMM rules
# the real driver enforces (granular sizes, exact unmaps, no frees under live mappings, and
# cuMemMap only from offset 0 of a handle: CUDA_ERROR_NOT_SUPPORTED otherwise, as on the H200).

import ast
import enum
import sys
from typing import Any, Optional

import pytest
import torch

from sglang.srt.mem_cache import vmm
from sglang.srt.mem_cache.vmm import VirtualKVArena, VMMError, VMMOutOfMemory, vmm_supported

MiB = 1 << 20
G = 2 * MiB  # the H200's granularity


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_OUT_OF_MEMORY = 2
    CUDA_ERROR_NOT_SUPPORTED = 801


class CUmemAllocationType(enum.IntEnum):
    CU_MEM_ALLOCATION_TYPE_PINNED = 1


class CUmemLocationType(enum.IntEnum):
    CU_MEM_LOCATION_TYPE_DEVICE = 1


class CUmemAccess_flags(enum.IntEnum):
    CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3


class CUmemAllocationGranularity_flags(enum.IntEnum):
    CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0


class CUdevice_attribute(enum.IntEnum):
    CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102


class CUmemLocation:
    def __init__(self) -> None:
        self.type, self.id = 0, 0


class CUmemAllocationProp:
    def __init__(self) -> None:
        self.type, self.location, self.requestedHandleTypes = 0, CUmemLocation(), 0


class CUmemAccessDesc:
    def __init__(self) -> None:
        self.location, self.flags = CUmemLocation(), 0


class Opaque:
    """Stands for CUdeviceptr / CUmemGenericAllocationHandle: only int() gives the value."""

    def __init__(self, value: int):
        self._value = value

    def __int__(self) -> int:
        return self._value


class FakeDriver:
    ENUMS = (
        CUresult,
        CUmemAllocationType,
        CUmemLocationType,
        CUmemAccess_flags,
        CUmemAllocationGranularity_flags,
        CUdevice_attribute,
    )
    STRUCTS = (CUmemLocation, CUmemAllocationProp, CUmemAccessDesc)

    def __init__(
        self,
        device: int = 0,
        granularity: int = G,
        physical: int = 1 << 40,
        max_create: Optional[int] = None,
        vmm_attr: int = 1,
    ):
        for cls in self.ENUMS + self.STRUCTS:
            setattr(self, cls.__name__, cls)
        self.device, self.granularity, self.free_phys = device, granularity, physical
        self.max_create, self.vmm_attr = max_create, vmm_attr
        self.log: list[tuple[str, tuple]] = []  # every call (and "synchronize"), in order
        self.names_used: set[str] = set()
        self.reserved: dict[int, int] = {}  # base -> size
        self.handles: dict[int, int] = {}  # live handle -> size
        self.created: list[int] = []
        self.maps: dict[int, tuple[int, int, int]] = {}  # va -> (size, handle, offset)
        self.access: dict[int, int] = {}  # va -> size made read-write
        self.faults: dict[str, list[tuple[int, CUresult]]] = {}
        self._next_va, self._next_handle = 0x7F00_0000_0000, 1

    def __getattribute__(self, name: str) -> Any:
        if name[:2] in ("cu", "CU"):
            object.__getattribute__(self, "names_used").add(name)
        return object.__getattribute__(self, name)

    def fail(self, func: str, code: CUresult, after: int = 0) -> None:
        """Make ``func`` return ``code`` once, after ``after`` more successful calls."""
        self.faults.setdefault(func, []).append((after, code))

    def sync(self) -> None:
        self.log.append(("synchronize", ()))

    def _call(self, name: str, args: tuple) -> Optional[CUresult]:
        self.log.append((name, args))
        faults = self.faults.get(name, [])
        for i, (after, code) in enumerate(faults):
            if after == 0:
                del faults[i]
                return code
            faults[i] = (after - 1, code)
        return None

    def calls(self, name: str) -> list[tuple]:
        return [args for n, args in self.log if n == name]

    # --- the driver API subset -----------------------------------------------------------
    def cuInit(self, flags: int) -> tuple:
        return (self._call("cuInit", (flags,)) or CUresult.CUDA_SUCCESS,)

    def cuDeviceGet(self, ordinal: int) -> tuple:
        return (self._call("cuDeviceGet", (ordinal,)) or CUresult.CUDA_SUCCESS, ordinal)

    def cuDeviceGetAttribute(self, attr: Any, dev: int) -> tuple:
        assert attr == CUdevice_attribute.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
        return (self._call("cuDeviceGetAttribute", (attr, dev)) or CUresult.CUDA_SUCCESS, self.vmm_attr)

    def cuGetErrorName(self, err: CUresult) -> tuple:
        return CUresult.CUDA_SUCCESS, CUresult(err).name.encode()

    def _check_prop(self, prop: CUmemAllocationProp) -> None:
        assert prop.type == CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        assert prop.location.type == CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        assert prop.location.id == self.device

    def cuMemGetAllocationGranularity(self, prop: CUmemAllocationProp, option: Any) -> tuple:
        self._check_prop(prop)
        assert option == CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
        err = self._call("cuMemGetAllocationGranularity", (option,))
        return (err, 0) if err else (CUresult.CUDA_SUCCESS, self.granularity)

    def cuMemAddressReserve(self, size: int, align: int, addr: int, flags: int) -> tuple:
        assert size % self.granularity == 0 and flags == 0
        if err := self._call("cuMemAddressReserve", (size, align, addr, flags)):
            return err, Opaque(0)
        base, self._next_va = self._next_va, self._next_va + size + 64 * self.granularity
        self.reserved[base] = size
        return CUresult.CUDA_SUCCESS, Opaque(base)

    def cuMemAddressFree(self, ptr: int, size: int) -> tuple:
        if err := self._call("cuMemAddressFree", (ptr, size)):
            return (err,)
        assert self.reserved[ptr] == size
        if any(ptr <= va < ptr + size for va in self.maps):  # still mapped: the driver refuses
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)
        del self.reserved[ptr]
        return (CUresult.CUDA_SUCCESS,)

    def cuMemCreate(self, size: int, prop: CUmemAllocationProp, flags: int) -> tuple:
        self._check_prop(prop)
        assert size > 0 and size % self.granularity == 0 and flags == 0
        if err := self._call("cuMemCreate", (size,)):
            return err, Opaque(0)
        if size > self.free_phys or (self.max_create and size > self.max_create):
            return CUresult.CUDA_ERROR_OUT_OF_MEMORY, Opaque(0)
        h, self._next_handle = self._next_handle, self._next_handle + 1
        self.handles[h], self.free_phys = size, self.free_phys - size
        self.created.append(h)
        return CUresult.CUDA_SUCCESS, Opaque(h)

    def cuMemRelease(self, handle: Opaque) -> tuple:
        if err := self._call("cuMemRelease", (int(handle),)):
            return (err,)
        self.free_phys += self.handles.pop(int(handle))
        return (CUresult.CUDA_SUCCESS,)

    def cuMemMap(self, ptr: int, size: int, offset: int, handle: Opaque, flags: int) -> tuple:
        h, g = int(handle), self.granularity
        assert ptr % g == 0 and size % g == 0 and offset % g == 0 and size > 0 and flags == 0
        assert h in self.handles, "mapping a released or unknown handle"
        assert any(b <= ptr and ptr + size <= b + s for b, s in self.reserved.items())
        assert all(ptr + size <= va or va + s <= ptr for va, (s, _, _) in self.maps.items())
        if err := self._call("cuMemMap", (ptr, size, offset, h)):
            return (err,)
        if offset != 0:  # "offset: currently must be zero"; the H200 driver refuses, maps nothing
            return (CUresult.CUDA_ERROR_NOT_SUPPORTED,)
        assert size <= self.handles[h], "mapping beyond the handle"
        self.maps[ptr] = (size, h, offset)
        return (CUresult.CUDA_SUCCESS,)

    def cuMemUnmap(self, ptr: int, size: int) -> tuple:
        if err := self._call("cuMemUnmap", (ptr, size)):
            return (err,)
        assert self.maps.pop(ptr)[0] == size, "cuMemUnmap must cover exactly one mapping"
        self.access.pop(ptr, None)
        return (CUresult.CUDA_SUCCESS,)

    def cuMemSetAccess(self, ptr: int, size: int, desc: list, count: int) -> tuple:
        assert count == len(desc) == 1
        d = desc[0]
        assert d.location.type == CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        assert d.location.id == self.device
        assert d.flags == CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        vas = self._whole_mappings(ptr, size)
        if err := self._call("cuMemSetAccess", (ptr, size)):
            return (err,)
        for va in vas:
            self.access[va] = self.maps[va][0]
        return (CUresult.CUDA_SUCCESS,)

    def _whole_mappings(self, ptr: int, size: int) -> list[int]:
        """The mappings that cover [ptr, ptr + size) end to end: "a fully mapped address range",
        here also made of whole mappings (stricter than the driver, so never looser)."""
        vas, pos = [], ptr
        while pos < ptr + size:
            assert pos in self.maps, f"cuMemSetAccess over an unmapped or partly mapped range at {pos:#x}"
            vas.append(pos)
            pos += self.maps[pos][0]
        assert pos == ptr + size, "cuMemSetAccess must end where a mapping ends"
        return vas


def make(n: int = 4, reserve: int = 64 * MiB, drv: Optional[FakeDriver] = None, **kw: Any):
    drv = drv or FakeDriver()
    return VirtualKVArena(n, reserve, 0, driver=drv, synchronize=drv.sync, **kw), drv


def assert_consistent(arena: VirtualKVArena, drv: FakeDriver) -> None:
    """Each buffer's [base, base + kv_mapped) is exactly covered by read-write mappings, and so is
    the slot range while the tail is lent; nothing else is mapped, the live handles are exactly the
    arena's, and each handle is mapped once, whole, from offset 0: a body handle inside its buffer's
    body, a tail handle at its KV address (or at its slot address while lent). No handle shared."""
    covered = 0
    spans = [(base, arena.kv_mapped_bytes_per_buffer) for base in arena.buffer_ptrs]
    if arena.tail_lent:
        spans.append((arena.slot_ptr, arena.slot_bytes))
    for start, length in spans:
        pos = start
        while pos < start + length:
            size = drv.maps[pos][0]
            assert drv.access[pos] == size
            pos += size
            covered += 1
        assert pos == start + length
    assert covered == len(drv.maps)
    assert len(drv.handles) == arena.num_handles
    assert all(off == 0 for _, _, off in drv.maps.values())
    mapped = {h: size for size, h, _ in drv.maps.values()}
    assert len(mapped) == len(drv.maps), "a handle mapped more than once"
    assert mapped == drv.handles, "every handle fully mapped, nothing else"
    body = arena.mapped_bytes_per_buffer - arena.tail_bytes_per_buffer
    for rec in arena._handles:
        [(va, size)] = rec.mappings
        assert drv.maps[va] == (size, int(rec.handle), 0)
        assert any(b <= va and va + size <= b + body for b in arena.buffer_ptrs)
    for piece in arena._tail:
        [(va, size)] = piece.rec.mappings
        assert va == (piece.slot_va if arena.tail_lent else piece.kv_va)
        assert drv.maps[va] == (size, int(piece.rec.handle), 0)
    assert bool(arena.slot_bytes) == bool(arena.tail_bytes_per_buffer)
    if arena.slot_bytes:
        assert arena.slot_bytes == arena.num_buffers * arena.tail_bytes_per_buffer
        assert drv.reserved[arena.slot_ptr] == arena.slot_bytes


def test_reserve_rounds_to_granularity_and_maps_first_granule():
    arena, drv = make(n=6, reserve=5 * MiB + 1)
    assert arena.granularity == G and arena.reserved_bytes_per_buffer == 6 * MiB
    assert [a[0] for a in drv.calls("cuMemAddressReserve")] == [6 * MiB] * 6
    assert arena.mapped_bytes_per_buffer == G
    assert drv.calls("cuMemCreate") == [(G,)] * 6  # slot 0: one handle per buffer
    assert len(set(drv.created)) == 6 and arena.num_handles == 6
    assert drv.calls("cuMemMap") == [(base, G, 0, h) for base, h in zip(arena.buffer_ptrs, drv.created)]
    assert drv.calls("cuMemSetAccess") == [(base, G) for base in arena.buffer_ptrs]
    assert_consistent(arena, drv)


def test_fake_driver_refuses_a_nonzero_map_offset_like_the_h200():
    drv = FakeDriver()
    base = int(drv.cuMemAddressReserve(4 * G, 0, 0, 0)[1])
    prop = drv.CUmemAllocationProp()
    prop.type = CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    err, h = drv.cuMemCreate(2 * G, prop, 0)
    assert err == CUresult.CUDA_SUCCESS
    assert drv.cuMemMap(base, G, G, h, 0) == (CUresult.CUDA_ERROR_NOT_SUPPORTED,)
    assert not drv.maps  # refused: nothing mapped
    assert drv.cuMemMap(base, G, 0, h, 0) == (CUresult.CUDA_SUCCESS,)
    assert drv.maps == {base: (G, int(h), 0)}
    with pytest.raises(VMMError, match="^cuMemMap failed: CUDA_ERROR_NOT_SUPPORTED$"):
        vmm._check(drv, "cuMemMap", drv.cuMemMap(base + G, G, G, h, 0))


def test_map_to_one_handle_per_buffer_mapped_at_offset_0():
    arena, drv = make(n=8)
    drv.log.clear()
    assert arena.map_to(9 * MiB + 1) == 10 * MiB  # rounded up to the granularity
    delta = 10 * MiB - G
    assert drv.calls("cuMemCreate") == [(delta,)] * 8  # one handle of the delta per buffer
    handles = drv.created[8:]
    assert len(handles) == len(set(handles)) == 8
    assert drv.calls("cuMemMap") == [(base + G, delta, 0, h) for base, h in zip(arena.buffer_ptrs, handles)]
    assert drv.calls("cuMemSetAccess") == [(base + G, delta) for base in arena.buffer_ptrs]
    assert [n for n, _ in drv.log] == (["synchronize"] + ["cuMemCreate", "cuMemMap", "cuMemSetAccess"] * 8)
    assert arena.num_handles == 16
    drv.log.clear()
    assert arena.mapped_bytes_per_buffer == 10 * MiB and arena.map_to(4 * MiB) == 10 * MiB
    assert drv.log == []  # nothing to grow: no driver call, no synchronize
    assert_consistent(arena, drv)


def test_map_to_splits_each_buffer_above_the_handle_cap():
    arena, drv = make(n=3, max_handle_bytes=5 * G)
    drv.log.clear()
    assert arena.map_to(13 * G) == 13 * G  # delta 12 granules per buffer -> 5, 5, 2 per buffer
    assert drv.calls("cuMemCreate") == [(5 * G,), (5 * G,), (2 * G,)] * 3
    handles = drv.created[3:]
    expected = [
        (base + lo, size, 0) for base in arena.buffer_ptrs for lo, size in ((G, 5 * G), (6 * G, 5 * G), (11 * G, 2 * G))
    ]
    assert [c[:3] for c in drv.calls("cuMemMap")] == expected
    assert [c[3] for c in drv.calls("cuMemMap")] == handles
    assert drv.calls("cuMemSetAccess") == [c[:2] for c in expected]
    assert_consistent(arena, drv)
    drv.log.clear()
    assert arena.map_to(18 * G) == 18 * G  # delta exactly the cap: one handle per buffer
    assert drv.calls("cuMemCreate") == [(5 * G,)] * 3
    assert drv.calls("cuMemMap") == [
        (base + 13 * G, 5 * G, 0, h) for base, h in zip(arena.buffer_ptrs, drv.created[-3:])
    ]
    assert arena.num_handles == 3 + 9 + 3
    assert_consistent(arena, drv)


def test_map_to_falls_back_to_smaller_handles_when_a_big_create_fails():
    arena, drv = make(n=4, drv=FakeDriver(max_create=6 * G), min_handle_bytes=G)
    drv.log.clear()
    assert arena.map_to(9 * G) == 9 * G  # delta 8 granules per buffer: 8 fails, then halves
    # the halved size sticks for the later buffers: no second failed attempt
    assert drv.calls("cuMemCreate") == [(8 * G,)] + [(4 * G,)] * 8
    assert drv.calls("cuMemMap") == [
        (base + lo, 4 * G, 0, h)
        for (base, lo), h in zip([(b, lo) for b in arena.buffer_ptrs for lo in (G, 5 * G)], drv.created[4:])
    ]
    assert_consistent(arena, drv)


def test_map_past_reservation_names_sizes():
    arena, drv = make(reserve=8 * MiB)
    with pytest.raises(ValueError, match=f"{10 * MiB}.*{8 * MiB}"):
        arena.map_to(10 * MiB)
    assert arena.map_to(8 * MiB) == 8 * MiB


@pytest.mark.parametrize(
    "func,after",
    [
        ("cuMemGetAllocationGranularity", 0),
        ("cuMemAddressReserve", 2),  # 3rd of 4 buffers
        ("cuMemCreate", 0),
        ("cuMemMap", 1),
    ],
)  # 2nd buffer's slot-0 mapping
def test_init_errors_name_function_and_leak_nothing(func, after):
    drv = FakeDriver()
    drv.fail(func, CUresult.CUDA_ERROR_NOT_SUPPORTED, after=after)
    with pytest.raises(VMMError, match=f"^{func} failed: CUDA_ERROR_NOT_SUPPORTED$"):
        make(drv=drv)
    assert not drv.reserved and not drv.handles and not drv.maps


@pytest.mark.parametrize("func,after", [("cuMemCreate", 1), ("cuMemMap", 5), ("cuMemSetAccess", 3)])
def test_map_errors_roll_back(func, after):
    arena, drv = make(n=4, max_handle_bytes=3 * G)
    arena.map_to(2 * G)
    before = (dict(drv.maps), dict(drv.handles), arena.mapped_bytes_per_buffer)
    n_created = len(drv.created)
    drv.fail(func, CUresult.CUDA_ERROR_INVALID_VALUE, after=after)
    with pytest.raises(VMMError, match=f"{func} failed: CUDA_ERROR_INVALID_VALUE") as e:
        arena.map_to(6 * G)  # delta 4 granules per buffer: handles of 3 and 1 per buffer
    assert not isinstance(e.value, VMMOutOfMemory)
    new = drv.created[n_created:]
    assert new and sorted(a[0] for a in drv.calls("cuMemRelease")) == sorted(new)
    assert (dict(drv.maps), dict(drv.handles), arena.mapped_bytes_per_buffer) == before
    assert_consistent(arena, drv)
    assert arena.map_to(6 * G) == 6 * G  # usable afterwards
    assert_consistent(arena, drv)


def test_oom_midway_leaves_arena_consistent_and_usable():
    arena, drv = make(
        n=4, max_handle_bytes=4 * G, min_handle_bytes=4 * G, drv=FakeDriver(physical=12 * G)
    )  # 4 x 1 for slot 0, 8 left
    slot0 = dict(drv.maps)
    drv.log.clear()
    with pytest.raises(VMMOutOfMemory, match="cuMemCreate failed: CUDA_ERROR_OUT_OF_MEMORY"):
        arena.map_to(4 * G)  # 3 granules per buffer: buffers 0 and 1 fit, buffer 2's cannot
    assert isinstance(VMMOutOfMemory("f", "e", 2), RuntimeError)
    ptrs = arena.buffer_ptrs
    new = drv.created[4:]
    assert drv.calls("cuMemCreate") == [(3 * G,)] * 3  # at min_handle_bytes: no halving retry
    assert drv.calls("cuMemMap") == [(ptrs[0] + G, 3 * G, 0, new[0]), (ptrs[1] + G, 3 * G, 0, new[1])]
    assert len(new) == 2 and all(h not in drv.handles for h in new)  # every new one released
    assert drv.calls("cuMemUnmap") == [(ptrs[1] + G, 3 * G), (ptrs[0] + G, 3 * G)]
    assert [a[0] for a in drv.calls("cuMemRelease")] == new[::-1]
    assert drv.maps == slot0 and arena.num_handles == 4
    assert arena.mapped_bytes_per_buffer == G and drv.free_phys == 8 * G
    assert_consistent(arena, drv)
    assert arena.map_to(3 * G) == 3 * G  # still works: 2 granules x 4 buffers fill the 8 left
    assert drv.free_phys == 0 and arena.num_handles == 8
    assert_consistent(arena, drv)


def test_release_order_and_idempotence():
    arena, drv = make(n=3, max_handle_bytes=2 * G)
    arena.map_to(4 * G)  # delta 3 granules per buffer, split 2 + 1: 3 + 6 handles in all
    assert arena.num_handles == 9
    drv.log.clear()
    arena.release()
    names = [n for n, _ in drv.log]
    assert names == ["synchronize"] + ["cuMemUnmap"] * 9 + ["cuMemRelease"] * 9 + ["cuMemAddressFree"] * 3
    assert sorted(a[0] for a in drv.calls("cuMemRelease")) == sorted(drv.created)
    assert not drv.reserved and not drv.handles and not drv.maps
    drv.log.clear()
    arena.release()
    assert drv.log == [] and arena.mapped_bytes_per_buffer == 0
    with pytest.raises(RuntimeError, match="released"):
        arena.map_to(2 * G)


def test_release_keeps_going_after_an_error_and_del_never_raises():
    arena, drv = make(n=3)
    ptrs = arena.buffer_ptrs
    drv.fail("cuMemUnmap", CUresult.CUDA_ERROR_INVALID_VALUE)
    with pytest.raises(VMMError, match="cuMemUnmap failed"):
        arena.release()
    assert len(drv.calls("cuMemAddressFree")) == 3  # kept going past the failed unmap
    assert len(drv.calls("cuMemRelease")) == 3
    assert drv.calls("cuMemUnmap")[0] == (ptrs[2], G)  # newest handle (buffer 2's) first
    assert list(drv.reserved) == [ptrs[2]] and list(drv.maps) == [ptrs[2]]  # only what it pinned
    arena2, drv2 = make(n=2)
    drv2.fail("cuMemRelease", CUresult.CUDA_ERROR_INVALID_VALUE)
    arena2.__del__()  # swallows the error
    del arena2
    assert not drv2.reserved and not drv2.maps


def test_del_releases_everything():
    arena, drv = make()
    del arena
    assert not drv.reserved and not drv.handles and not drv.maps


def test_tensor_over_the_reserved_range(monkeypatch):
    arena, drv = make(n=2, reserve=16 * MiB)
    seen = {}

    def fake_as_tensor(obj, device):
        assert device == torch.device("cuda", 0)
        seen.update(obj.__cuda_array_interface__, arena=obj.arena)
        return torch.zeros(obj.__cuda_array_interface__["shape"], dtype=torch.uint8)

    monkeypatch.setattr(torch, "as_tensor", fake_as_tensor)
    t = arena.tensor(1, torch.bfloat16, (4096, 8, 128))  # 8 MiB: may extend past the mapped part
    assert t.dtype == torch.bfloat16 and t.shape == (4096, 8, 128)
    assert seen == {
        "version": 3,
        "shape": (8 * MiB,),
        "typestr": "|u1",
        "strides": None,
        "data": (arena.buffer_ptrs[1], False),
        "arena": arena,
    }
    assert arena.tensor(0, torch.float8_e4m3fn, (16 * MiB,)).shape == (16 * MiB,)
    with pytest.raises(ValueError, match="exceeds"):
        arena.tensor(0, torch.float16, (8 * MiB + 1,))
    with pytest.raises(IndexError):
        arena.tensor(2, torch.float16, (1,))
    empty, empty_drv = make(initial_bytes_per_buffer=0)
    assert not empty_drv.handles and empty.mapped_bytes_per_buffer == 0
    with pytest.raises(RuntimeError, match="map at least one granule"):
        empty.tensor(0, torch.float16, (1,))


# ----------------------------------------------------------------------- the lendable tail
def tail_arena(n: int = 3, tail: int = 3 * G, total: int = 8 * G, **kw: Any):
    """An arena with slot 0 mapped, then grown to ``total`` per buffer with a ``tail``; log cleared."""
    arena, drv = make(n=n, **kw)
    assert arena.map_to(total, tail_bytes_per_buffer=tail) == total
    drv.log.clear()
    return arena, drv


def mapping_state(drv: FakeDriver) -> tuple:
    return dict(drv.maps), dict(drv.access), dict(drv.handles), dict(drv.reserved)


def test_map_with_a_tail_backs_it_with_handles_of_its_own():
    arena, drv = make(n=3)
    slot0 = list(drv.created)
    drv.log.clear()
    assert arena.map_to(8 * G - 1, tail_bytes_per_buffer=3 * G) == 8 * G
    ptrs = arena.buffer_ptrs
    # the slot range first, then per buffer: the body's delta (4 granules), then its tail (3)
    assert [n for n, _ in drv.log] == ["synchronize", "cuMemAddressReserve"] + [
        "cuMemCreate",
        "cuMemMap",
        "cuMemSetAccess",
    ] * 6
    assert drv.calls("cuMemAddressReserve") == [(3 * 3 * G, 0, 0, 0)]
    assert drv.calls("cuMemCreate") == [(4 * G,), (3 * G,)] * 3
    new = drv.created[3:]
    body, tail = new[0::2], new[1::2]
    assert len(set(slot0 + new)) == 9 and not set(body) & set(tail)
    assert drv.calls("cuMemMap") == [
        c for b, bh, th in zip(ptrs, body, tail) for c in ((b + G, 4 * G, 0, bh), (b + 5 * G, 3 * G, 0, th))
    ]
    assert [int(p.rec.handle) for p in arena._tail] == tail  # recorded apart from the body
    assert sorted(int(r.handle) for r in arena._handles) == sorted(slot0 + body)
    assert [(p.buffer_index, p.kv_va, p.slot_va, p.rec.size) for p in arena._tail] == [
        (i, b + 5 * G, arena.slot_ptr + i * 3 * G, 3 * G) for i, b in enumerate(ptrs)
    ]
    assert arena.tail_bytes_per_buffer == 3 * G and arena.slot_bytes == 9 * G
    assert drv.reserved[arena.slot_ptr] == 9 * G and arena.slot_ptr % G == 0
    assert not arena.tail_lent and arena.kv_mapped_bytes_per_buffer == 8 * G
    assert arena.num_handles == 9 and (arena.lend_count, arena.return_count) == (0, 0)
    assert_consistent(arena, drv)


def test_map_tail_splits_above_the_handle_cap_and_may_be_all_of_the_delta():
    arena, drv = make(n=2, max_handle_bytes=2 * G)
    drv.log.clear()
    assert arena.map_to(6 * G, tail_bytes_per_buffer=5 * G) == 6 * G  # no body delta: all tail
    assert drv.calls("cuMemCreate") == [(2 * G,), (2 * G,), (1 * G,)] * 2
    ptrs, slot = arena.buffer_ptrs, arena.slot_ptr
    placed = [(p.buffer_index, p.kv_va - ptrs[p.buffer_index], p.slot_va - slot) for p in arena._tail]
    # (buffer, offset in the buffer, offset in the slot): 2 + 2 + 1 granules per buffer, end to end
    assert placed == [
        (0, G, 0),
        (0, 3 * G, 2 * G),
        (0, 5 * G, 4 * G),
        (1, G, 5 * G),
        (1, 3 * G, 7 * G),
        (1, 5 * G, 9 * G),
    ]
    assert_consistent(arena, drv)


def test_map_tail_rules():
    arena, drv = make(n=2)
    drv.log.clear()
    with pytest.raises(ValueError, match="multiple of the granularity"):
        arena.map_to(8 * G, tail_bytes_per_buffer=G + 1)
    with pytest.raises(ValueError, match="multiple of the granularity"):
        arena.map_to(8 * G, tail_bytes_per_buffer=-G)
    with pytest.raises(ValueError, match="does not fit"):  # slot 0 is mapped: only 7 granules are new
        arena.map_to(8 * G, tail_bytes_per_buffer=8 * G)
    with pytest.raises(ValueError, match="does not fit"):  # nothing new at all
        arena.map_to(G, tail_bytes_per_buffer=G)
    assert drv.log == [] and arena.tail_bytes_per_buffer == 0  # refused before any call
    assert arena.map_to(8 * G, tail_bytes_per_buffer=2 * G) == 8 * G
    drv.log.clear()
    assert arena.map_to(4 * G) == 8 * G and arena.map_to(8 * G, tail_bytes_per_buffer=2 * G) == 8 * G
    assert drv.log == []  # no-ops
    with pytest.raises(ValueError, match="final"):  # growing would put the tail mid-buffer
        arena.map_to(10 * G)
    with pytest.raises(ValueError, match="final"):
        arena.map_to(8 * G, tail_bytes_per_buffer=G)
    assert drv.log == [] and arena.mapped_bytes_per_buffer == 8 * G
    assert_consistent(arena, drv)


@pytest.mark.parametrize(
    "func,after",
    [
        ("cuMemAddressReserve", 0),  # the slot range
        ("cuMemCreate", 3),  # buffer 1's tail
        ("cuMemMap", 2),  # buffer 1's body
        ("cuMemSetAccess", 5),  # buffer 2's tail
    ],
)
def test_map_with_a_tail_rolls_back_and_frees_the_slot_range(func, after):
    arena, drv = make(n=3)
    before = mapping_state(drv)
    drv.fail(func, CUresult.CUDA_ERROR_INVALID_VALUE, after=after)
    with pytest.raises(VMMError, match=f"{func} failed"):
        arena.map_to(8 * G, tail_bytes_per_buffer=3 * G)
    assert mapping_state(drv) == before  # every new handle released, the slot range freed
    assert arena.mapped_bytes_per_buffer == G and arena.tail_bytes_per_buffer == 0
    assert (arena.slot_ptr, arena.slot_bytes, arena.num_handles) == (0, 0, 3)
    assert_consistent(arena, drv)
    assert arena.map_to(8 * G, tail_bytes_per_buffer=3 * G) == 8 * G  # usable afterwards
    assert_consistent(arena, drv)


def expected_lend(arena: VirtualKVArena) -> list[tuple[str, tuple]]:
    moves = [
        c
        for p in arena._tail
        for c in (
            ("cuMemUnmap", (p.kv_va, p.rec.size)),
            ("cuMemMap", (p.slot_va, p.rec.size, 0, int(p.rec.handle))),
        )
    ]
    access = [("cuMemSetAccess", (p.slot_va, p.rec.size)) for p in arena._tail]  # one per handle, where it is
    return [("synchronize", ())] + moves + access


def expected_return(arena: VirtualKVArena) -> list[tuple[str, tuple]]:
    moves = [
        c
        for p in arena._tail
        for c in (
            ("cuMemUnmap", (p.slot_va, p.rec.size)),
            ("cuMemMap", (p.kv_va, p.rec.size, 0, int(p.rec.handle))),
        )
    ]
    access = [("cuMemSetAccess", (p.kv_va, p.rec.size)) for p in arena._tail]  # one per handle, where it is
    return [("synchronize", ())] + moves + access


def test_lend_and_return_twice_move_the_same_handles_with_no_create_or_release():
    arena, drv = tail_arena(n=3, tail=3 * G, total=8 * G, max_handle_bytes=2 * G)  # tail: 2 + 1 per buffer
    assert len(arena._tail) == 6
    ptrs, slot = arena.buffer_ptrs, arena.slot_ptr
    kv_state = mapping_state(drv)
    handles = dict(drv.handles)
    for round_ in (1, 2):
        drv.log.clear()
        ms = arena.lend_tail()
        assert drv.log == expected_lend(arena)
        assert [args[0] for args in drv.calls("cuMemMap")] == [
            slot + b * 3 * G + off for b in range(3) for off in (0, 2 * G)
        ]  # buffer order, consecutive
        assert arena.tail_lent and (arena.lend_count, arena.return_count) == (round_, round_ - 1)
        assert ms >= 0 and arena.last_lend_ms == ms
        assert arena.kv_mapped_bytes_per_buffer == 5 * G and arena.mapped_bytes_per_buffer == 8 * G
        assert not any(b + 5 * G <= va < b + 8 * G for va in drv.maps for b in ptrs)  # KV tails unmapped
        assert_consistent(arena, drv)
        drv.log.clear()
        assert arena.return_tail() == arena.last_return_ms
        assert drv.log == expected_return(arena)
        assert not arena.tail_lent and (arena.lend_count, arena.return_count) == (round_, round_)
        assert mapping_state(drv) == kv_state  # exactly as after map_to
        assert_consistent(arena, drv)
    assert drv.handles == handles  # the same physical memory throughout
    assert not [n for n, _ in drv.log if n in ("cuMemCreate", "cuMemRelease", "cuMemAddressReserve")]


def test_lend_and_return_refuse_the_wrong_state():
    plain, _ = make(n=2)
    with pytest.raises(RuntimeError, match="no tail"):
        plain.lend_tail()
    with pytest.raises(RuntimeError, match="no tail"):
        plain.return_tail()
    arena, drv = tail_arena()
    with pytest.raises(RuntimeError, match="not lent"):
        arena.return_tail()
    arena.lend_tail()
    with pytest.raises(RuntimeError, match="already lent"):
        arena.lend_tail()
    arena.release()
    with pytest.raises(RuntimeError, match="released"):
        arena.return_tail()


# One lend or return with 3 buffers x (2 + 1) tail handles: 6 unmaps, 6 maps, then access.
@pytest.mark.parametrize(
    "func,after",
    [
        ("cuMemUnmap", 0),  # the very first step
        ("cuMemUnmap", 3),  # buffer 1's second handle
        ("cuMemMap", 0),  # unmapped, not yet mapped anywhere
        ("cuMemMap", 4),  # buffer 2's first handle
        ("cuMemSetAccess", 0),  # everything moved, the destination not yet opened
    ],
)
@pytest.mark.parametrize("direction", ["lend", "return"])
def test_a_failed_move_rolls_back(direction, func, after):
    arena, drv = tail_arena(n=3, tail=3 * G, total=8 * G, max_handle_bytes=2 * G)
    if direction == "return":
        arena.lend_tail()
    before = mapping_state(drv)
    counts = (arena.lend_count, arena.return_count)
    drv.log.clear()
    drv.fail(func, CUresult.CUDA_ERROR_INVALID_VALUE, after=after)
    with pytest.raises(VMMError, match=f"^{func} failed: CUDA_ERROR_INVALID_VALUE$"):
        arena.lend_tail() if direction == "lend" else arena.return_tail()
    assert mapping_state(drv) == before  # the arena's mappings (and access) as before
    assert arena.tail_lent == (direction == "return") and (arena.lend_count, arena.return_count) == counts
    assert not [n for n, _ in drv.log if n in ("cuMemCreate", "cuMemRelease")]
    assert_consistent(arena, drv)
    arena.lend_tail() if direction == "lend" else arena.return_tail()  # works afterwards
    assert_consistent(arena, drv)


def test_a_failed_rollback_refuses_further_moves_and_release_still_frees_everything():
    arena, drv = tail_arena(n=2, tail=G, total=4 * G)
    drv.fail("cuMemMap", CUresult.CUDA_ERROR_INVALID_VALUE, after=1)  # buffer 1's slot map
    drv.fail("cuMemMap", CUresult.CUDA_ERROR_INVALID_VALUE, after=1)  # and mapping it back
    with pytest.raises(VMMError, match="cuMemMap failed"):
        arena.lend_tail()
    p0, p1 = arena._tail
    assert p0.kv_va in drv.maps and p1.kv_va not in drv.maps and p1.slot_va not in drv.maps
    with pytest.raises(RuntimeError, match="unknown"):
        arena.lend_tail()
    arena.release()
    assert not drv.handles and not drv.maps and not drv.reserved


@pytest.mark.parametrize("lent", [True, False])
def test_release_with_the_tail_lent_or_returned(lent):
    arena, drv = tail_arena(n=3, tail=2 * G, total=6 * G, max_handle_bytes=G)  # tail: 2 handles per buffer
    arena.lend_tail()
    if not lent:
        arena.return_tail()
    slot, ptrs = (arena.slot_ptr, arena.slot_bytes), arena.buffer_ptrs
    mapped = {va: size for va, (size, _, _) in drv.maps.items()}
    n_maps = len(mapped)
    drv.log.clear()
    arena.release()
    names = [n for n, _ in drv.log]
    n_handles = len(drv.created)
    assert n_maps == n_handles
    assert names == ["synchronize"] + ["cuMemUnmap"] * n_maps + ["cuMemRelease"] * n_handles + ["cuMemAddressFree"] * 4
    assert dict(drv.calls("cuMemUnmap")) == mapped  # every mapping, wherever the tail was
    assert sorted(a[0] for a in drv.calls("cuMemRelease")) == sorted(drv.created)
    assert drv.calls("cuMemAddressFree") == [(b, 64 * MiB) for b in ptrs] + [slot]  # the slot range last
    assert not drv.handles and not drv.maps and not drv.reserved
    assert (arena.slot_ptr, arena.slot_bytes, arena.tail_bytes_per_buffer, arena.tail_lent) == (0, 0, 0, False)
    drv.log.clear()
    arena.release()
    assert drv.log == []


def test_slot_tensor_only_while_lent(monkeypatch):
    seen: dict = {}

    def fake_as_tensor(obj, device):
        assert device == torch.device("cuda", 0)
        seen.update(obj.__cuda_array_interface__, arena=obj.arena)
        return torch.zeros(obj.__cuda_array_interface__["shape"], dtype=torch.uint8)

    monkeypatch.setattr(torch, "as_tensor", fake_as_tensor)
    arena, drv = tail_arena(n=2, tail=2 * G, total=6 * G)
    with pytest.raises(RuntimeError, match="lend_tail"):
        arena.slot_tensor()
    arena.lend_tail()
    t = arena.slot_tensor()
    assert t.dtype == torch.uint8 and t.shape == (arena.slot_bytes,)
    assert seen["data"] == (arena.slot_ptr, False) and seen["shape"] == (4 * G,) and seen["arena"] is arena
    t = arena.slot_tensor(torch.bfloat16)
    assert t.dtype == torch.bfloat16 and t.shape == (2 * G,)
    t = arena.slot_tensor(torch.bfloat16, (1024, 8, 128))
    assert t.shape == (1024, 8, 128) and seen["shape"] == (2 * MiB,)
    with pytest.raises(ValueError, match="exceeds"):
        arena.slot_tensor(torch.float32, (G + 1,))
    assert arena.tensor(1, torch.bfloat16, (8,)).shape == (8,)  # the KV body stays usable while lent
    arena.return_tail()
    with pytest.raises(RuntimeError, match="lend_tail"):
        arena.slot_tensor()


def test_tail_zero_behaves_as_before():
    a, da = make(n=3, max_handle_bytes=3 * G)
    b, db = make(n=3, max_handle_bytes=3 * G)
    da.log.clear()
    db.log.clear()
    assert a.map_to(9 * G) == b.map_to(9 * G, tail_bytes_per_buffer=0) == 9 * G
    assert da.log == db.log and mapping_state(da) == mapping_state(db)
    assert b.map_to(12 * G, tail_bytes_per_buffer=0) == 12 * G  # still growable
    assert (b.tail_bytes_per_buffer, b.tail_lent, b.slot_ptr, b.slot_bytes) == (0, False, 0, 0)
    assert b.kv_mapped_bytes_per_buffer == 12 * G and not b._tail
    assert_consistent(b, db)
    with pytest.raises(RuntimeError, match="no tail"):
        b.lend_tail()
    with pytest.raises(RuntimeError, match="lend_tail"):
        b.slot_tensor()


def test_vmm_supported(monkeypatch):
    assert vmm_supported(0, driver=FakeDriver()) == (True, "")
    ok, reason = vmm_supported(0, driver=FakeDriver(vmm_attr=0))
    assert not ok and "does not support" in reason
    drv = FakeDriver()
    drv.fail("cuInit", CUresult.CUDA_ERROR_NOT_SUPPORTED)
    ok, reason = vmm_supported(0, driver=drv)
    assert not ok and "cuInit failed: CUDA_ERROR_NOT_SUPPORTED" in reason
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)  # as if not installed
    ok, reason = vmm_supported(0)
    assert not ok and "cuda-bindings" in reason
    with pytest.raises(ImportError):  # imported lazily, when a real driver is needed
        VirtualKVArena(1, G, 0)
    tree = ast.parse(open(vmm.__file__).read())  # and never at module import time
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = [a.name for n in top for a in n.names] + [getattr(n, "module", "") or "" for n in top]
    assert not [n for n in names if n.startswith("cuda")]


def test_fake_matches_the_real_cuda_bindings_names():
    real = pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings not installed")
    arena, drv = make()
    arena.map_to(4 * G)
    drv.fail("cuMemMap", CUresult.CUDA_ERROR_OUT_OF_MEMORY)
    with pytest.raises(VMMOutOfMemory, match="cuMemMap failed: CUDA_ERROR_OUT_OF_MEMORY"):
        arena.map_to(6 * G)  # a grow (6 > 4), so it reaches cuMemMap
    arena.map_to(8 * G, tail_bytes_per_buffer=2 * G)  # and the tail's calls: reserve, move, access
    arena.lend_tail()
    arena.return_tail()
    vmm_supported(0, driver=drv)
    arena.release()
    missing = [n for n in sorted(drv.names_used) if not hasattr(real, n)]
    assert not missing, missing
    for cls in FakeDriver.ENUMS:
        for member in cls:
            assert int(getattr(getattr(real, cls.__name__), member.name)) == member.value
    for cls in FakeDriver.STRUCTS:
        fields = list(vars(cls()))
        assert all(hasattr(getattr(real, cls.__name__)(), f) for f in fields), cls
