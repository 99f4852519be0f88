from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=60, suite="per-commit-cuda")

# VirtualKVArena on a real GPU: reserve, back only slot 0's granule, capture a CUDA graph, grow
# the backing behind the same addresses, replay into the newly mapped part, account free memory.

import gc

import pytest
import torch

from sglang.srt.mem_cache.vmm import VirtualKVArena, VMMOutOfMemory, vmm_supported

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the GPU machine)")

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
