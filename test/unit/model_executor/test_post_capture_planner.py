"""Post-capture sizing on the CPU: the gate, the planned mem_fraction_static, the flag-off plan equal to
the static plan field by field, and the resize arithmetic driven through ModelRunner with a fake
VMM arena (host tensors standing in for reserved ranges) and injected free-memory readings."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=40, suite="per-commit-cpu")

import dataclasses
import tempfile

import pytest
import torch

from sglang.srt.environ import envs
from sglang.srt.server_args import ServerArgs

GiB = 1 << 30
MiB = 1 << 20


@pytest.fixture(scope="module")
def tiny_model_dir() -> str:
    from transformers import AutoModelForCausalLM, LlamaConfig

    path = tempfile.mkdtemp(prefix="tiny-llama-")
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return path


@pytest.fixture
def fake_cuda(monkeypatch):
    """ServerArgs believes it runs on a 141 GiB GPU (143771 MiB, as nvidia-smi reports an H200)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr("sglang.srt.utils.memory.get_device_memory_capacity", lambda device, index=0: 143771.0)
    monkeypatch.setattr("sglang.srt.server_args._cuda_bindings_installed", lambda: True)


def _args(model: str, **kw) -> ServerArgs:
    return ServerArgs(model_path=model, load_format="dummy", skip_tokenizer_init=True, **kw)


def test_gate_and_planned_mem_fraction(fake_cuda, tiny_model_dir):
    with envs.SGLANG_ENABLE_POST_CAPTURE_KV_SIZING.override(False):
        off = _args(tiny_model_dir, device="cuda")
    with envs.SGLANG_ENABLE_POST_CAPTURE_KV_SIZING.override(True):
        on = _args(tiny_model_dir, device="cuda")
        eager = _args(tiny_model_dir, device="cuda", disable_cuda_graph=True)
        no_chunk = _args(tiny_model_dir, device="cuda", chunked_prefill_size=-1)
        native = _args(tiny_model_dir, device="cuda", attention_backend="torch_native")
        cpu = _args(tiny_model_dir, device="cpu")
        # The gate reads the flag when asked (the scheduler process inherits the environment).
        assert on.post_capture_kv_sizing_planned()
        assert "decode CUDA graphs are disabled" in eager.post_capture_kv_sizing_blockers()
        assert "chunked prefill is disabled" in no_chunk.post_capture_kv_sizing_blockers()
        assert any("torch_native" in r for r in native.post_capture_kv_sizing_blockers())
        assert "device is not CUDA" in cpu.post_capture_kv_sizing_blockers()
    assert not off.post_capture_kv_sizing_planned()
    assert off.post_capture_kv_sizing_blockers() == ["SGLANG_ENABLE_POST_CAPTURE_KV_SIZING is off"]
    cap = 143771.0
    # H200 tier: chunk 8192, graph bs 256 -> static reserve 512 + 12288 + 128 + 512 = 13440 MiB.
    assert off.chunked_prefill_size == 8192 and off.cuda_graph_max_bs == 256
    assert off.mem_fraction_static == round((cap - 13440) / cap, 3)
    # Planned: 1536 + tp*pp/8*1024 = 1664 MiB, no activation or graph guess.
    assert on.mem_fraction_static == round((cap - 1664) / cap, 3)
    assert on.static_path_mem_fraction_static() == off.mem_fraction_static
    assert eager.mem_fraction_static == off.mem_fraction_static  # not planned -> classic default
    assert on.pre_capture_activation_reserve_mb() == max(512 + 8192 * 1.5 + 128, 10240)


def _plan_fields(plan) -> dict:
    d = dataclasses.asdict(plan)
    for volatile in ("free_after_plan_gb", "pre_model_load_memory_gb", "available_after_weights_gb",
                     "weights_gb", "headroom_gb", "per_rank_available_gb"):
        d.pop(volatile)
    return d


