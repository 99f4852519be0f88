from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=80, suite="per-commit-cuda")

# VirtualKVArena on a real GPU: reserve, back only slot 0's granule, capture a CUDA graph, grow
# the backing behind the same addresses, replay into the newly mapped part, account free memory;
# then the lendable tail: its pages (and their bytes) move into the slot range and back, twice.
# Run with -s to see the lend/return times.

import gc
import time

import pytest
import torch

from sglang.srt.mem_cache.vmm import VirtualKVArena, VMMOutOfMemory, vmm_supported
from sglang.test.gpu_utils import REQUIRES_GPU_REASON, has_gpu

pytestmark = pytest.mark.skipif(not has_gpu(), reason=REQUIRES_GPU_REASON)

GiB, MiB = 1 << 30, 1 << 20
HEADS, DIM = 8, 128  # one bf16 token row: 2 KiB
TOKEN_BYTES = HEADS * DIM * 2
SLACK = 64 * MiB  # page tables, allocator noise


def _free() -> int:
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


@pytest.fixture
def dev() -> int:
    ok, reason = vmm_supported(torch.cuda.current_device())
    assert ok, reason
    return torch.cuda.current_device()


def test_first_granule_is_mapped_and_usable(dev):
    arena = VirtualKVArena(4, 8 * GiB, dev)
    try:
        g = arena.granularity
        assert g > 0 and arena.reserved_bytes_per_buffer == 8 * GiB
        assert arena.mapped_bytes_per_buffer == g and arena.num_handles == 4  # one handle per buffer
        tokens = arena.reserved_bytes_per_buffer // TOKEN_BYTES
        for b in range(4):
            kv = arena.tensor(b, torch.bfloat16, (tokens, HEADS, DIM))  # spans the reservation
            assert kv.is_cuda and kv.device.index == dev and kv.data_ptr() == arena.buffer_ptrs[b]
            n = g // TOKEN_BYTES  # tokens inside the mapped granule
            vals = torch.randn(n, HEADS, DIM, device=f"cuda:{dev}").to(torch.bfloat16) + b
            kv[:n] = vals
            torch.testing.assert_close(kv[:n], vals, rtol=0, atol=0)
            del kv
    finally:
        arena.release()


