"""python -m sglang.plan_memory: both paths' plans from a config alone, with no GPU, by the server's own
planner (the numbers follow from the plan's own terms) and the server's own meta-device model build."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=15, suite="per-commit-cpu")

import pytest

from sglang.plan_memory import main, parse_args, plan_path
from sglang.srt.model_executor.pool_configurator import GiB
from sglang.test.gpu_utils import shape_config_dir


@pytest.fixture(scope="module")
def llama_8b() -> str:
    return shape_config_dir("Llama-3.1-8B")


def _plans(argv):
    ns, assumed = parse_args(argv)
    return plan_path(ns, assumed, post_capture=False), plan_path(ns, assumed, post_capture=True)


def test_both_paths_from_the_config(llama_8b):
    static, post = _plans(["--model-path", llama_8b, "--gpu-memory-gib", "140.4"])
    # The server's defaults for an H200-sized GPU (DESIGN 3.1 / 3.2).
    assert static.path == "static" and static.mem_fraction_static == 0.907
    assert post.path == "post-capture" and post.mem_fraction_static == 0.988
    # Weights: Llama-3.1-8B holds 8.03e9 bf16 parameters (16.06e9 bytes; the GPU test measures the same).
    assert static.weights_gb == pytest.approx(16.06e9 / GiB, rel=0.01)
    assert static.pre_model_load_memory_gb == pytest.approx(140.4 - 1.1)
    assert static.cell_size_bytes == post.cell_size_bytes == 8 * 256 * 32 * 2
    # The static formula over the plan's own terms.
    rest = static.available_after_weights_gb - static.pre_model_load_memory_gb * (1 - static.mem_fraction_static)
    assert static.max_total_num_tokens == int(rest * GiB) // static.cell_size_bytes
    # Post-capture without a measured peak follows SGLang's rule, floored here (decode eager above 256).
    assert post.sglang_rule_tokens == post.max_total_num_tokens
    assert post.static_equivalent_tokens == static.max_total_num_tokens
    assert post.headroom_gb == pytest.approx(12928 / 1024)  # 512 + 8192 * 1.5 + 128 MiB


def test_fp8_linear_layers_halve_their_weight_bytes(llama_8b):
    from transformers import AutoConfig

    from sglang.srt.layers.decode_gemm.shapes import projection_shapes

    bf16, _ = _plans(["--model-path", llama_8b])
    fp8, _ = _plans(["--model-path", llama_8b, "--quantization", "fp8"])
    config = AutoConfig.from_pretrained(llama_8b)
    shapes = projection_shapes(config).values()
    linear_params = config.num_hidden_layers * sum(n * k for n, k in shapes)
    scale_bytes = config.num_hidden_layers * sum(n for n, _ in shapes) * 4  # one fp32 scale per output row
    # One byte instead of two per linear weight; embeddings, lm_head and norms stay bf16.
    saved = bf16.weights_gb - fp8.weights_gb
    assert saved == pytest.approx((linear_params - scale_bytes) / GiB, rel=1e-3)
    assert fp8.max_total_num_tokens > bf16.max_total_num_tokens


def test_w4a16_moe_experts_take_a_quarter_of_their_bf16_bytes(tmp_path):
    """Qwen3-30B-A3B as llm-compressor's W4A16 recipe writes it (Kimi-K2-Thinking's config: the routed experts
    pack-quantized in groups of 32), without KT: each expert value half a byte plus an fp32 scale per 32 of them
    instead of two bytes; the other layers as in bf16."""
    from sglang.test.int4_checkpoints import quantization_config

    bf16, _ = _plans(["--model-path", shape_config_dir("Qwen3-30B-A3B", root=str(tmp_path / "bf16"))])
    d = shape_config_dir("Qwen3-30B-A3B", root=str(tmp_path / "int4"), quantization_config=quantization_config(32))
    int4, _ = _plans(["--model-path", d])
    values = 48 * 128 * 3 * 2048 * 768  # layers x experts x (gate, up, down) x hidden x expert width
    saved = values * 2 - (values // 2 + values // 32 * 4)
    assert (bf16.weights_gb - int4.weights_gb) * GiB == pytest.approx(saved, abs=1)
    assert int4.max_total_num_tokens > 1.5 * bf16.max_total_num_tokens  # 1,164,138 vs 758,634 on an H200


def test_a_measured_peak_plans_the_post_capture_headroom(llama_8b):
    _, post = _plans(["--model-path", llama_8b, "--activation-peak-gib", "2"])
    assert post.headroom_rule.startswith("measured") and post.headroom_gb == pytest.approx(2.2 + 0.25)
    assert post.max_total_num_tokens > post.static_equivalent_tokens > post.sglang_rule_tokens


def test_flags_reach_the_plan(llama_8b):
    static, post = _plans(
        ["--model-path", llama_8b, "--tp-size", "2", "--max-total-tokens", "100000", "--page-size", "64"]
    )
    for plan in (static, post):
        assert plan.tp_size == 2 and plan.cell_size_bytes == 4 * 256 * 32 * 2  # 4 of 8 KV heads per rank
        assert plan.max_total_num_tokens == 99968 and plan.token_cap_reason.startswith("--max-total-tokens 100000")
        assert plan.weights_gb == pytest.approx(16.06e9 / GiB / 2, rel=0.02)  # rank 0's shard
    static, post = _plans(["--model-path", llama_8b, "--disable-cuda-graph"])
    assert static.cuda_graph_gb == 0 and post == "not planned: decode CUDA graphs are disabled"


def test_kt_reservation_is_the_servers(tmp_path):
    """Qwen3-30B-A3B with 16 experts per layer on the GPU and the full-GPU prefill slot, TP 2: the
    reservation is rank 0's half of one full MoE layer; the CPU experts are not device weights."""
    import torch

    from sglang.srt.layers.moe.layer import moe_layer_bytes

    qwen = shape_config_dir("Qwen3-30B-A3B", root=str(tmp_path))
    kt = ["--kt-method", "BF16", "--kt-num-gpu-experts", "16", "--kt-gpu-prefill-token-threshold", "1024"]
    static, post = _plans(["--model-path", qwen, "--tp-size", "2", *kt])
    slot = moe_layer_bytes(128, 2048, 768 // 2, torch.bfloat16, "BF16")
    assert static.reservations_bytes == post.reservations_bytes == {"kt_full_gpu_prefill_slot": slot}
    rest = static.available_after_weights_gb - static.pre_model_load_memory_gb * (1 - static.mem_fraction_static)
    assert static.max_total_num_tokens == (int(rest * GiB) - slot) // static.cell_size_bytes
    all_experts, _ = _plans(["--model-path", qwen, "--tp-size", "2"])
    expert_bytes = 48 * moe_layer_bytes(128 - 16, 2048, 768 // 2, torch.bfloat16, "BF16")  # on the CPU instead
    assert (all_experts.weights_gb - static.weights_gb) * GiB == pytest.approx(expert_bytes, rel=1e-6)
    # CPU experts run inside CUDA graphs (host functions): the plan keeps the graphs' memory.
    assert post.cuda_graph_gb == all_experts.cuda_graph_gb > 0 and post.cuda_graph_max_bs > 0


def test_cli_prints_both_tables(llama_8b, capsys):
    assert main(["--model-path", llama_8b]) == 0
    out = capsys.readouterr().out
    assert "[static]\nMemory plan:" in out and "[post-capture]\nMemory plan:" in out
    assert out.count("GiB estimated (max bs 256)") == 2 and "GiB measured" not in out
