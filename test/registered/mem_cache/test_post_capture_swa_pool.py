from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=15, suite="per-commit-cpu")

# The hybrid SWA pool on the post-capture path, run on the CPU: host tensors stand in for the two VMM arenas (the
# full-attention layers' ranges and the sliding-window layers'), each reserved for the pool's bound and "backed" a
# few granules at a time. The pools start at what one granule holds (as while graphs are captured), grow to the
# planner's sizes, and serve: greedy tokens equal transformers' with a window pool too small to keep every window,
# and no buffer is written past the bytes its arena backed (the bytes past them stay NaN). The CUDA version of this
# path is test/registered/models/test_gemma_gpu.py's post-capture case.

import dataclasses
import random

import pytest
import torch

from sglang.test.runners import (
    OutputCollector,
    greedy_params,
    hf_greedy,
    load_hf_model,
    run_scheduler,
    save_tiny_hf_model,
)
from sglang.test.tiny_sliding_window import qwen2_config

GiB = 1 << 30
GRANULE = 4096  # small, so the pools start small and really grow (the device's is 2 MiB)
NEW_TOKENS = 16


class HostArena:
    """`num_buffers` host byte ranges of the reserved size, NaN-filled; map_to records the backed prefix."""

    granularity = GRANULE
    instances: list = []

    def __init__(self, num_buffers: int, reserve_bytes_per_buffer: int, device_index: int) -> None:
        self.num_buffers = num_buffers
        self.reserved_bytes_per_buffer = -(-reserve_bytes_per_buffer // GRANULE) * GRANULE
        self.ranges = [torch.full((self.reserved_bytes_per_buffer // 4,), float("nan")) for _ in range(num_buffers)]
        self.mapped_bytes_per_buffer = GRANULE
        self.released = False
        HostArena.instances.append(self)

    def tensor(self, index: int, dtype: torch.dtype, shape) -> torch.Tensor:
        assert dtype == torch.float32
        return self.ranges[index][: shape[0] * shape[1] * shape[2]].view(*shape)

    def map_to(self, nbytes: int, tail_bytes_per_buffer: int = 0) -> int:
        assert nbytes % GRANULE == 0 and nbytes <= self.reserved_bytes_per_buffer and tail_bytes_per_buffer == 0
        self.mapped_bytes_per_buffer = max(self.mapped_bytes_per_buffer, nbytes)
        return self.mapped_bytes_per_buffer

    def written_past_backing(self) -> bool:
        backed = self.mapped_bytes_per_buffer // 4
        return any(not bool(r[backed:].isnan().all()) for r in self.ranges)

    def release(self) -> None:
        self.released = True


def prompts():
    rng = random.Random(11)
    return [[rng.randrange(3, 512) for _ in range(n)] for n in (5, 13, 30, 47, 60, 21)]


@pytest.mark.parametrize("page_size", [1, 4])
def test_post_capture_window_pool_serves_transformers_tokens(page_size, tmp_path, monkeypatch):
    from sglang.srt.configs.engine_config import resolve_engine_config
    from sglang.srt.managers.scheduler import build_scheduler
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.model_executor.pool_configurator import SizingPath
    from sglang.srt.server_args import ServerArgs

    d = save_tiny_hf_model(qwen2_config(), str(tmp_path / "qwen2-swa"))
    ref = hf_greedy(load_hf_model(d), prompts(), NEW_TOKENS)
    HostArena.instances.clear()
    monkeypatch.setattr("sglang.srt.mem_cache.vmm.VirtualKVArena", HostArena)
    monkeypatch.setattr(ModelRunner, "read_free_memory_bytes", lambda self: 8 * GiB)
    monkeypatch.setattr(ModelRunner, "read_vmm_granularity", lambda self: GRANULE)
    monkeypatch.setattr(ModelRunner, "measure_activation_peak_bytes", lambda self: 64 << 20)
    args = ServerArgs(
        model_path=d,
        skip_tokenizer_init=True,
        device="cpu",
        max_total_tokens=1024,  # the bound: the arenas reserve this, not 8 GiB's worth
        swa_full_tokens_ratio=0.0625,  # a window pool of 64 tokens for four requests of up to 76 tokens at once
        max_running_requests=4,
        page_size=page_size,
    )
    config = resolve_engine_config(args)
    config = dataclasses.replace(config, memory=dataclasses.replace(config.memory, path=SizingPath(True, "test")))
    sched = build_scheduler(config, output_sink=OutputCollector())
    mr, alloc = sched.model_runner, sched.allocator
    full_arena, swa_arena = HostArena.instances
    assert (mr.kv_arena, mr.swa_kv_arena) == (full_arena, swa_arena)
    assert (alloc.size, alloc.swa_size) == (1024, 64) and mr.memory_plan.path == "post-capture"
    # The pools grew from one granule's tokens to the planner's sizes, each arena backed for its own pool.
    slot = mr.kv_geometry.widest_slot_bytes
    assert full_arena.mapped_bytes_per_buffer == -(-(1024 + page_size) * slot // GRANULE) * GRANULE
    assert swa_arena.mapped_bytes_per_buffer == -(-(64 + page_size) * slot // GRANULE) * GRANULE
    assert swa_arena.mapped_bytes_per_buffer < full_arena.mapped_bytes_per_buffer

    for _ in range(2):  # the second time through the radix cache
        outs = run_scheduler(sched, prompts(), greedy_params(NEW_TOKENS))
        assert [o.output_ids for o in outs] == ref
    assert not full_arena.written_past_backing() and not swa_arena.written_past_backing()
    cache = sched.tree_cache  # every slot of both grown pools back: free or cached
    assert alloc.available_size() + cache.evictable_size() == alloc.size
    assert alloc.swa_available_size() + cache.swa_evictable_size() == alloc.swa_size
    mr.shutdown()
    assert full_arena.released and swa_arena.released
