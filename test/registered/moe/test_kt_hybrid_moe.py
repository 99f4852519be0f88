"""KT hybrid CPU/GPU experts on a tiny random Qwen3-MoE, on the CPU (the "GPU" experts are the model
device's, the rest go through the CPU expert backend).

- greedy tokens equal transformers' with 0, some and all experts on the model device;
- for every quant method the reservation equals, to the byte, what the real slot allocates;
- the hybrid and full-GPU paths agree within the method's tolerance;
- the fallback for real: a host budget too small for the slot -> error naming the knobs, the path
  switched off, every request still answered.
"""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="per-commit-cpu")

import logging

import pytest
import torch

from sglang.srt.environ import envs

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
NEW_TOKENS = 12
METHODS = ["BF16", "FP8", "INT8", "INT4", "MXFP4"]


@pytest.fixture(scope="module")
def model_dir():
    from sglang.test.runners import make_tiny_qwen3_moe

    path, model = make_tiny_qwen3_moe(seed=0)
    ref = model.generate(torch.tensor([PROMPT]), max_new_tokens=NEW_TOKENS, do_sample=False)[0, len(PROMPT) :].tolist()
    return path, ref


def _scheduler(path: str, int8_activations: bool = True, **kt):
    """`int8_activations`: the KT record's cpu_int8_activations (False: fp32 activations for INT8 experts)."""
    import dataclasses

    from sglang.srt.configs.engine_config import resolve_engine_config
    from sglang.srt.managers.scheduler import build_scheduler
    from sglang.srt.server_args import ServerArgs

    outputs = {}

    def sink(out):
        for rid, ids in zip(out.rids, out.output_ids):
            outputs.setdefault(rid, []).extend(ids)

    args = ServerArgs(
        model_path=path, device="cpu", skip_tokenizer_init=True, max_total_tokens=2048, log_level="warning", **kt
    )
    config = resolve_engine_config(args)
    if config.kt is not None:
        config = dataclasses.replace(config, kt=dataclasses.replace(config.kt, cpu_int8_activations=int8_activations))
    return build_scheduler(config, output_sink=sink), outputs


