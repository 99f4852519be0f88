"""ModelRunner's start-up on the CPU with injected free-memory readings: each reading is taken once, the
planner's decision is applied as decided, readings agree over ranks (MIN of free memory, the largest
reservation), flag on or off gives the same static plan where post-capture cannot run, and the
allocator owns the token count."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=20, suite="per-commit-cpu")


from sglang.srt.environ import envs
from sglang.srt.server_args import ServerArgs

GiB = 1 << 30


def _args(model: str, **kw) -> ServerArgs:
    return ServerArgs(model_path=model, load_format="dummy", skip_tokenizer_init=True, device="cpu", **kw)


def _runner(args: ServerArgs, readings: list, monkeypatch):
    """A ModelRunner whose free-memory readings are `readings` (bytes), in order; returns it and the
    readings it did not take."""
    from sglang.srt.configs.engine_config import resolve_engine_config
    from sglang.srt.model_executor.model_runner import ModelRunner

    left = list(readings)
    monkeypatch.setattr(ModelRunner, "read_free_memory_bytes", lambda self: left.pop(0))
    return ModelRunner(resolve_engine_config(args)), left


class _FakeSlot:
    """A model's KT prefill slot as the runner sees it: its bytes."""

    nbytes = 5000


def test_static_start_up_reads_each_term_once(tiny_model_dir, monkeypatch):
    from sglang.srt.model_executor.pool_configurator import static_pool_size

    # free before weights 8 GiB, after weights 7.5 GiB, after start-up 6 GiB: three readings, no more.
    mr, left = _runner(_args(tiny_model_dir, mem_fraction_static=0.8), [8 * GiB, 15 * GiB // 2, 6 * GiB], monkeypatch)
    assert left == []
    r = mr.readings
    assert (r.free_before_weights_bytes, r.free_after_weights_bytes) == (8 * GiB, 15 * GiB // 2)
    assert mr.pool_size == static_pool_size(r, mr.pool_args)  # the decision, applied as decided
    # rest = 7.5 - 8 * 0.2 = 5.9 GiB over a cell of 2 kv heads * (16 + 16) * 2 layers * 4 bytes.
    assert r.kv.cell_size_bytes == 2 * 32 * 2 * 4
    assert mr.max_total_num_tokens == int(7.5 * GiB - 8 * GiB * (1 - 0.8)) // 512
    plan = mr.memory_plan
    assert plan.max_total_num_tokens == mr.max_total_num_tokens and plan.free_after_plan_gb == 6.0
    assert plan.weights_gb == 0.5 and plan.per_rank_available_gb == [7.5]
    assert mr.req_to_token_pool.size == mr.pool_size.max_running_requests == plan.max_running_requests


def test_the_allocator_owns_the_token_count(tiny_model_dir, monkeypatch):
    mr, _ = _runner(
        _args(tiny_model_dir, mem_fraction_static=0.8, max_total_tokens=512), [8 * GiB, 7 * GiB, 6 * GiB], monkeypatch
    )
    assert mr.max_total_num_tokens == mr.token_to_kv_pool_allocator.size == 512
    mr.token_to_kv_pool_allocator.resize(256)
    assert mr.max_total_num_tokens == 256  # nobody keeps a copy
    assert not hasattr(mr.token_to_kv_pool, "size")


def test_flag_off_plan_equals_flag_on_where_post_capture_cannot_run(tiny_model_dir, monkeypatch):
    """On the CPU the flag changes nothing: same path (with the reasons), same numbers."""
    plans = []
    for flag in (False, True):
        with envs.SGLANG_ENABLE_POST_CAPTURE_KV_SIZING.override(flag):
            mr, _ = _runner(_args(tiny_model_dir, mem_fraction_static=0.8), [8 * GiB, 7 * GiB, 6 * GiB], monkeypatch)
        plans.append(mr.memory_plan.to_dict())
    off, on = plans
    assert off["path"] == on["path"] == "static"
    assert "SGLANG_ENABLE_POST_CAPTURE_KV_SIZING is off" in off["path_reason"]
    assert "device is not CUDA" in on["path_reason"] and "is off" not in on["path_reason"]
    assert off | {"path_reason": ""} == on | {"path_reason": ""}


def test_readings_agree_over_ranks(tiny_model_dir, monkeypatch):
    """Injected peers: the other rank sees 1 GiB less free memory and a reservation 1000 bytes larger;
    this rank sizes from those (every rank then computes the same pool)."""
    from sglang.srt.distributed import parallel_state
    from sglang.srt.models.llama import LlamaForCausalLM

    class TwoRanks(parallel_state.GroupCoordinator):
        def all_gather_floats(self, value: float):
            peer = value - GiB if value > GiB else value + 1000
            return [float(value), float(peer)]

    monkeypatch.setattr(parallel_state, "initialize_model_parallel", lambda tp: None)
    monkeypatch.setattr(parallel_state, "_TP", TwoRanks(0, 2))
    monkeypatch.setattr(LlamaForCausalLM, "kt_prefill_slot", lambda self: _FakeSlot())
    mr, _ = _runner(_args(tiny_model_dir, mem_fraction_static=0.9), [8 * GiB, 6 * GiB, 5 * GiB], monkeypatch)
    r = mr.readings
    assert r.free_before_weights_bytes == 7 * GiB and r.free_after_weights_bytes == 5 * GiB
    assert r.reservations_bytes == {"kt_full_gpu_prefill_slot": 6000}
    assert mr.memory_plan.per_rank_available_gb == [6.0, 5.0]
    assert mr.max_total_num_tokens == (int(5 * GiB - 7 * GiB * (1 - 0.9)) - 6000) // r.kv.cell_size_bytes
