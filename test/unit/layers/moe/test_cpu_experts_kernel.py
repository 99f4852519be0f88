"""The C++ CPU experts kernel (layers/moe/cpu_experts) against the fp32 torch reference, on the host only.

Every storage format the kernel decodes, shapes with scalar tails, GPU-owned ids that must contribute
nothing, the slicing path of run_on_host, the step statistics, determinism across thread counts,
several engines alive at once and their teardown (the worker threads must exit).
"""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=30, suite="per-commit-cpu")

import functools
import gc
import os
import platform
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Optional

import pytest
import torch

from sglang.srt.layers.moe import cpu_experts
from sglang.srt.layers.moe.cpu_experts import CpuExpertsEngine, CpuExpertsStats, kernel_format
from sglang.srt.layers.moe.fused_moe_native import fused_moe_native
from sglang.srt.layers.moe.layer import make_moe_layer
from sglang.srt.layers.quantization import get_moe_method
from sglang.srt.layers.quantization.base_config import W2, W13
from sglang.srt.layers.quantization.int4 import Int4FusedMoEMethod

# pytest-timeout (test extras): "thread" also ends a hang inside a C call (a join that never returns).
pytestmark = pytest.mark.timeout(60, method="thread")

NUM_CPU_EXPERTS = 6
EXPERT_OFFSET = 4  # global ids 0..3 belong to the GPU, 4..9 to the CPU engine
CAPACITY = 16
REL_TOL = 1e-5
# The bf16 path rounds activations to bf16 as reference_bf16 does (measured: within 2e-7 of it; the fp32
# reference is 2e-3 to 6e-3 away). A gate . x that differs in its last fp32 bit could round one activation
# the other way: the margin allows that (measured on the 160- and 192-wide INT4 cases, 5 tokens x 4 experts, 12
# seeds each: 2 of 24 runs at 5.8e-5 and 1.0e-4, one other at 1.6e-4, the rest 1.7e-7 to 1.4e-6), and is still
# ~10x tighter than the fp32 reference's distance; a wrong scale or group is off by 1e-2 and more.
BF16_REL_TOL = 3e-4
_CPU_FLAGS = set(open("/proc/cpuinfo").read().split()) if os.path.exists("/proc/cpuinfo") else set()
HAS_BF16_DOT = "avx512_bf16" in _CPU_FLAGS
HAS_INT8_DOT = {"avx512_vnni", "avx512bw"} <= _CPU_FLAGS  # the kernel's int8 path (vpdpbusd)


@dataclass(frozen=True)
class Case:
    method: str
    params_dtype: torch.dtype
    hidden: int
    inter: int
    group: Optional[int] = None  # INT4 group size other than the default 128
    int8_activations: bool = False  # the engine quantizes activations too (SGLANG_KT_CPU_INT8_ACTIVATIONS)


# hidden / inter are chosen so the 16- and 32-wide vector loops leave scalar tails wherever the format's
# check_sizes allows it (INT4 / MXFP4 need even sizes, FP8 needs inter % 128 == 0), and so the group /
# block scales include a partial last group.
CASES = {
    "bf16-f32": Case("BF16", torch.float32, hidden=100, inter=50),
    "bf16-bf16": Case("BF16", torch.bfloat16, hidden=72, inter=45),
    "int8": Case("INT8", torch.bfloat16, hidden=90, inter=37),
    # 64-wide int8 chunks: 90 = 64 + a masked 26, 37 = a masked chunk only; 130 / 70: two full chunks + 2 / 6.
    "int8-act": Case("INT8", torch.bfloat16, hidden=90, inter=37, int8_activations=True),
    "int8-act-wide": Case("INT8", torch.float32, hidden=130, inter=70, int8_activations=True),
    "int4": Case("INT4", torch.bfloat16, hidden=150, inter=70),  # w13: groups of 128 + 22
    "int4-g32": Case("INT4", torch.bfloat16, hidden=80, inter=48, group=32),  # 32+32+16 / 32+16
    # Kimi-K2-Thinking's groups of 32, and 64, over whole 128-value steps of the bf16 path and a tail: 2 x 128 + 32
    # / 128 + 32, and 2 x 128 + 64 / 128 + 64.
    "int4-g32-wide": Case("INT4", torch.bfloat16, hidden=288, inter=160, group=32),
    "int4-g64": Case("INT4", torch.bfloat16, hidden=320, inter=192, group=64),
    # Groups narrower than the kernel's 32-value chunk: the scalar path for whole rows.
    "int4-g16": Case("INT4", torch.bfloat16, hidden=56, inter=40, group=16),
    "fp8": Case("FP8", torch.bfloat16, hidden=200, inter=128),  # blocks 128 + 72 along H, w2 rows too
    # One scale per row (the kernel's FP8 with a group spanning the row): vector chunks and scalar tails.
    "fp8-perchannel": Case("FP8_PERCHANNEL", torch.bfloat16, hidden=90, inter=37),
    "mxfp4": Case("MXFP4", torch.bfloat16, hidden=150, inter=70),  # 4 blocks of 32 + 22
}