def _generate(sched, outputs, prompts):
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams

    for i, p in enumerate(prompts):
        params = SamplingParams.from_dict({"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True})
        sched.add_request(TokenizedGenerateReqInput(str(i), "", p, params, False, False))
    while sched.has_work():
        sched.step()
    return [outputs[str(i)] for i in range(len(prompts))]


@pytest.mark.parametrize("num_gpu_experts", [0, 3, 8])
def test_greedy_matches_transformers(model_dir, num_gpu_experts):
    path, ref = model_dir
    sched, outputs = _scheduler(path, kt_method="BF16", kt_num_gpu_experts=num_gpu_experts)
    assert _generate(sched, outputs, [PROMPT]) == [ref]
    engine = sched.model_runner.model.kt_state.cpu_engine
    if num_gpu_experts == 8:
        assert engine is None  # nothing left for the CPU kernel
    else:  # every MoE layer of every forward (prefill + decodes) went through the CPU kernel
        stats = engine.stats()
        assert len(engine.layers) == 2 and stats.steps == 2 * NEW_TOKENS and stats.pairs > 0


def _wrappers(sched):
    from sglang.srt.layers.moe.kt_ep_wrapper import KTEPWrapperMethod

    return [m for m in sched.model_runner.model.modules() if isinstance(m, KTEPWrapperMethod)]


@pytest.mark.parametrize("method", METHODS)
def test_reservation_exact_and_paths_agree(model_dir, method):
    from sglang.srt.layers.moe.layer import param_bytes
    from sglang.srt.layers.moe.topk import select_experts

    path, _ = model_dir
    # fp32 activations for INT8 too, so that both paths compute the same math (the int8-activation path's
    # error is bounded by the kernel tests' int8 reference).
    sched, _ = _scheduler(
        path, int8_activations=False, kt_method=method, kt_num_gpu_experts=3, kt_gpu_prefill_token_threshold=8
    )
    reservation = sched.model_runner.memory_plan.reservations_bytes["kt_full_gpu_prefill_slot"]
    wrapper = _wrappers(sched)[0]
    slot = wrapper.kt_state.prefill_slot
    assert param_bytes(slot.acquire()) == reservation == slot.nbytes  # the real slot, byte for byte
    # Hybrid (3 experts local + 5 on the CPU backend) vs the full layer streamed into the slot.
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(16, 128, generator=gen)
    router = torch.randn(16, 8, generator=gen)
    hybrid = wrapper(x, router, is_prefill=False)
    full = wrapper(x, router, is_prefill=True)
    assert slot.loaded_layer_id == wrapper.layer_id
    # Both equal the dense mixture of the same (de)quantized experts.
    weights, ids = select_experts(router, 2, wrapper.renormalize)
    dense = torch.zeros_like(x)
    for e in range(8):
        home, idx = wrapper.expert_home(e)
        w13, w2 = home.quant_method.dequantize_expert(home, idx)
        h = torch.nn.functional.silu(x @ w13[:128].T) * (x @ w13[128:].T)
        dense += ((ids == e).float() * weights).sum(-1, keepdim=True) * (h @ w2.T)
    # Both paths read the same stored (quantized) experts, so on the CPU they differ by fp32 rounding only.
    scale = dense.abs().max()
    assert (hybrid - dense).abs().max() <= 1e-5 * scale
    assert (full - dense).abs().max() <= 1e-5 * scale


def test_fallback_when_the_slot_does_not_fit(model_dir, caplog):
    path, ref = model_dir
    sched, outputs = _scheduler(path, kt_method="BF16", kt_num_gpu_experts=3, kt_gpu_prefill_token_threshold=4)
    # A host "device" budget below what the process already holds: nothing is free for the slot.
    with envs.SGLANG_CPU_MEMORY_BUDGET_GB.override(0.01), caplog.at_level(logging.ERROR):
        results = _generate(sched, outputs, [PROMPT, PROMPT[:6], PROMPT[::-1]])
    slot = sched.model_runner.kt_prefill_slot
    assert slot.disabled and slot.layer is None
    assert any(
        "--mem-fraction-static" in r.message and "--kt-gpu-prefill-token-threshold 0" in r.message
        for r in caplog.records
    )
    assert all(len(r) == NEW_TOKENS for r in results)
    assert results[0] == ref  # served by the hybrid path, same tokens


def test_kt_state_is_one_per_model(model_dir):
    """Every MoE layer of a model shares its model's KT state, and models share nothing: one model
    losing its full-GPU path (the slot did not fit) leaves another's alone."""
    path, _ = model_dir
    first, _ = _scheduler(path, kt_method="BF16", kt_num_gpu_experts=3, kt_gpu_prefill_token_threshold=4)
    second, _ = _scheduler(path, kt_method="BF16", kt_num_gpu_experts=3, kt_gpu_prefill_token_threshold=4)
    states = [sched.model_runner.model.kt_state for sched in (first, second)]
    assert states[0] is not states[1]
    for sched, state in zip((first, second), states):
        assert all(w.kt_state is state for w in _wrappers(sched)) and len(_wrappers(sched)) == 2
    slots = [state.prefill_slot for state in states]
    slots[0].disabled = True
    x, router = torch.randn(8, 128), torch.randn(8, 8)
    _wrappers(first)[0](x, router, is_prefill=True)  # the first model's path is off: hybrid, nothing built
    _wrappers(second)[0](x, router, is_prefill=True)  # builds the second model's slot only
    assert slots[1].layer is not None and slots[0].layer is None
    assert slots[1].release() > 0 and slots[1].layer is None
    assert None not in (states[0].cpu_engine, states[1].cpu_engine)
    assert states[0].cpu_engine is not states[1].cpu_engine


def test_cpu_threads_default_shares_the_cpus_out_over_ranks(model_dir):
    """Without --kt-cpuinfer every tensor-parallel rank's pool takes its share of the usable CPUs (a pool per
    rank, each spinning between layers, must not oversubscribe the host); with it, the flag's count."""
    import os

    from sglang.srt.configs.engine_config import resolve_engine_config
    from sglang.srt.server_args import ServerArgs

    path, _ = model_dir
    cores = len(os.sched_getaffinity(0))
    for tp in (1, 2):
        sa = ServerArgs(model_path=path, device="cpu", tp_size=tp, kt_method="BF16", kt_num_gpu_experts=3)
        assert resolve_engine_config(sa).kt.cpu_threads == max(1, cores // tp)
    sa = ServerArgs(model_path=path, device="cpu", tp_size=2, kt_method="BF16", kt_num_gpu_experts=3, kt_cpuinfer=1)
    assert resolve_engine_config(sa).kt.cpu_threads == 1


@pytest.mark.parametrize("int8_activations", [True, False])
def test_int8_activations_reach_the_kernel(model_dir, int8_activations):
    """The KT record's cpu_int8_activations (default on): INT8 CPU experts take the kernel's int8 path where the
    CPU has AVX512-VNNI, or fp32 activations when off, and the model generates either way (the activations'
    rounding may change tokens: the mixture's error is bounded by the kernel tests' int8 reference)."""
    from sglang.srt.configs.kt_config import KTConfig

    path, _ = model_dir
    flags = set(open("/proc/cpuinfo").read().split())
    assert KTConfig("INT8", None, 1, 3, None).cpu_int8_activations  # the default
    sched, outputs = _scheduler(path, int8_activations=int8_activations, kt_method="INT8", kt_num_gpu_experts=3)
    engine = sched.model_runner.model.kt_state.cpu_engine
    assert engine.int8_activations == int8_activations and len(engine.layers) == 2
    vnni = {"avx512_vnni", "avx512bw"} <= flags
    assert all(layer.int8_dot == (int8_activations and vnni) for layer in engine.layers)
    (tokens,) = _generate(sched, outputs, [PROMPT])
    assert len(tokens) == NEW_TOKENS and engine.stats().steps == 2 * NEW_TOKENS
