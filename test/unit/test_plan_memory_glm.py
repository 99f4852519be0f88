"""python -m sglang.plan_memory for GLM-4.5-Air (scripts/make_model_configs.py's shape, its config.json in
transformers 4's layout): the meta-device build's weight bytes equal a hand count, the KV cell is GQA's (8 KV heads
of 128 + 128 values per layer), and under KT with FP8 experts the full-GPU prefill slot is one MoE layer of all
128 experts in the block-128 layout, counted by hand."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="per-commit-cpu")

import pytest
import torch

from sglang.plan_memory import main, parse_args, plan_path
from sglang.srt.model_executor.pool_configurator import GiB
from sglang.test.gpu_utils import shape_config_dir

H, VOCAB, LAYERS, MOE_LAYERS = 4096, 151552, 46, 45
HEADS, KV_HEADS, HEAD_DIM, EXPERTS, MOE_INTER, DENSE_INTER = 96, 8, 128, 128, 1408, 10944


@pytest.fixture(scope="module")
def air(tmp_path_factory) -> str:
    return shape_config_dir("GLM-4.5-Air", root=str(tmp_path_factory.mktemp("shapes")))


def _plans(argv):
    ns, assumed = parse_args(argv)
    return plan_path(ns, assumed, post_capture=False), plan_path(ns, assumed, post_capture=True)


def _static_formula(plan, reservation: int = 0) -> int:
    rest = plan.available_after_weights_gb - plan.pre_model_load_memory_gb * (1 - plan.mem_fraction_static)
    return (int(rest * GiB) - reservation) // plan.cell_size_bytes


def test_tp2_weights_are_the_hand_count(air):
    """Rank 0 of 2: half the heads, the vocabulary, every MLP's and expert's intermediate dimension; routers (fp32)
    and norms whole; the rotary table (64 rotated values per head, 131072 positions, cos and sin) once."""
    static, post = _plans(["--model-path", air, "--tp-size", "2"])
    q, kv = HEADS // 2 * HEAD_DIM, KV_HEADS // 2 * HEAD_DIM
    attention = H * q + q + 2 * (H * kv + kv) + q * H + 2 * H  # q/k/v with biases, o_proj, two norms
    bf16 = 2 * VOCAB // 2 * H + H + LAYERS * attention + 3 * H * DENSE_INTER // 2
    bf16 += MOE_LAYERS * 3 * H * (MOE_INTER // 2) * (EXPERTS + 1)  # routed + one shared expert
    router = MOE_LAYERS * (EXPERTS * H + EXPERTS) * 4
    rope = 2 * 131072 * 64 * 2
    assert static.weights_gb * GiB == 2 * bf16 + router + rope == 106_956_982_784
    assert static.cell_size_bytes == post.cell_size_bytes == LAYERS * (KV_HEADS // 2) * 2 * HEAD_DIM * 2 == 94208
    assert static.max_total_num_tokens == _static_formula(static) > 250_000
    assert post.path == "post-capture" and post.static_equivalent_tokens == static.max_total_num_tokens


def test_kt_fp8_prefill_slot_is_the_hand_count(air, capsys):
    from sglang.srt.layers.moe.layer import moe_layer_bytes

    kt = ["--model-path", air, "--kt-method", "FP8", "--kt-gpu-prefill-token-threshold", "4096"]
    static, post = _plans([*kt, "--kt-num-gpu-experts", "16"])
    # 128 experts x (w13 2816 x 4096 + w2 4096 x 1408) fp8 bytes, plus the fp32 block-128 scales of w13
    # (128 x 22 x 32 x 4 = 360,448) and w2 (128 x 32 x 11 x 4 = 180,224).
    slot = EXPERTS * 3 * H * MOE_INTER + 360_448 + 180_224
    assert slot == 2_215_133_184
    assert static.reservations_bytes == post.reservations_bytes == {"kt_full_gpu_prefill_slot": slot}
    assert static.cell_size_bytes == LAYERS * KV_HEADS * 2 * HEAD_DIM * 2 == 188_416
    assert static.max_total_num_tokens == _static_formula(static, slot)
    # The 16 experts per MoE layer on the GPU are the only expert bytes there (fp8, with their scales).
    no_gpu_experts, _ = _plans([*kt, "--kt-num-gpu-experts", "0"])
    gpu_experts = MOE_LAYERS * moe_layer_bytes(16, H, MOE_INTER, torch.bfloat16, "FP8")
    assert (static.weights_gb - no_gpu_experts.weights_gb) * GiB == gpu_experts
    assert no_gpu_experts.weights_gb < 15  # attention, the dense layer, shared experts, embeddings
    assert main([*kt, "--kt-num-gpu-experts", "16"]) == 0
    out = capsys.readouterr().out
    assert "[static]\nMemory plan:" in out and "[post-capture]\nMemory plan:" in out


def test_kt_fp8_perchannel_prefill_slot_is_the_hand_count(air):
    """--kt-method FP8_PERCHANNEL (a per-channel FP8 GLM's experts as they are): the slot is 128 experts' fp8 bytes
    plus one fp32 scale per row, w13's 2 x 1408 and w2's 4096 (128 x 6912 x 4 = 3,538,944)."""
    kt = ["--model-path", air, "--kt-method", "FP8_PERCHANNEL", "--kt-gpu-prefill-token-threshold", "4096"]
    static, post = _plans([*kt, "--kt-num-gpu-experts", "0"])
    slot = EXPERTS * 3 * H * MOE_INTER + EXPERTS * (2 * MOE_INTER + H) * 4
    assert slot == 2_218_131_456
    assert static.reservations_bytes == post.reservations_bytes == {"kt_full_gpu_prefill_slot": slot}
    assert static.max_total_num_tokens == _static_formula(static, slot)


def test_without_kt_one_h200_cannot_hold_it_and_says_so(air, capsys):
    assert main(["--model-path", air]) == 0  # ~214 GB of bf16 weights
    out = capsys.readouterr().out
    assert "[static] no KV cache fits" in out and "[post-capture] no KV cache fits" in out