@functools.lru_cache(maxsize=None)
def loaded_layer(name: str) -> torch.nn.Module:
    """The CPU experts of one layer in `name`'s format, filled with random weights (built once)."""
    case = CASES[name]
    if case.group is None:
        layer = make_moe_layer(NUM_CPU_EXPERTS, case.hidden, case.inter, case.params_dtype, case.method)
    else:  # make_moe_layer's recipe with a non-default group size
        layer = torch.nn.Module()
        quant = Int4FusedMoEMethod(group_size=case.group)
        quant.create_weights(layer, NUM_CPU_EXPERTS, case.hidden, case.inter, case.params_dtype)
        layer.quant_method = quant
    g = torch.Generator().manual_seed(1234 + len(name))
    hid, inter = case.hidden, case.inter
    for e in range(NUM_CPU_EXPERTS):
        shards = {
            "w1": torch.randn(inter, hid, generator=g) / hid**0.5,
            "w3": torch.randn(inter, hid, generator=g) / hid**0.5,
            "w2": torch.randn(hid, inter, generator=g) / inter**0.5,
        }
        for shard, weight in shards.items():
            layer.quant_method.load_expert(layer, e, shard, weight)
    return layer


_ENGINES: list = []  # weak references: a test that drops an engine must see it collected


@pytest.fixture(autouse=True)
def _destroy_engines():
    """Close every engine a test built that is still alive (its threads end)."""
    yield
    while _ENGINES:
        engine = _ENGINES.pop()()
        if engine is not None:
            engine.close()


def make_engine(
    layer: torch.nn.Module,
    top_k: int,
    threads: int = 2,
    capacity: int = CAPACITY,
    int8_activations: bool = False,
    library=None,
):
    spec = layer.moe_weight_spec
    engine = CpuExpertsEngine(
        threads=threads,
        hidden=spec.hidden_size,
        inter=spec.intermediate_size,
        top_k=top_k,
        num_cpu_experts=NUM_CPU_EXPERTS,
        expert_offset=EXPERT_OFFSET,
        capacity=capacity,
        pin_memory=False,
        spin_us=50,
        int8_activations=int8_activations,
        library=library,
    )
    _ENGINES.append(weakref.ref(engine))
    return engine, engine.add_layer(layer, layer.quant_method)


