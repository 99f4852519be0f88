"""The post-capture path of the KV-cache mixin applied on the CPU: a fake VMM arena (host tensors standing in
for reserved ranges) and injected free-memory readings. The mixin reserves what virtual_pool decided, backs and
resizes to what post_capture_pool_size decided, logs the sizing line, and tears down in order."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=20, suite="per-commit-cpu")

import logging

import torch

from sglang.srt.model_executor.pool_configurator import (
    MEASURED_HEADROOM_RULE,
    SizingPath,
    backed_bytes_per_buffer,
    post_capture_pool_size,
    virtual_pool,
)
from sglang.srt.server_args import ServerArgs

GiB, MiB = 1 << 30, 1 << 20


class FakeArena:
    """Host tensors over 'reserved' ranges; map_to only records how much is backed."""

    granularity = 2 * MiB
    instances: list = []

    def __init__(self, num_buffers: int, reserve_bytes_per_buffer: int, device_index: int) -> None:
        self.num_buffers = num_buffers
        self.reserved_bytes_per_buffer = reserve_bytes_per_buffer
        self.mapped_bytes_per_buffer = self.granularity
        self.released = False
        FakeArena.instances.append(self)

    def tensor(self, index: int, dtype: torch.dtype, shape) -> torch.Tensor:
        assert shape[0] * shape[1] * shape[2] * dtype.itemsize <= self.reserved_bytes_per_buffer
        return torch.zeros(1, 1, 1, dtype=dtype).expand(*shape)  # no host memory for the whole range

    def map_to(self, nbytes: int, tail_bytes_per_buffer: int = 0) -> int:
        assert nbytes <= self.reserved_bytes_per_buffer + self.granularity
        self.tail_bytes_per_buffer = tail_bytes_per_buffer
        self.mapped_bytes_per_buffer = max(self.mapped_bytes_per_buffer, nbytes)
        return self.mapped_bytes_per_buffer

    def release(self) -> None:
        self.released = True


# Free memory before the weights, after them, after capture, after start-up; the pool's flags.
READINGS = [10 * GiB, 9 * GiB, 8 * GiB, 1 * GiB]
SMALL_POOL = dict(mem_fraction_static=0.9, max_running_requests=8)


def _post_capture_runner(model: str, monkeypatch, readings: list, peak=None, **kw):
    """peak: what the activation probe measures (None: no measurement, SGLang's rule applies)."""
    import dataclasses

    from sglang.srt.configs.engine_config import resolve_engine_config
    from sglang.srt.model_executor.model_runner import ModelRunner

    monkeypatch.setattr("sglang.srt.mem_cache.vmm.VirtualKVArena", FakeArena)
    left = list(readings)
    monkeypatch.setattr(ModelRunner, "read_free_memory_bytes", lambda self: left.pop(0))
    monkeypatch.setattr(ModelRunner, "read_vmm_granularity", lambda self: FakeArena.granularity)
    monkeypatch.setattr(ModelRunner, "measure_activation_peak_bytes", lambda self: peak)
    args = ServerArgs(model_path=model, load_format="dummy", skip_tokenizer_init=True, device="cpu", **kw)
    config = resolve_engine_config(args)
    # The CPU never decides post-capture itself: the path is injected.
    config = dataclasses.replace(config, memory=dataclasses.replace(config.memory, path=SizingPath(True, "test")))
    mr = ModelRunner(config)
    assert left == []  # before weights, after weights, after capture, after start-up: once each
    return mr, config


def test_applies_the_planners_decision(tiny_model_dir, monkeypatch, caplog):
    with caplog.at_level(logging.INFO):
        mr, args = _post_capture_runner(
            tiny_model_dir,
            monkeypatch,
            READINGS,
            **SMALL_POOL,
        )
    r, cap, arena = mr.readings, mr.capture_readings, mr.kv_arena
    assert cap.free_after_capture_bytes == 8 * GiB and r.vmm_granularity_bytes == FakeArena.granularity
    # Reserved as decided before capture: the bound, the request table.
    vp = virtual_pool(r, mr.pool_args)
    assert arena.reserved_bytes_per_buffer == vp.reserve_bytes_per_buffer
    assert mr.req_to_token_pool.size == vp.max_running_requests == 8
    # Resized as decided after capture.
    size = post_capture_pool_size(r, cap, mr.pool_args)
    assert mr.pool_size == size
    assert mr.max_total_num_tokens == mr.token_to_kv_pool_allocator.size == size.tokens
    assert mr.token_to_kv_pool_allocator.available_size() == size.tokens
    assert arena.mapped_bytes_per_buffer == backed_bytes_per_buffer(size.tokens, 2 * 16 * 4, 1, FakeArena.granularity)
    # No CUDA graphs here, so decode is "eager above the captured size": the headroom is floored to
    # the activation reserve (SGLang's rule, nothing measured).
    assert size.headroom_bytes == max(int(10 * GiB * 0.1), args.memory.pool.activation_reserve_bytes)
    assert [m for m in caplog.messages if m.startswith("Post-capture KV sizing: max_total_num_tokens=")] == [
        f"Post-capture KV sizing: max_total_num_tokens={size.tokens}"
    ]
    assert any("cuda_graph_max_bs=0 < max_running_requests=8" in m for m in caplog.messages)
    plan = mr.memory_plan
    assert plan.path == "post-capture" and plan.max_total_num_tokens == size.tokens
    assert plan.post_capture_budget_bytes == size.budget_bytes and plan.sglang_rule_tokens == size.tokens
    assert plan.static_equivalent_tokens == int(9 * GiB - 10 * GiB * 0.1) // r.kv.cell_size_bytes
    mr.shutdown()
    assert arena.released and mr.kv_arena is None and mr.token_to_kv_pool.k_buffer == []


def test_measured_peak_sets_the_headroom(tiny_model_dir, monkeypatch):
    peak = 300 * MiB
    mr, _ = _post_capture_runner(
        tiny_model_dir,
        monkeypatch,
        READINGS,
        peak=peak,
        **SMALL_POOL,
    )
    size = mr.pool_size
    assert mr.capture_readings.activation_peak_bytes == peak
    assert size.headroom_rule == MEASURED_HEADROOM_RULE and size.headroom_bytes == int(peak * 1.1 + 256 * MiB)
    assert size.tokens > size.sglang_rule_tokens  # the measurement beats the 6+ GiB activation reserve
    assert mr.memory_plan.activation_peak_gb == peak / GiB
    mr.shutdown()


def test_mla_reserves_one_latent_range_per_layer(monkeypatch, tmp_path):
    """A DeepSeek-V2 (MLA) model: one range per layer of [slots, 1, kv_lora_rank + qk_rope_head_dim], sized and
    resized by the same planner with the latent cell."""
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool
    from sglang.test.tiny_deepseek import tiny_deepseek_config

    config = tiny_deepseek_config("v2")
    config.architectures = ["DeepseekV2ForCausalLM"]
    config.save_pretrained(tmp_path)
    mr, _ = _post_capture_runner(
        str(tmp_path),
        monkeypatch,
        READINGS,
        **SMALL_POOL,
    )
    kv, arena, pool = mr.kv_geometry, mr.kv_arena, mr.token_to_kv_pool
    row = config.kv_lora_rank + config.qk_rope_head_dim
    assert kv.is_mla and arena.num_buffers == config.num_hidden_layers  # not 2 per layer
    assert isinstance(pool, MLATokenToKVPool) and len(pool.buffers()) == config.num_hidden_layers
    assert all(b.shape[1:] == (1, row) for b in pool.buffers())
    size = post_capture_pool_size(mr.readings, mr.capture_readings, mr.pool_args)
    assert mr.max_total_num_tokens == size.tokens > 0
    assert arena.mapped_bytes_per_buffer == backed_bytes_per_buffer(size.tokens, row * 4, 1, FakeArena.granularity)
    assert (
        mr.memory_plan.path == "post-capture" and mr.memory_plan.cell_size_bytes == config.num_hidden_layers * row * 4
    )
    mr.shutdown()
    assert arena.released and pool.buffers() == []


def test_window_pool_gets_an_arena_of_its_own(monkeypatch, tmp_path, caplog):
    """A model with sliding-window layers (Qwen2, the upper two of four layers windowed): the windowed layers' K/V
    ranges are a second arena, reserved and backed for the window pool (--swa-full-tokens-ratio of the full pool's
    tokens), and the allocator grows both pools to the planner's sizes."""
    from sglang.srt.mem_cache.swa_allocator import SWATokenToKVPoolAllocator
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
    from sglang.test.tiny_sliding_window import qwen2_config

    qwen2_config().save_pretrained(tmp_path)
    with caplog.at_level(logging.INFO):
        mr, _ = _post_capture_runner(
            str(tmp_path),
            monkeypatch,
            READINGS,
            **SMALL_POOL,
            swa_full_tokens_ratio=0.25,
        )
    kv, full_arena, swa_arena = mr.kv_geometry, mr.kv_arena, mr.swa_kv_arena
    assert (kv.full_layers, kv.swa_layers) == (2, 2) and (full_arena.num_buffers, swa_arena.num_buffers) == (4, 4)
    vp = virtual_pool(mr.readings, mr.pool_args)
    assert full_arena.reserved_bytes_per_buffer == vp.reserve_bytes_per_buffer
    assert swa_arena.reserved_bytes_per_buffer == vp.swa_reserve_bytes_per_buffer < vp.reserve_bytes_per_buffer
    size = post_capture_pool_size(mr.readings, mr.capture_readings, mr.pool_args)
    swa_tokens = kv.swa_tokens(size.tokens, 1)
    alloc, pool = mr.token_to_kv_pool_allocator, mr.token_to_kv_pool
    assert isinstance(alloc, SWATokenToKVPoolAllocator) and isinstance(pool, SWAKVPool)
    assert (alloc.size, alloc.swa_size) == (size.tokens, swa_tokens) and swa_tokens == int(size.tokens * 0.25)
    assert alloc.available_size() == size.tokens and alloc.swa_available_size() == swa_tokens
    assert alloc.full_to_swa.shape[0] == vp.max_tokens + 1  # the slot map covers the pool's bound, allocated once
    slot = kv.widest_slot_bytes
    assert full_arena.mapped_bytes_per_buffer == backed_bytes_per_buffer(size.tokens, slot, 1, FakeArena.granularity)
    assert swa_arena.mapped_bytes_per_buffer == backed_bytes_per_buffer(swa_tokens, slot, 1, FakeArena.granularity)
    assert (
        f"Post-capture KV sizing: max_total_num_tokens={size.tokens}, sliding-window layers' pool {swa_tokens} tokens"
        in (caplog.messages)
    )
    assert mr.memory_plan.swa_layers == 2 and mr.memory_plan.swa_max_total_num_tokens == swa_tokens
    mr.shutdown()
    assert full_arena.released and swa_arena.released and mr.swa_kv_arena is None
