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
        assert self.maps[ptr][0] == size
        if err := self._call("cuMemSetAccess", (ptr, size)):
            return (err,)
        self.access[ptr] = size
        return (CUresult.CUDA_SUCCESS,)


def make(n: int = 4, reserve: int = 64 * MiB, drv: Optional[FakeDriver] = None, **kw: Any):
    drv = drv or FakeDriver()
    return VirtualKVArena(n, reserve, 0, driver=drv, synchronize=drv.sync, **kw), drv


def assert_consistent(arena: VirtualKVArena, drv: FakeDriver) -> None:
    """Each buffer's [base, base + mapped) is exactly covered by read-write mappings, nothing
    else is mapped, the live handles are exactly the arena's, and each handle is mapped once,
    whole, from offset 0, inside one buffer's mapped part (no handle shared)."""
    covered = 0
    for base in arena.buffer_ptrs:
        pos = base
        while pos < base + arena.mapped_bytes_per_buffer:
            size = drv.maps[pos][0]
            assert drv.access[pos] == size
            pos += size
            covered += 1
        assert pos == base + arena.mapped_bytes_per_buffer
    assert covered == len(drv.maps)
    assert len(drv.handles) == arena.num_handles
    assert all(off == 0 for _, _, off in drv.maps.values())
    mapped = {h: size for size, h, _ in drv.maps.values()}
    assert len(mapped) == len(drv.maps), "a handle mapped more than once"
    assert mapped == drv.handles, "every handle fully mapped, nothing else"
    for rec in arena._handles:
        [(va, size)] = rec.mappings
        assert drv.maps[va] == (size, int(rec.handle), 0)
        assert any(b <= va and va + size <= b + arena.mapped_bytes_per_buffer for b in arena.buffer_ptrs)


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
        arena.map_to(2 * G)
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