def test_graph_replays_into_memory_mapped_after_capture(dev):
    device = f"cuda:{dev}"
    arena = VirtualKVArena(4, 8 * GiB, dev)
    g = arena.granularity
    tokens = arena.reserved_bytes_per_buffer // TOKEN_BYTES
    k0 = arena.tensor(0, torch.bfloat16, (tokens, HEADS, DIM))
    v3 = arena.tensor(3, torch.bfloat16, (tokens, HEADS, DIM))
    n = 64
    idx = torch.arange(n, device=device) + 100  # inside the first granule
    src = torch.randn(n, HEADS, DIM, device=device).to(torch.bfloat16)

    def step(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        k[idx] = src
        v[idx] = src * 2
        return k[idx].float() + v[idx].float()  # == 3 * src exactly

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(k0, v3)  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step(k0, v3)
    graph.replay()
    torch.testing.assert_close(out, 3 * src.float(), rtol=0, atol=0)

    free0 = _free()
    assert arena.map_to(1 * GiB) == 1 * GiB
    grown = 4 * (1 * GiB - g)
    assert abs((free0 - _free()) - grown) <= SLACK

    mapped_tokens = arena.mapped_bytes_per_buffer // TOKEN_BYTES
    first_new = g // TOKEN_BYTES  # the first token past the granule mapped at construction
    new_idx = torch.cat(
        [torch.arange(n // 2, device=device) + first_new, torch.arange(n // 2, device=device) + mapped_tokens - n // 2]
    )
    idx.copy_(new_idx)  # in place: the graph reads these addresses
    src.copy_(torch.randn(n, HEADS, DIM, device=device).to(torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, 3 * src.float(), rtol=0, atol=0)
    torch.testing.assert_close(k0[new_idx], src, rtol=0, atol=0)
    torch.testing.assert_close(v3[new_idx], src * 2, rtol=0, atol=0)

    # Another growth step: more memory behind the same addresses, the graph still valid.
    before = _free()
    arena.map_to(1 * GiB + 512 * MiB)
    assert abs((before - _free()) - 4 * 512 * MiB) <= SLACK
    graph.replay()
    torch.testing.assert_close(out, 3 * src.float(), rtol=0, atol=0)

    del graph, out, k0, v3
    gc.collect()
    torch.cuda.empty_cache()
    before_release = _free()
    arena.release()
    assert abs((_free() - before_release) - 4 * (1 * GiB + 512 * MiB)) <= SLACK
    arena.release()  # idempotent


def test_oom_raises_and_arena_stays_usable(dev):
    arena = VirtualKVArena(1, 200 * GiB, dev)  # more than the GPU has
    try:
        free0 = _free()
        want = min(free0 + 16 * GiB, arena.reserved_bytes_per_buffer)
        with pytest.raises(VMMOutOfMemory, match="cuMemCreate failed: CUDA_ERROR_OUT_OF_MEMORY"):
            arena.map_to(want)
        assert arena.mapped_bytes_per_buffer == arena.granularity and arena.num_handles == 1
        assert abs(_free() - free0) <= SLACK  # everything this call created was released
        assert arena.map_to(256 * MiB) == 256 * MiB
        t = arena.tensor(0, torch.float32, (256 * MiB // 4,))
        t.fill_(1.0)
        assert t.sum().item() == 256 * MiB // 4
        del t
    finally:
        arena.release()


# The KT prefill slot of issue 14's H200 run: 12 layers x (K, V) = 24 buffers, 48 MiB of tail each
# (1.125 GiB in all, the BF16 slot), at the end of 256 MiB backed per buffer.
TAIL_BUFFERS, TAIL_BYTES, BACKED_BYTES = 24, 48 * MiB, 256 * MiB
BODY_PROBE = 1 * MiB  # the body bytes just before the tail: must never change


def _tail_arena(dev: int) -> VirtualKVArena:
    arena = VirtualKVArena(TAIL_BUFFERS, 2 * BACKED_BYTES, dev)
    assert arena.map_to(BACKED_BYTES, tail_bytes_per_buffer=TAIL_BYTES) == BACKED_BYTES
    assert arena.slot_bytes == TAIL_BUFFERS * TAIL_BYTES and arena.slot_ptr != 0 and not arena.tail_lent
    return arena


def _random_bytes(rows: int, cols: int, dev: int, seed: int) -> torch.Tensor:
    gen = torch.Generator(device=f"cuda:{dev}").manual_seed(seed)
    return torch.randint(0, 256, (rows, cols), dtype=torch.uint8, device=f"cuda:{dev}", generator=gen)


def _timed(fn) -> tuple[float, float, int]:
    """(driver ms as the arena reports it, wall ms of the whole call incl. its synchronize, change in
    free device memory across the call: 0 up to noise, since the same pages only move)."""
    free_before = _free()
    start = time.perf_counter()
    driver_ms = fn()
    wall_ms = (time.perf_counter() - start) * 1e3
    return driver_ms, wall_ms, _free() - free_before


def test_tail_bytes_move_to_the_slot_and_back_twice(dev):
    arena = _tail_arena(dev)
    try:
        start = BACKED_BYTES - TAIL_BYTES
        kv = [arena.tensor(b, torch.uint8, (BACKED_BYTES,)) for b in range(TAIL_BUFFERS)]
        old = _random_bytes(TAIL_BUFFERS, TAIL_BYTES, dev, seed=1)
        body = _random_bytes(TAIL_BUFFERS, BODY_PROBE, dev, seed=2)
        for b, t in enumerate(kv):
            t[start:] = old[b]
            t[start - BODY_PROBE : start] = body[b]

        def check_body(kv: list[torch.Tensor]) -> None:
            for b, t in enumerate(kv):
                assert torch.equal(t[start - BODY_PROBE : start], body[b]), f"buffer {b}'s body changed"

        for round_, seed in ((1, 3), (2, 4)):
            lend_ms, lend_wall, lend_freed = _timed(arena.lend_tail)
            assert arena.tail_lent and arena.lend_count == round_
            assert abs(lend_freed) <= SLACK  # the same pages: nothing created or freed
            slot = arena.slot_tensor().view(TAIL_BUFFERS, TAIL_BYTES)
            assert slot.data_ptr() == arena.slot_ptr
            assert torch.equal(slot, old), "the slot must show every buffer's tail, in buffer order"
            check_body(kv)  # the KV body stays mapped and untouched while the tail is lent
            new = _random_bytes(TAIL_BUFFERS, TAIL_BYTES, dev, seed=seed)
            slot.copy_(new)
            torch.cuda.synchronize()
            del slot  # its addresses are unmapped by return_tail
            return_ms, return_wall, return_freed = _timed(arena.return_tail)
            assert not arena.tail_lent and arena.return_count == round_
            assert abs(return_freed) <= SLACK
            for b, t in enumerate(kv):
                assert torch.equal(t[start:], new[b]), f"buffer {b}'s tail lost what the slot wrote"
            check_body(kv)
            print(
                f"\n[vmm tail] round {round_}: {TAIL_BUFFERS} x {TAIL_BYTES // MiB} MiB "
                f"({arena.slot_bytes / GiB:.3f} GiB), granularity {arena.granularity // MiB} MiB: "
                f"lend {lend_ms:.2f} ms (driver) / {lend_wall:.2f} ms (wall), "
                f"return {return_ms:.2f} ms (driver) / {return_wall:.2f} ms (wall)"
            )
            old = new
        del kv
    finally:
        arena.release()
    assert arena.slot_bytes == 0


def test_graph_over_the_tail_replays_after_it_moved_twice(dev):
    """A graph captured over KV addresses in the tail keeps working once the tail has been lent
    and returned twice (the same virtual addresses, the same physical pages)."""
    device = f"cuda:{dev}"
    arena = _tail_arena(dev)
    try:
        start = BACKED_BYTES - TAIL_BYTES
        k = arena.tensor(0, torch.bfloat16, (BACKED_BYTES // 2,))
        v = arena.tensor(TAIL_BUFFERS - 1, torch.bfloat16, (BACKED_BYTES // 2,))
        n = 4096
        idx = torch.cat(
            [torch.arange(n, device=device) + start // 2, torch.arange(n, device=device) + (start // 2 - n)]
        )
        src = torch.randn(2 * n, device=device).to(torch.bfloat16)  # half into the tail, half into the body

        def step(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            k[idx] = src
            v[idx] = src * 2
            return k[idx].float() + v[idx].float()

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step(k, v)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step(k, v)
        graph.replay()
        torch.testing.assert_close(out, 3 * src.float(), rtol=0, atol=0)
        for _ in range(2):
            arena.lend_tail()
            arena.slot_tensor().zero_()  # the slot owns the pages now: clobber them
            torch.cuda.synchronize()
            arena.return_tail()
        assert (arena.lend_count, arena.return_count) == (2, 2)
        assert torch.count_nonzero(k[start // 2 : start // 2 + n]) == 0  # the slot's zeros came back
        src.copy_(torch.randn(2 * n, device=device).to(torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, 3 * src.float(), rtol=0, atol=0)
        torch.testing.assert_close(k[idx], src, rtol=0, atol=0)
        torch.testing.assert_close(v[idx], src * 2, rtol=0, atol=0)
        del graph, out, k, v
        gc.collect()
    finally:
        arena.release()