def dequantized_fp32(layer: torch.nn.Module, e: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert `e` decoded straight to float32 (dequantize_expert would round to a bf16 params_dtype)."""
    q, spec = layer.quant_method, layer.moe_weight_spec
    out = []
    for prefix in (W13, W2):
        qweight, scale = q.stored(layer, prefix)
        rows, cols = spec.matrix_shape(prefix)
        out.append(q.dequantize(qweight[e], None if scale is None else scale[e], rows, cols, torch.float32))
    return out[0], out[1]


def local_ids(topk_ids: torch.Tensor) -> torch.Tensor:
    """Global ids -> the engine's expert index, -1 for every id that is not one of its experts."""
    mine = (topk_ids >= EXPERT_OFFSET) & (topk_ids < EXPERT_OFFSET + NUM_CPU_EXPERTS)
    return torch.where(mine, topk_ids - EXPERT_OFFSET, torch.full_like(topk_ids, -1))


def takes_bf16_path(layer: torch.nn.Module) -> bool:
    """Whether the kernel runs this layer on its bf16 path: a bf16 model, BF16 experts or INT4 experts with
    groups of 32, 64 or a multiple of 128, a CPU with AVX512-BF16."""
    q = layer.quant_method
    bf16_model = layer.moe_weight_spec.params_dtype == torch.bfloat16
    int4_groups = q.name == "INT4" and (q.group % 128 == 0 or q.group in (32, 64))
    return HAS_BF16_DOT and bf16_model and (q.name == "BF16" or int4_groups)


def takes_int8_path(name: str) -> bool:
    """Case `name`'s engine asks for int8 activations and this CPU has the kernel's int8 path."""
    return HAS_INT8_DOT and CASES[name].int8_activations


def tolerance(layer: torch.nn.Module, int8: bool = False) -> float:
    # The int8 path's sums are exact integers; as on the bf16 path, one activation whose last fp32 bit
    # differs (the kernel's exp is not torch's) may round to the next integer level.
    return BF16_REL_TOL if takes_bf16_path(layer) or int8 else REL_TOL


def reference(layer: torch.nn.Module, x, topk_weights, topk_ids, int8: bool = False) -> torch.Tensor:
    """What the kernel must compute for this layer (reference_fp32, reference_bf16, or reference_int8 for
    an engine on the int8 path)."""
    fn = reference_int8 if int8 else reference_bf16 if takes_bf16_path(layer) else reference_fp32
    return fn(layer, x, topk_weights, topk_ids)


def quantize_rows_int8(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The int8 path's activations: per row, scale max|v| / 127 (1 for an all-zero row), levels rounded to
    nearest even, all in fp32 as the kernel computes them."""
    amax = v.abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    return torch.round(v / scale[..., None]), scale


def int8_dots(q_weight: torch.Tensor, w_scale: torch.Tensor, q_x: torch.Tensor, x_scale: torch.Tensor) -> torch.Tensor:
    """Exact integer dots, then (float(dot) * x_scale) * row_scale in fp32 (the kernel's order)."""
    dots = (q_weight.double() @ q_x.double()).float()
    return dots * x_scale * w_scale


def pairwise_mixture(x, topk_weights, topk_ids, expert_out) -> torch.Tensor:
    """out[t] = sum over token t's CPU-expert slots j of weight * expert_out(e, t), slot by slot."""
    local = local_ids(topk_ids)
    out = torch.zeros(x.shape[0], x.shape[1])
    for t in range(x.shape[0]):
        for j in range(topk_ids.shape[1]):
            e = int(local[t, j])
            if e >= 0:
                out[t] += float(topk_weights[t, j]) * expert_out(e, t)
    return out


def reference_int8(layer: torch.nn.Module, x, topk_weights, topk_ids) -> torch.Tensor:
    """What the int8 path computes: tokens and act quantized (quantize_rows_int8), int8 weights as stored."""
    inter = layer.moe_weight_spec.intermediate_size
    (w13, s13), (w2, s2) = (layer.quant_method.stored(layer, prefix) for prefix in (W13, W2))
    q_x, x_scale = quantize_rows_int8(x.float())

    def expert_out(e: int, t: int) -> torch.Tensor:
        h = int8_dots(w13[e], s13[e].float(), q_x[t], x_scale[t])
        gate, up = h[:inter], h[inter:]
        q_act, act_scale = quantize_rows_int8(gate / (1.0 + torch.exp(-gate)) * up)
        return int8_dots(w2[e], s2[e].float(), q_act, act_scale)

    return pairwise_mixture(x, topk_weights, topk_ids, expert_out)


def reference_fp32(layer: torch.nn.Module, x, topk_weights, topk_ids) -> torch.Tensor:
    return fused_moe_native(
        x.float(), topk_weights, local_ids(topk_ids), lambda e: dequantized_fp32(layer, e), compute_dtype=None
    )


def reference_bf16(layer: torch.nn.Module, x, topk_weights, topk_ids) -> torch.Tensor:
    """What the bf16 path computes: each dot's activations rounded to bf16 (x, then silu(gate) * up), the
    products summed in fp32."""
    inter = layer.moe_weight_spec.intermediate_size
    xb = x.to(torch.bfloat16).float()

    def expert_out(e: int, t: int) -> torch.Tensor:
        w13, w2 = (w.float() for w in dequantized_fp32(layer, e))
        h = w13 @ xb[t]
        return w2 @ (torch.nn.functional.silu(h[:inter]) * h[inter:]).to(torch.bfloat16).float()

    return pairwise_mixture(x, topk_weights, topk_ids, expert_out)


def routing(tokens: int, top_k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct ids per token over GPU and CPU experts. Token 0 always reaches a CPU expert; with more
    than one token, every third token from 1 on is routed to GPU experts only, and token 2 has a
    dropped (-1) slot."""
    g = torch.Generator().manual_seed(seed)
    total = EXPERT_OFFSET + NUM_CPU_EXPERTS
    ids = torch.empty(tokens, top_k, dtype=torch.int64)
    for t in range(tokens):
        ids[t] = torch.randperm(total, generator=g)[:top_k]
        if tokens > 1 and t % 3 == 1:
            ids[t] = torch.randperm(EXPERT_OFFSET, generator=g)[:top_k]
        elif bool((ids[t] < EXPERT_OFFSET).all()):
            ids[t, 0] = EXPERT_OFFSET + int(torch.randint(NUM_CPU_EXPERTS, (1,), generator=g))
    if tokens > 2:
        ids[2, -1] = -1
    weights = torch.rand(tokens, top_k, generator=g) + 0.05
    return weights / weights.sum(dim=1, keepdim=True), ids


def inputs(hidden: int, tokens: int, top_k: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed + 7919)
    x = torch.randn(tokens, hidden, generator=g)
    weights, ids = routing(tokens, top_k, seed)
    return x, weights, ids


def expert_bytes(layer: torch.nn.Module) -> int:
    """Weight + scale bytes of one stored expert (w13 and w2), from the layer's parameters."""
    total = 0
    for prefix in (W13, W2):
        for t in layer.quant_method.stored(layer, prefix):
            if t is not None:
                total += t[0].numel() * t.element_size()
    return total


def task_count() -> int:
    return len(os.listdir("/proc/self/task"))


# ----------------------------------------------------------------------------------------- accuracy


@pytest.mark.parametrize("top_k", [1, 4])
@pytest.mark.parametrize("tokens", [1, 5, CAPACITY + 3])
@pytest.mark.parametrize("name", list(CASES))
def test_matches_fp32_reference(name: str, tokens: int, top_k: int):
    layer = loaded_layer(name)
    H = layer.moe_weight_spec.hidden_size
    x, weights, ids = inputs(H, tokens, top_k, seed=tokens * 10 + top_k)
    engine, handle = make_engine(layer, top_k, int8_activations=CASES[name].int8_activations)

    out = engine.run_on_host(handle, x, weights, ids)
    # bf16 models with BF16 / INT4 experts take the bf16 path wherever the CPU has AVX512-BF16; INT8 experts
    # the int8 path where the engine asks for it and the CPU has AVX512-VNNI.
    bf16_cases = ("bf16-bf16", "int4", "int4-g32", "int4-g32-wide", "int4-g64")
    assert handle.bf16_dot == takes_bf16_path(layer) == (HAS_BF16_DOT and name in bf16_cases)
    assert handle.int8_dot == takes_int8_path(name) == (HAS_INT8_DOT and name.startswith("int8-act"))
    int8 = takes_int8_path(name)
    ref = reference(layer, x, weights, ids, int8=int8)
    tol = tolerance(layer, int8=int8)

    assert out.shape == (tokens, H) and out.dtype == torch.float32
    scale = ref.abs().max().item()
    assert scale > 0  # token 0 always reaches a CPU expert
    err = (out - ref).abs().max().item()
    assert err <= tol * scale, f"{name}: max error {err:.3e} vs reference max {scale:.3e}"
    # Tokens routed to GPU experts only get exactly nothing from the CPU.
    gpu_only = ~((ids >= EXPERT_OFFSET) & (ids < EXPERT_OFFSET + NUM_CPU_EXPERTS)).any(dim=1)
    if tokens > 1:
        assert bool(gpu_only.any())
    assert torch.equal(out[gpu_only], torch.zeros_like(out[gpu_only]))


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64-v3 is an x86 target")
@pytest.mark.parametrize("name", list(CASES))
def test_portable_build_matches_fp32_reference(name: str):
    """The kernel built for x86-64-v3 (AVX2, no AVX-512: its generic vector code, no bf16 or int8 dot paths)
    matches the fp32 reference: a CPU without AVX-512 builds and runs every format (it once did not build)."""
    from sglang.srt.layers.moe.cpu_experts.build import load_kernel_library

    layer = loaded_layer(name)
    x, weights, ids = inputs(layer.moe_weight_spec.hidden_size, 5, 4, seed=7)
    library = load_kernel_library(march="x86-64-v3")
    engine, handle = make_engine(layer, 4, int8_activations=CASES[name].int8_activations, library=library)
    out = engine.run_on_host(handle, x, weights, ids)
    assert not handle.bf16_dot and not handle.int8_dot
    ref = reference_fp32(layer, x, weights, ids)
    err, scale = (out - ref).abs().max().item(), ref.abs().max().item()
    assert scale > 0 and err <= REL_TOL * scale, f"{name}: max error {err:.3e} vs reference max {scale:.3e}"


def test_duplicate_ids_and_out_of_range_ids():
    """The same CPU expert twice in one token counts twice; ids past the CPU range are not the engine's."""
    layer = loaded_layer("int8")
    H = layer.moe_weight_spec.hidden_size
    x, weights, _ = inputs(H, 4, 4, seed=3)
    last = EXPERT_OFFSET + NUM_CPU_EXPERTS - 1
    ids = torch.tensor(
        [
            [EXPERT_OFFSET, EXPERT_OFFSET, 1, last],
            [last + 1, last + 5, EXPERT_OFFSET + 2, 0],
            [last, last, last, last],
            [-1, -1, last + 1, 3],
        ]
    )
    engine, handle = make_engine(layer, 4)
    out = engine.run_on_host(handle, x, weights, ids)
    ref = reference(layer, x, weights, ids)
    assert (out - ref).abs().max().item() <= tolerance(layer) * ref.abs().max().item()
    assert torch.equal(out[3], torch.zeros(H))
    # Expert `last` four times with weights w equals it once with weight sum(w).
    summed = torch.tensor([[weights[2].sum().item(), 0.0, 0.0, 0.0]])
    once = engine.run_on_host(handle, x[2:3], summed, torch.tensor([[last, -1, -1, -1]]))
    assert (out[2:3] - once).abs().max().item() <= tolerance(layer) * once.abs().max().item()


@pytest.mark.parametrize("name", ["bf16-bf16", "int4"])
def test_many_tokens_on_one_expert(name: str):
    """More pairs on one expert than the kernel's block of 64 (a prefill-sized step): 75 tokens all
    routed to one CPU expert, the second slot spread over the others."""
    layer = loaded_layer(name)
    H = layer.moe_weight_spec.hidden_size
    tokens = 75
    x, weights, ids = inputs(H, tokens, 2, seed=51)
    ids[:, 0] = EXPERT_OFFSET + 1
    ids[:, 1] = torch.where(ids[:, 1] == EXPERT_OFFSET + 1, EXPERT_OFFSET + 2, ids[:, 1])
    engine, handle = make_engine(layer, 2, capacity=80)
    out = engine.run_on_host(handle, x, weights, ids)
    ref = reference(layer, x, weights, ids)
    err = (out - ref).abs().max().item()
    assert err <= tolerance(layer) * ref.abs().max().item()
    assert engine.stats().steps == 1


# -------------------------------------------------------------------------------------------- stats


@pytest.mark.parametrize("name", ["bf16-f32", "bf16-bf16", "int8", "int4", "fp8", "fp8-perchannel", "mxfp4"])
def test_stats(name: str):
    layer = loaded_layer(name)
    H = layer.moe_weight_spec.hidden_size
    top_k, tokens = 4, 2 * CAPACITY + 5  # three slices: 16, 16, 5
    x, weights, ids = inputs(H, tokens, top_k, seed=11)
    engine, handle = make_engine(layer, top_k)
    assert engine.stats() == CpuExpertsStats(0, 0, 0, 0, 0, 0)

    engine.run_on_host(handle, x, weights, ids)
    stats = engine.stats()

    local = local_ids(ids)
    slices = [local[s : s + CAPACITY] for s in range(0, tokens, CAPACITY)]
    experts = sum(int(torch.unique(s[s >= 0]).numel()) for s in slices)
    assert len(slices) == 3
    assert stats.steps == 3
    assert stats.pairs == int((local >= 0).sum())
    assert stats.experts_read == experts
    per_expert = expert_bytes(layer)
    assert stats.bytes_read == experts * per_expert
    assert stats.wait_blocked_ns >= 0

    # Totals accumulate; minus() gives the second run's share alone.
    engine.run_on_host(handle, x[:5], weights[:5], ids[:5])
    delta = engine.stats().minus(stats)
    first = local[:5]
    assert delta.steps == 1
    assert delta.pairs == int((first >= 0).sum())
    assert delta.experts_read == int(torch.unique(first[first >= 0]).numel())
    assert delta.bytes_read == delta.experts_read * per_expert


def test_step_timings_are_not_negative():
    """Each step's compute_ns is measured from submit to the last task: the waiter must see the finish time of
    this step (a race once read the previous step's, or 0 on the first, and added a negative time)."""
    layer = loaded_layer("int8")
    x, weights, ids = inputs(layer.moe_weight_spec.hidden_size, 5, 4, seed=1)
    engine, handle = make_engine(layer, 4, threads=3)
    previous = engine.stats()
    for i in range(200):
        engine.run_on_host(handle, x, weights, ids)
        now = engine.stats()
        step = now.minus(previous)
        previous = now
        assert step.compute_ns >= 0, f"step {i}: compute_ns {step.compute_ns}"
        assert step.wait_blocked_ns <= step.compute_ns


def test_expert_bytes_match_formats():
    """The per-expert byte counts test_stats expects, spelled out from each format's layout."""
    for name, case in CASES.items():
        h, i = case.hidden, case.inter
        n = 3 * h * i  # w13 [2i, h] plus w2 [h, i] elements
        group = case.group or 128
        expected = {
            "BF16": n * (4 if case.params_dtype == torch.float32 else 2),
            "INT8": n + 4 * (2 * i + h),
            "INT4": n // 2 + 4 * (2 * i * -(-h // group) + h * -(-i // group)),
            "FP8": n + 4 * (-(-2 * i // 128) * -(-h // 128) + -(-h // 128) * -(-i // 128)),
            "FP8_PERCHANNEL": n + 4 * (2 * i + h),
            "MXFP4": n // 2 + (2 * i * -(-h // 32) + h * -(-i // 32)),
        }[case.method]
        assert expert_bytes(loaded_layer(name)) == expected, name


# ------------------------------------------------------------------------------------------ edge cases


def test_zero_tokens():
    layer = loaded_layer("int4")
    H = layer.moe_weight_spec.hidden_size
    engine, handle = make_engine(layer, 2)
    out = engine.run_on_host(handle, torch.empty(0, H), torch.empty(0, 2), torch.empty(0, 2, dtype=torch.int64))
    assert out.shape == (0, H) and out.dtype == torch.float32
    # The engine still works afterwards.
    x, weights, ids = inputs(H, 3, 2, seed=5)
    out = engine.run_on_host(handle, x, weights, ids)
    ref = reference(layer, x, weights, ids)
    assert (out - ref).abs().max().item() <= tolerance(layer) * ref.abs().max().item()


@pytest.mark.parametrize("name", ["bf16-f32", "mxfp4"])
def test_gpu_only_tokens_give_exact_zeros(name: str):
    layer = loaded_layer(name)
    H = layer.moe_weight_spec.hidden_size
    top_k, tokens = 3, CAPACITY + 3
    engine, handle = make_engine(layer, top_k)
    # Leave non-zero results in the engine's buffers first: nothing of them may leak into the next step.
    x, weights, ids = inputs(H, tokens, top_k, seed=9)
    assert engine.run_on_host(handle, x, weights, ids).abs().max().item() > 0

    g = torch.Generator().manual_seed(0)
    gpu_ids = torch.stack([torch.randperm(EXPERT_OFFSET, generator=g)[:top_k] for _ in range(tokens)])
    gpu_ids[0, 0] = -1
    gpu_ids[1, 1] = EXPERT_OFFSET + NUM_CPU_EXPERTS  # past the CPU range: not the engine's either
    out = engine.run_on_host(handle, x, weights, gpu_ids)
    assert out.shape == (tokens, H)
    assert torch.equal(out, torch.zeros(tokens, H))


# --------------------------------------------------------------------------- determinism and threads


@pytest.mark.parametrize("name", ["bf16-f32", "int4", "fp8", "int8-act"])
def test_deterministic_across_runs_and_thread_counts(name: str):
    """50 repeated steps are bit-identical, and so are 1, 2 and 3 threads (each output row is written by
    one task, in a fixed order). Two different steps alternate, so a task that read another task's
    results too early would see the other step's values, not this step's from the previous run."""
    layer = loaded_layer(name)
    H = layer.moe_weight_spec.hidden_size
    top_k = 4
    steps = [inputs(H, 12, top_k, seed=21), inputs(H, 9, top_k, seed=22)]
    int8 = takes_int8_path(name)
    refs = [reference(layer, *step, int8=int8) for step in steps]
    results = {}
    for threads in (1, 2, 3):
        engine, handle = make_engine(layer, top_k, threads=threads, int8_activations=CASES[name].int8_activations)
        firsts = [engine.run_on_host(handle, *step) for step in steps]
        for first, ref in zip(firsts, refs):
            assert (first - ref).abs().max().item() <= tolerance(layer, int8) * ref.abs().max().item()
        for i in range(50):
            for j, step in enumerate(steps):
                again = engine.run_on_host(handle, *step)
                assert torch.equal(again, firsts[j]), f"threads={threads}: run {i} of step {j} differs from the first"
        results[threads] = firsts
        del engine, handle
    for j in range(len(steps)):
        assert torch.equal(results[1][j], results[3][j])
        assert torch.equal(results[1][j], results[2][j])


def test_concurrent_engines_from_python_threads():
    """Two engines stepping at the same time from two Python threads (ctypes drops the GIL)."""
    layer = loaded_layer("int8")
    H = layer.moe_weight_spec.hidden_size
    x, weights, ids = inputs(H, 10, 4, seed=31)
    engines = [make_engine(layer, 4, threads=t) for t in (2, 3)]
    expected = engines[0][0].run_on_host(engines[0][1], x, weights, ids)
    errors: list[str] = []

    def loop(engine, handle):
        for i in range(30):
            out = engine.run_on_host(handle, x, weights, ids)
            if not torch.equal(out, expected):
                errors.append(f"threads={engine.threads} run {i}")

    workers = [threading.Thread(target=loop, args=pair) for pair in engines]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=50)
    assert not any(w.is_alive() for w in workers), "a step never finished"
    assert errors == []


# ---------------------------------------------------------------------------------------- lifecycle


def _wait_for_tasks(expected: int, deadline_s: float = 5.0) -> int:
    """Exited threads leave /proc/self/task a moment after join returns."""
    end = time.monotonic() + deadline_s
    while (n := task_count()) != expected and time.monotonic() < end:
        time.sleep(0.01)
    return n


def _warm_up(layer, x, weights, ids) -> torch.Tensor:
    """Run torch and the kernel once so nothing but the engines starts threads afterwards."""
    engine, handle = make_engine(layer, 2, threads=1)
    out = engine.run_on_host(handle, x, weights, ids)
    reference(layer, x, weights, ids)
    engine.close()
    return out


PROC_SKIP = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc")


@PROC_SKIP
@pytest.mark.timeout(60, method="thread")
def test_engines_alive_together_then_destroyed():
    """Several engines at once; destroying each (what its finalizer does) joins its worker threads, both
    while they still spin right after a step and once they block in the kernel's wait."""
    layer = loaded_layer("bf16-bf16")
    x, weights, ids = inputs(layer.moe_weight_spec.hidden_size, 7, 2, seed=41)
    expected = _warm_up(layer, x, weights, ids)

    before = task_count()
    engines, started = [], []
    for threads in (2, 3, 1, 4, 2):
        n = task_count()
        engines.append(make_engine(layer, 2, threads=threads))
        started.append(task_count() - n)
        # A pool of `threads` workers (the thread that waits for a step only waits).
        assert started[-1] == threads, f"threads={threads}: {started[-1]} threads started"
    assert task_count() == before + sum(started)

    # Interleaved steps; the last engine never runs (its workers sleep without ever waking).
    for _ in range(3):
        for engine, handle in engines[:-1]:
            assert torch.equal(engine.run_on_host(handle, x, weights, ids), expected)

    first, first_handle = engines[0]
    first.run_on_host(first_handle, x, weights, ids)
    alive = task_count()
    first.close()  # right after a step: its workers are still spinning
    assert _wait_for_tasks(alive - started[0]) == alive - started[0]

    time.sleep(0.05)  # far past spin_us: the others' workers now block in the kernel's wait
    for engine, _ in engines[1:]:
        engine.close()
    assert _wait_for_tasks(before) == before
    del engines, first, first_handle, engine

    # A fresh engine after all that still computes the same thing.
    engine, handle = make_engine(layer, 2, threads=2)
    assert torch.equal(engine.run_on_host(handle, x, weights, ids), expected)


@PROC_SKIP
@pytest.mark.timeout(60, method="thread")
def test_engines_collected_on_del():
    """`del` + gc.collect() frees an engine and ends its threads: its finalizer must not keep it alive
    (it once held the engine's layers, which held the engine)."""
    layer = loaded_layer("bf16-bf16")
    x, weights, ids = inputs(layer.moe_weight_spec.hidden_size, 7, 2, seed=41)
    _warm_up(layer, x, weights, ids)
    gc.collect()  # engines other tests (or modules run before in this process) left for the collector go now
    _wait_for_tasks(-1, deadline_s=0.2)  # ... and their threads leave /proc a moment after their join

    before = task_count()
    engines = [make_engine(layer, 2, threads=t) for t in (2, 3, 1)]
    assert task_count() > before
    for engine, handle in engines[:2]:
        engine.run_on_host(handle, x, weights, ids)
    refs = [weakref.ref(engine) for engine, _ in engines]
    del engines, engine, handle
    gc.collect()
    assert [r() is None for r in refs] == [True] * len(refs)
    assert _wait_for_tasks(before) == before


# ------------------------------------------------------------------------------------------- formats


def test_kernel_format():
    bf16 = get_moe_method("BF16")
    assert kernel_format(bf16, torch.bfloat16).code == cpu_experts.engine.BF16
    assert kernel_format(bf16, torch.float32).code == cpu_experts.engine.F32
    assert kernel_format(get_moe_method("INT8"), torch.bfloat16).code == cpu_experts.engine.INT8
    int4 = kernel_format(get_moe_method("INT4"), torch.bfloat16)
    assert (int4.code, int4.group_n, int4.group_k) == (cpu_experts.engine.INT4, 1, 128)
    fp8 = kernel_format(get_moe_method("FP8"), torch.bfloat16)
    assert (fp8.code, fp8.group_n, fp8.group_k) == (cpu_experts.engine.FP8, 128, 128)
    mx = kernel_format(get_moe_method("MXFP4"), torch.bfloat16)
    assert (mx.code, mx.group_n, mx.group_k) == (cpu_experts.engine.MXFP4, 1, 32)

    with pytest.raises(ValueError, match="--kt-method") as info:
        kernel_format(bf16, torch.float16)
    assert "--dtype" in str(info.value)


def test_add_layer_rejects_float16_bf16_layer():
    layer = make_moe_layer(NUM_CPU_EXPERTS, 64, 32, torch.float16, "BF16")
    engine = CpuExpertsEngine(
        threads=1,
        hidden=64,
        inter=32,
        top_k=2,
        num_cpu_experts=NUM_CPU_EXPERTS,
        expert_offset=EXPERT_OFFSET,
        capacity=4,
        pin_memory=False,
        spin_us=50,
    )
    _ENGINES.append(weakref.ref(engine))
    with pytest.raises(ValueError, match="--dtype"):
        engine.add_layer(layer, layer.quant_method)
    assert engine.layers == []


def test_missing_compiler_is_a_clear_error(tmp_path):
    """Without a C++ compiler the kernel cannot be built: the error names the compiler and the knob, and a
    compile failure shows the compiler's own message (never a bare OSError from ctypes)."""
    from sglang.srt.environ import envs
    from sglang.srt.layers.moe.cpu_experts import build

    build.load_kernel_library.cache_clear()
    try:
        with envs.SGLANG_KT_CPU_CXX.override("/no/such/g++"), pytest.raises(build.KernelBuildError) as e:
            build.load_kernel_library()
        assert "/no/such/g++" in str(e.value) and "SGLANG_KT_CPU_CXX" in str(e.value)
        fake = tmp_path / "fake-cxx"
        fake.write_text(
            "#!/bin/sh\necho 'fake-cxx 1.0'\n[ \"$1\" = --version ] && exit 0\necho 'no such flag' >&2\nexit 1\n"
        )
        fake.chmod(0o755)
        with envs.SGLANG_KT_CPU_CXX.override(str(fake)), envs.SGLANG_KT_CPU_KERNEL_CACHE.override(str(tmp_path)):
            with pytest.raises(build.KernelBuildError, match="no such flag"):
                build.load_kernel_library()
        assert not list(tmp_path.glob("*.so"))  # a failed build leaves nothing behind
    finally:
        build.load_kernel_library.cache_clear()


# ---- the doorbell (stream steps without host functions), with this test playing the GPU's stream ----------


def _doorbell_engine(monkeypatch, layers: list, top_k: int, spin_us: int = 50):
    """An engine whose stream steps use the doorbell, on plain memory (the self-test needs a GPU)."""
    monkeypatch.setattr(cpu_experts.engine, "_stream_memops_fail_reason", lambda lib: None)
    spec = layers[0].moe_weight_spec
    engine = CpuExpertsEngine(
        threads=2, hidden=spec.hidden_size, inter=spec.intermediate_size, top_k=top_k,
        num_cpu_experts=NUM_CPU_EXPERTS, expert_offset=EXPERT_OFFSET, capacity=CAPACITY, pin_memory=False,
        spin_us=spin_us, doorbell=True,
    )  # fmt: skip
    _ENGINES.append(weakref.ref(engine))
    assert engine.handover == "doorbell"
    return engine, [engine.add_layer(layer, layer.quant_method) for layer in layers]


def _ring(engine, index: int, x, weights, ids, timeout_s: float = 10.0) -> torch.Tensor:
    """What the stream does for one step: inputs in place, ring = index + 1, wait for done = index + 1, then
    clear done. Returns the mixture."""
    ring, done = engine.doorbell_words[0:1], engine.doorbell_words[16:17]
    n = x.shape[0]
    engine.x[:n].copy_(x), engine.weights[:n].copy_(weights), engine.ids[:n].copy_(ids)
    engine.count[0] = n
    assert int(done) == 0
    ring.fill_(index + 1)
    deadline = time.monotonic() + timeout_s
    while int(done) != index + 1:
        assert time.monotonic() < deadline, f"no answer to the ring of layer {index}"
    assert int(ring) == 0  # a pool thread took the ring before it started the step
    done.fill_(0)
    return engine.out[:n].clone()


def test_doorbell_steps_equal_host_steps(monkeypatch):
    """Rings for several layers, the same layer twice in a row (its done word must be cleared between), and a
    ring after the pool has gone to sleep (the watcher naps and still answers) give what ktc_run gives."""
    first, second = loaded_layer("int8"), loaded_layer("int8-act")  # same shapes, other weights
    engine, (a, b) = _doorbell_engine(monkeypatch, [first, second], top_k=4)
    H = first.moe_weight_spec.hidden_size
    for step, (index, handle, tokens) in enumerate([(0, a, 5), (1, b, 3), (1, b, 1), (0, a, CAPACITY)]):
        x, weights, ids = inputs(H, tokens, 4, seed=50 + step)
        expected = engine.run_on_host(handle, x, weights, ids)
        before = engine.stats()
        assert torch.equal(_ring(engine, index, x, weights, ids), expected), f"step {step}"
        done = engine.stats().minus(before)
        assert done.steps == 1 and done.pairs == int((ids >= EXPERT_OFFSET).sum()) and done.compute_ns >= 0
        assert done.wait_blocked_ns == 0  # nothing on the host waited: the stream does
    time.sleep(0.05)  # 1000x spin_us: every pool thread but the watcher sleeps on its futex
    x, weights, ids = inputs(H, 2, 4, seed=99)
    assert torch.equal(_ring(engine, 0, x, weights, ids), engine.run_on_host(a, x, weights, ids))


def test_doorbell_for_an_unknown_layer_fails_loudly(tmp_path):
    """A ring naming no layer would leave the stream waiting forever: the process ends with a message."""
    script = tmp_path / "bad_ring.py"
    script.write_text(
        "import time, torch\n"
        "from sglang.srt.layers.moe import cpu_experts\n"
        "from sglang.srt.layers.moe.layer import make_moe_layer\n"
        "cpu_experts.engine._stream_memops_fail_reason = lambda lib: None\n"
        "engine = cpu_experts.CpuExpertsEngine(1, 64, 32, 2, 4, 0, 4, False, 50, doorbell=True)\n"
        "layer = make_moe_layer(4, 64, 32, torch.float32, 'BF16')\n"
        "engine.add_layer(layer, layer.quant_method)\n"
        "engine.doorbell_words[0] = 7\n"
        "time.sleep(10)\n"
    )
    import subprocess
    import sys

    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=50)
    assert result.returncode != 0
    assert "doorbell rang for layer 6 of 1" in result.stderr


def test_doorbell_needs_a_working_self_test():
    """Without CUDA (this machine) the self-test fails and steps keep the host-function hand-over."""
    layer = loaded_layer("int8")
    spec = layer.moe_weight_spec
    engine = CpuExpertsEngine(
        threads=1, hidden=spec.hidden_size, inter=spec.intermediate_size, top_k=2,
        num_cpu_experts=NUM_CPU_EXPERTS, expert_offset=EXPERT_OFFSET, capacity=4, pin_memory=False,
        spin_us=50, doorbell=True,
    )  # fmt: skip
    _ENGINES.append(weakref.ref(engine))
    if torch.cuda.is_available():
        assert engine.handover == "doorbell"
    else:
        assert engine.handover == "host functions" and engine.doorbell_words is None


def test_read_bandwidth_probe_takes_every_stream_count():
    """The benchmark's host read (ktc_read_seconds) for 1 to 8 runs per thread, on a length no count divides."""
    from sglang.srt.layers.moe.cpu_experts.build import load_kernel_library

    lib = load_kernel_library()
    buf = torch.ones(1 << 20)  # 4 MiB
    nbytes = buf.numel() * 4 - 64 * 3
    for streams in (1, 2, 3, 4, 8):
        seconds = lib.ktc_read_seconds(buf.data_ptr(), nbytes, 2, 2, streams)
        assert 0.0 < seconds < 10.0, streams