def test_flag_off_plan_equals_static_plan(tiny_model_dir, monkeypatch):
    """With the flag off (or not applicable) every number of the plan is the static path's."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_executor.model_runner import ModelRunner

    # Per runner: free before weights (8), before/after loading (8, 7.5), after weights (7.5), final (6).
    readings = iter([8.0, 8.0, 7.5, 7.5, 6.0] * 2)
    monkeypatch.setattr(ModelRunner, "read_available_memory_gb", lambda self: next(readings))
    plans = []
    for flag in (False, True):
        with envs.SGLANG_ENABLE_POST_CAPTURE_KV_SIZING.override(flag):
            args = _args(tiny_model_dir, device="cpu", mem_fraction_static=0.8)
            plans.append(ModelRunner(ModelConfig.from_server_args(args), args).memory_plan)
    assert plans[0].path == plans[1].path == "static"
    assert _plan_fields(plans[0]) | {"path_reason": ""} == _plan_fields(plans[1]) | {"path_reason": ""}
    # rest = 7.5 - 8 * 0.2 = 5.9 GiB over a cell of 2 kv heads * (16 + 16) * 2 layers * 4 bytes.
    assert plans[0].cell_size_bytes == 2 * 32 * 2 * 4
    assert plans[0].max_total_num_tokens == int(5.9 * GiB) // plans[0].cell_size_bytes


class FakeArena:
    """Host tensors over 'reserved' ranges; map_to only records how much is backed."""

    granularity = 2 * MiB

    def __init__(self, num_buffers: int, reserve_bytes_per_buffer: int, device_index: int) -> None:
        self.num_buffers = num_buffers
        self.reserved_bytes_per_buffer = reserve_bytes_per_buffer
        self.mapped_bytes_per_buffer = self.granularity
        self.released = False

    def tensor(self, index: int, dtype: torch.dtype, shape) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype)

    def map_to(self, nbytes: int) -> int:
        assert nbytes <= self.reserved_bytes_per_buffer
        self.mapped_bytes_per_buffer = max(self.mapped_bytes_per_buffer, nbytes)
        return self.mapped_bytes_per_buffer

    def release(self) -> None:
        self.released = True


def test_post_capture_resize_arithmetic(tiny_model_dir, monkeypatch):
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_executor.model_runner import ModelRunner

    monkeypatch.setattr("sglang.srt.mem_cache.vmm.VirtualKVArena", FakeArena)
    monkeypatch.setattr(ModelRunner, "decide_post_capture_path", lambda self: self._force_post())

    def force(self):
        self.memory_plan.path, self.memory_plan.path_reason = "post-capture", "test"
        return True

    monkeypatch.setattr(ModelRunner, "_force_post", force, raising=False)
    # free before weights 10 GiB; after weights 9 GiB; after capture 8 GiB; final 1 GiB.
    readings = iter([10.0, 10.0, 9.0, 9.0, 8.0, 1.0])
    monkeypatch.setattr(ModelRunner, "read_available_memory_gb", lambda self: next(readings))
    with envs.SGLANG_POST_CAPTURE_MEASURE_ACTIVATION_PEAK.override(False):
        args = _args(tiny_model_dir, device="cpu", mem_fraction_static=0.9, max_running_requests=8)
        mr = ModelRunner(ModelConfig.from_server_args(args), args)
    plan, cell = mr.memory_plan, mr.memory_plan.cell_size_bytes
    assert plan.path == "post-capture"
    # No CUDA graphs here, so decode is "eager above the captured size": the headroom is floored to
    # the activation reserve (512 + 4096 * 1.5 + 128 MiB at this host's tier, or 10 GiB above 60 GiB).
    floor_mib = args.pre_capture_activation_reserve_mb()
    headroom = max(10.0 * 0.1 * GiB, floor_mib * MiB)
    assert plan.headroom_gb == pytest.approx(headroom / GiB)
    backed = FakeArena.granularity * 2 * 2  # first granule of 2 layers x (K, V)
    budget = int(8.0 * GiB - headroom + backed)
    slot = 2 * 16 * 4  # kv heads * head_dim * fp32
    per_buffer = (budget // cell + 1) * slot // FakeArena.granularity * FakeArena.granularity
    assert mr.max_total_num_tokens == per_buffer // slot - 1 == plan.max_total_num_tokens
    assert mr.token_to_kv_pool.size == mr.token_to_kv_pool_allocator.size == mr.max_total_num_tokens
    assert mr.token_to_kv_pool_allocator.available_size() == mr.max_total_num_tokens
    assert mr.kv_arena.mapped_bytes_per_buffer == per_buffer
    assert plan.sglang_rule_tokens == mr.max_total_num_tokens  # no measured floor here: same rule
    assert plan.static_equivalent_tokens == int((9.0 - 10.0 * 0.1) * GiB) // cell
    mr.shutdown()
    assert mr.kv_arena is None
