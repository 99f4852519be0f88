"""KT hybrid decode on the GPU: the CPU experts' step on the CUDA stream and inside CUDA graphs.

- the stream path (pinned buffers mapped for the GPU or copied; handed over by the doorbell or by host
  functions) gives bit for bit what the synchronous host call gives;
- a captured graph replays the step with new inputs each time, and a padded batch (num_real_tokens below
  the captured rows) computes only the real rows: the padding costs the CPU nothing;
- a tiny Qwen3-MoE with 3 of 8 experts on the GPU: decode is captured in CUDA graphs, greedy tokens with
  graphs equal those without and equal transformers' (fp32), for BF16 and INT8 experts (INT8 with fp32
  activations equals the all-GPU engine running the same experts), and for a pack-quantized INT4 checkpoint's own
  experts (RAWINT4, groups of 32) against transformers on the dequantized weights;
- post-capture KV sizing with CPU experts measures real graphs (no "decode runs eagerly" note).
"""

from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=120, suite="per-commit-cuda")

import contextlib

import pytest
import torch

from sglang.test.gpu_utils import REQUIRES_GPU_REASON, has_gpu

pytestmark = pytest.mark.skipif(not has_gpu(), reason=REQUIRES_GPU_REASON)

PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16], [40, 41, 42, 43, 44], [100, 7, 99, 3, 250, 17, 18]]
NEW_TOKENS = 12
E_GPU, E_CPU, HIDDEN, INTER, TOP_K = 4, 24, 256, 128, 8


def _engine_and_layer(method: str, capacity: int = 64, zero_copy: bool = True, doorbell: bool = True):
    """zero_copy False: the pinned buffers are not mapped for the GPU (the engine's fallback: it copies them)."""
    from unittest import mock

    from sglang.srt.layers.moe.cpu_experts import CpuExpertsEngine
    from sglang.srt.layers.moe.cpu_experts import engine as engine_module
    from sglang.srt.layers.moe.layer import make_moe_layer

    gen = torch.Generator().manual_seed(0)
    layer = make_moe_layer(E_CPU, HIDDEN, INTER, torch.bfloat16, method)
    for e in range(E_CPU):
        for shard, shape in (("w1", (INTER, HIDDEN)), ("w3", (INTER, HIDDEN)), ("w2", (HIDDEN, INTER))):
            layer.quant_method.load_expert(layer, e, shard, 0.1 * torch.randn(shape, generator=gen))
    with contextlib.nullcontext() if zero_copy else mock.patch.object(engine_module, "_mapped", lambda t: None):
        engine = CpuExpertsEngine(
            threads=8, hidden=HIDDEN, inter=INTER, top_k=TOP_K, num_cpu_experts=E_CPU, expert_offset=E_GPU,
            capacity=capacity, pin_memory=True, spin_us=200, doorbell=doorbell,
        )  # fmt: skip
    assert (engine.device_inputs is not None) == zero_copy  # the GPU writes the pinned block in place
    assert engine.handover == ("doorbell" if doorbell else "host functions")  # the self-test passes on CUDA
    return engine, engine.add_layer(layer, layer.quant_method), layer


