"""python -m sglang.plan_memory for MLA models (DeepSeek-V2-Lite, DeepSeek-V3, Kimi-K2 configs): the model is
built on the meta device, the KV cell is the latent row (kv_lora_rank + qk_rope_head_dim per token and layer,
the same on every tensor-parallel rank) on both sizing paths."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="per-commit-cpu")

import pytest

from sglang.plan_memory import main, parse_args, plan_path
from sglang.srt.model_executor.pool_configurator import GiB
from sglang.test.gpu_utils import shape_config_dir


def _static(argv):
    ns, assumed = parse_args(argv)
    return plan_path(ns, assumed, post_capture=False), plan_path(ns, assumed, post_capture=True)


def _check_static_formula(plan):
    _check_static_formula_with(plan, 0)


def _check_static_formula_with(plan, reservation: int):
    rest = plan.available_after_weights_gb - plan.pre_model_load_memory_gb * (1 - plan.mem_fraction_static)
    assert plan.max_total_num_tokens == (int(rest * GiB) - reservation) // plan.cell_size_bytes


def test_deepseek_v2_lite_on_one_h200():
    static, post = _static(["--model-path", shape_config_dir("DeepSeek-V2-Lite"), "--gpu-memory-gib", "140.4"])
    assert static.cell_size_bytes == 27 * (512 + 64) * 2 == 31104  # bf16 latent rows, 27 layers
    # 15.7e9 bf16 parameters (DeepSeek-V2-Lite is "16B"): the meta-device build counts them.
    assert static.weights_gb == pytest.approx(31.4e9 / GiB, rel=0.01)
    _check_static_formula(static)
    assert static.max_total_num_tokens > 3_000_000
    assert post.path == "post-capture" and post.cell_size_bytes == 31104
    assert post.static_equivalent_tokens == static.max_total_num_tokens


@pytest.mark.parametrize("kv_dtype,cell", [("auto", 70272), ("fp8_e4m3", 35136)])
def test_deepseek_v3_cell_is_the_latent_row_on_every_rank(kv_dtype, cell):
    d = shape_config_dir("DeepSeek-V3")
    static, _ = _static(["--model-path", d, "--tp-size", "16", "--kv-cache-dtype", kv_dtype])
    assert static.cell_size_bytes == cell == 61 * 576 * (2 if kv_dtype == "auto" else 1)
    _check_static_formula(static)
    assert static.max_total_num_tokens > 0


def test_deepseek_v3_in_bf16_does_not_fit_one_gpu_and_says_so(capsys):
    assert main(["--model-path", shape_config_dir("DeepSeek-V3")]) == 0
    out = capsys.readouterr().out
    assert "[static] no KV cache fits" in out and "--mem-fraction-static" in out  # ~1.3 TB of bf16 weights
    assert "[post-capture] no KV cache fits" in out


def test_kimi_k2_config_plans_as_deepseek_v3():
    static, post = _static(["--model-path", shape_config_dir("Kimi-K2"), "--tp-size", "16"])
    assert static.cell_size_bytes == 70272  # 61 layers, the same latent width as DeepSeek-V3
    _check_static_formula(static)
    v3, _ = _static(["--model-path", shape_config_dir("DeepSeek-V3"), "--tp-size", "16"])
    assert static.weights_gb > v3.weights_gb  # 384 experts instead of 256 (and fewer heads)
    assert post.path == "post-capture" and post.cell_size_bytes == 70272


def test_deepseek_v3_kt_fp8_prefill_slot_is_the_hand_count():
    """KT on DeepSeekMoE: the full-GPU prefill slot is one MoE layer of every expert in the method's layout, sized
    on the meta device. FP8 block-128: 256 experts x 3 matrices x 7168 x 2048 weight bytes, plus the fp32 scales
    of w13 (256 x 32 x 56 x 4 = 1,835,008) and w2 (256 x 56 x 16 x 4 = 917,504)."""
    d = shape_config_dir("DeepSeek-V3")
    argv = ["--model-path", d, "--kt-method", "FP8", "--kt-num-gpu-experts", "0"]
    static, _ = _static([*argv, "--kt-gpu-prefill-token-threshold", "4096"])
    slot = 256 * 3 * 7168 * 2048 + 1_835_008 + 917_504
    assert slot == 11_277_041_664
    assert static.reservations_bytes == {"kt_full_gpu_prefill_slot": slot}
    without, _ = _static(argv)  # no threshold: no slot, and the KV pool gets its bytes back
    assert without.reservations_bytes == {}
    assert (without.max_total_num_tokens - static.max_total_num_tokens) * 70272 == pytest.approx(slot, abs=70272)
    # Every routed expert lives on the CPU: the device holds attention, the dense layers and the shared experts.
    assert static.weights_gb < 40


def test_kimi_k2_thinking_int4_experts_prefill_slot_is_the_hand_count():
    """Kimi-K2-Thinking (Kimi-K2's shape, its routed experts pack-quantized in groups of 32) under KT with RAWINT4:
    the full-GPU prefill slot holds all 384 experts of a layer in the checkpoint's groups, 7168 x 2048 x 3 int4 values
    an expert (half a byte each) plus one fp32 scale per 32 of them: 8,455,716,864 + 2,113,929,216 bytes."""
    from sglang.test.int4_checkpoints import quantization_config

    d = shape_config_dir("Kimi-K2", quantization_config=quantization_config(32))
    argv = ["--model-path", d, "--kt-method", "RAWINT4", "--kt-num-gpu-experts", "0", "--tp-size", "2"]
    static, post = _static([*argv, "--kt-gpu-prefill-token-threshold", "4096"])
    values = 384 * 3 * 7168 * (2048 // 2)  # this rank's half of every expert's intermediate dimension
    slot = values // 2 + values // 32 * 4
    assert slot == 4_227_858_432 + 1_056_964_608
    assert static.reservations_bytes == post.reservations_bytes == {"kt_full_gpu_prefill_slot": slot}
    _check_static_formula_with(static, slot)