def _routing(n: int, seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(n, HIDDEN, device="cuda", generator=gen).to(torch.bfloat16)
    logits = torch.randn(n, E_GPU + E_CPU, device="cuda", generator=gen)
    weights, ids = torch.topk(torch.softmax(logits, -1), TOP_K, dim=-1)
    return x, weights, ids.to(torch.int32)


HANDOVERS = pytest.mark.parametrize("doorbell", [True, False], ids=["doorbell", "host-functions"])


@HANDOVERS
@pytest.mark.parametrize("zero_copy", [True, False], ids=["mapped", "copied"])
@pytest.mark.parametrize("method", ["BF16", "INT8"])
def test_stream_step_equals_host_step(method, zero_copy, doorbell):
    engine, handle, _ = _engine_and_layer(method, zero_copy=zero_copy, doorbell=doorbell)
    x, w, ids = _routing(13, seed=1)
    ran = []
    base = torch.randn(13, HIDDEN, device="cuda")  # what "the GPU's experts" computed

    def gpu_work() -> torch.Tensor:
        ran.append(True)
        return base.clone()

    out = engine.run_on_stream(handle, x, w, ids, None, gpu_work)
    host = engine.run_on_host(handle, x.cpu(), w.cpu(), ids.cpu())
    assert ran == [True]  # the GPU's own work was enqueued once, between the step's start and end
    assert torch.equal(out.cpu(), base.cpu() + host)
    # A step longer than the buffers goes through in slices, still stream-ordered.
    x, w, ids = _routing(150, seed=2)
    out = engine.run_on_stream(handle, x, w, ids, None, lambda: torch.zeros(150, HIDDEN, device="cuda"))
    assert torch.equal(out.cpu(), engine.run_on_host(handle, x.cpu(), w.cpu(), ids.cpu()))


@HANDOVERS
def test_graph_replays_read_new_inputs_and_skip_padding(doorbell):
    engine, handle, _ = _engine_and_layer("BF16", doorbell=doorbell)
    rows = 16
    static_x, static_w, static_ids = _routing(rows, seed=3)
    num_real = torch.full((1,), rows, dtype=torch.int32, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        zeros = lambda: torch.zeros(rows, HIDDEN, device="cuda")  # noqa: E731
        engine.run_on_stream(handle, static_x, static_w, static_ids, num_real, zeros)  # warm-up
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            static_out = engine.run_on_stream(handle, static_x, static_w, static_ids, num_real, zeros)
    torch.cuda.synchronize()
    for step, real in enumerate([16, 5, 1, 11, 16, 3] * 4):
        x, w, ids = _routing(rows, seed=100 + step)
        static_x.copy_(x), static_w.copy_(w), static_ids.copy_(ids)
        num_real.fill_(real)
        before = engine.stats()
        graph.replay()
        torch.cuda.synchronize()
        done = engine.stats().minus(before)
        expected = engine.run_on_host(handle, x[:real].cpu(), w[:real].cpu(), ids[:real].cpu())
        assert torch.equal(static_out[:real].cpu(), expected), f"replay {step} ({real} real rows)"
        cpu_pairs = int((ids[:real] >= E_GPU).sum())
        assert done.steps == 1 and done.pairs == cpu_pairs  # padded rows were not computed
        assert done.experts_read == len(torch.unique(ids[:real][ids[:real] >= E_GPU]))


def _scheduler(path: str, int8_activations: bool = True, host_functions: bool = False, **kw):
    """int8_activations: the KT record's cpu_int8_activations; host_functions: hand steps over through host
    functions, as when the doorbell's self-test fails."""
    import dataclasses
    from unittest import mock

    from sglang.srt.configs.engine_config import resolve_engine_config
    from sglang.srt.layers.moe.cpu_experts import engine as engine_module
    from sglang.srt.managers.scheduler import build_scheduler
    from sglang.srt.server_args import ServerArgs
    from sglang.test.runners import OutputCollector

    kw = {"max_total_tokens": 4096, **kw}
    args = ServerArgs(
        model_path=path, skip_tokenizer_init=True, dtype="float32", kt_cpuinfer=8, cuda_graph_max_bs=4,
        log_level="warning", **kw,
    )  # fmt: skip
    collector = OutputCollector()
    config = resolve_engine_config(args)
    config = dataclasses.replace(config, kt=dataclasses.replace(config.kt, cpu_int8_activations=int8_activations))
    fail_self_test = mock.patch.object(engine_module, "_stream_memops_fail_reason", lambda lib: "forced by the test")
    with fail_self_test if host_functions else contextlib.nullcontext():
        return build_scheduler(config, output_sink=collector), collector


def _generate(sched, collector):
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams

    for i, p in enumerate(PROMPTS):
        params = SamplingParams.from_dict({"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True})
        sched.add_request(TokenizedGenerateReqInput(str(i), "", p, params, False, False))
    while sched.has_work():
        sched.step()
    return [collector.results[str(i)].output_ids for i in range(len(PROMPTS))]


@pytest.fixture(scope="module")
def tiny_moe():
    from sglang.test.runners import make_tiny_qwen3_moe

    path, model = make_tiny_qwen3_moe(seed=0)
    refs = [
        model.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False)[0, len(p) :].tolist()
        for p in PROMPTS
    ]
    return path, refs


@pytest.mark.parametrize("method", ["BF16", "INT8"])
def test_hybrid_decode_in_cuda_graphs(tiny_moe, method):
    path, refs = tiny_moe
    graphs, collector = _scheduler(path, kt_method=method, kt_num_gpu_experts=3)
    assert graphs.model_runner.cuda_graph_runner is not None  # decode with CPU experts was captured
    engine = graphs.model_runner.model.kt_state.cpu_engine
    assert engine.handover == "doorbell"  # where the self-test passes
    before = engine.stats()
    with_graphs = _generate(graphs, collector)
    assert engine.stats().minus(before).steps >= 2 * NEW_TOKENS  # both MoE layers ran the CPU kernel each step
    eager, collector = _scheduler(path, kt_method=method, kt_num_gpu_experts=3, disable_cuda_graph=True)
    assert eager.model_runner.cuda_graph_runner is None
    assert with_graphs == _generate(eager, collector)
    if method == "BF16":  # fp32 experts: the model's exact math
        assert with_graphs == refs
        # The other hand-over gives the same tokens.
        host_fns, collector = _scheduler(path, host_functions=True, kt_method=method, kt_num_gpu_experts=3)
        assert host_fns.model_runner.model.kt_state.cpu_engine.handover == "host functions"
        assert _generate(host_fns, collector) == refs
    else:  # int8 experts with int8 activations (W8A8, the default): graphs equal eager, checked above
        assert graphs.model_runner.model.kt_state.cpu_engine.layers[0].int8_dot
        # With fp32 activations: the same tokens as the all-GPU engine running the same int8 experts.
        w8a16, collector = _scheduler(path, int8_activations=False, kt_method=method, kt_num_gpu_experts=3)
        w8a16_tokens = _generate(w8a16, collector)
        gpu_only, collector = _scheduler(path, kt_method=method, kt_num_gpu_experts=8)
        assert w8a16_tokens == _generate(gpu_only, collector)


def test_int4_checkpoint_experts_in_cuda_graphs(tiny_moe, tmp_path):
    """The tiny model's routed experts pack-quantized in groups of 32 (compressed-tensors, as Kimi-K2-Thinking ships
    them) under --kt-method RAWINT4: the GPU-side experts and the CPU kernels hold the checkpoint's code bytes (the
    fused MoE's INT4 groups of 32 on the GPU), decode is captured, and greedy tokens with graphs equal those
    without and equal transformers' (fp32) on the dequantized weights."""
    from sglang.test.int4_checkpoints import write_int4_experts_checkpoint
    from sglang.test.runners import hf_greedy

    d = write_int4_experts_checkpoint(tiny_moe[0], str(tmp_path / "int4"), group=32)
    refs = hf_greedy(d + "-dequantized", PROMPTS, NEW_TOKENS)
    graphs, collector = _scheduler(d, kt_method="RAWINT4", kt_num_gpu_experts=3)
    assert graphs.model_runner.config.kt.method == "INT4_G32"
    assert graphs.model_runner.cuda_graph_runner is not None
    with_graphs = _generate(graphs, collector)
    eager, collector = _scheduler(d, kt_method="RAWINT4", kt_num_gpu_experts=3, disable_cuda_graph=True)
    assert with_graphs == _generate(eager, collector)
    assert with_graphs == refs


def test_post_capture_sizing_measures_graphs_with_cpu_experts(tiny_moe):
    from sglang.srt.environ import envs

    path, refs = tiny_moe
    with envs.SGLANG_ENABLE_POST_CAPTURE_KV_SIZING.override(True):
        sched, collector = _scheduler(path, kt_method="BF16", kt_num_gpu_experts=3, max_total_tokens=None)
    runner = sched.model_runner
    try:
        assert runner.sizing_path.post_capture
        assert runner.capture_readings.captured_graph_max_bs == 4
        assert not any("eagerly" in note for note in runner.memory_plan.notes)
        assert _generate(sched, collector) == refs
    finally:
        runner.shutdown()  # the pool took the device's free memory: give it back to the next tests
