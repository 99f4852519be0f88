"""The weight shapes the tuner tunes are the ones the models build, and table files merge per model."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="per-commit-cpu")

import json

import pytest
import torch
from transformers import AutoConfig

from sglang.srt.layers.decode_gemm.shapes import projection_shapes
from sglang.srt.layers.decode_gemm.table import device_table_path, load_device_table, update_table_file
from sglang.srt.layers.linear import LinearBase
from sglang.test.gpu_utils import shape_config_dir
from sglang.test.runners import tiny_config

CFG = dict(block_m=16, block_n=32, block_k=64, num_warps=4, num_stages=3, split_k=1, pdl=False)


def test_llama_8b_shapes_per_tensor_parallel_rank():
    config = AutoConfig.from_pretrained(shape_config_dir("Llama-3.1-8B"))
    assert projection_shapes(config) == {
        "qkv": (6144, 4096),
        "o": (4096, 4096),
        "gate_up": (28672, 4096),
        "down": (4096, 14336),
    }
    assert projection_shapes(config, tp_size=2) == {
        "qkv": (3072, 4096),
        "o": (4096, 2048),
        "gate_up": (14336, 4096),
        "down": (4096, 7168),
    }
    # 16 ranks, 8 KV heads: each rank holds 2 query heads and one (replicated) KV head.
    assert projection_shapes(config, tp_size=16, tp_rank=3)["qkv"] == ((2 + 2) * 128, 4096)


def test_moe_models_tune_attention_only():
    config = AutoConfig.from_pretrained(shape_config_dir("Qwen3-30B-A3B"))
    assert set(projection_shapes(config)) == {"qkv", "o"}


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_shapes_are_the_models_linear_layers(arch):
    from sglang.srt.models.registry import get_model_class

    config = tiny_config(arch)
    model = get_model_class(config.architectures[0])(config, torch.float32)
    built = {tuple(m.weight.shape) for m in model.modules() if isinstance(m, LinearBase)}
    assert built == set(projection_shapes(config).values())


def test_deepseek_v2_lite_shapes():
    config = AutoConfig.from_pretrained(shape_config_dir("DeepSeek-V2-Lite"))
    assert projection_shapes(config) == {
        "q_kv_a": (16 * 192 + 512 + 64, 2048),
        "o": (2048, 16 * 128),
        "gate_up": (2 * 10944, 2048),
        "down": (2048, 10944),
        "shared_gate_up": (2 * 2 * 1408, 2048),
        "shared_down": (2048, 2 * 1408),
    }


@pytest.mark.parametrize("version", ["v2", "v3"])
@pytest.mark.parametrize("block_fp8", [False, True])
def test_mla_shapes_are_the_models_linear_layers(version, block_fp8):
    """Every linear layer the tiny DeepSeek model runs, and no other (kv_b_proj's weight is absorbed); a block-fp8
    checkpoint's stacked q / kv_a projection padded to whole 128-row blocks."""
    from sglang.srt.models.registry import get_model_class
    from sglang.test.tiny_deepseek import tiny_deepseek_config

    # block fp8: the MLPs in whole 128 blocks, as the real models have them (q_kv_a / q_a_kv_a stay ragged)
    config = tiny_deepseek_config(
        version, **({"intermediate_size": 256, "moe_intermediate_size": 128} if block_fp8 else {})
    )
    quantization = "fp8_block" if block_fp8 else None
    model = get_model_class(f"DeepseekV{version[1]}ForCausalLM")(config, torch.float32, quantization=quantization)
    built = {
        tuple(m.weight.shape)
        for name, m in model.named_modules()
        if isinstance(m, LinearBase) and not name.endswith("kv_b_proj")
    }
    assert built == set(projection_shapes(config, block_fp8=block_fp8).values())
    stacked = model.model.layers[0].self_attn.fused_qkv_a_proj_with_mqa
    rows, starts = stacked.weight.shape[0], list(stacked.part_starts.values())
    if block_fp8:  # every part on a scale block, whole blocks
        assert rows % 128 == 0 and all(s % 128 == 0 for s in starts) and rows >= sum(stacked.part_sizes)
    else:
        assert rows == sum(stacked.part_sizes) and starts == [0, stacked.part_sizes[0]]


def test_table_file_merges_models_and_loads_from_its_directory(tmp_path):
    path = device_table_path("Some GPU", str(tmp_path))
    assert path == str(tmp_path / "Some_GPU.json")
    update_table_file(path, "Some GPU", "model-a tp1", {"24x64": {"1": CFG, "8": None}}, margin=0.01)
    update_table_file(path, "Some GPU", "model-b tp1", {"48x64": {"4": CFG}, "24x64": {"2": CFG}}, margin=0.02)
    with open(path) as f:
        raw = json.load(f)
    assert raw["models"] == ["model-a tp1", "model-b tp1"] and raw["margin"] == 0.02
    assert raw["shapes"]["24x64"] == {"2": CFG}  # re-tuned: replaced, not mixed
    plans = load_device_table("Some GPU", str(tmp_path))
    assert set(plans) == {"24x64", "48x64"} and plans["48x64"].config_for(3).block_n == 32
    assert load_device_table("Some GPU") == {}  # the shipped directory has no such table
    with pytest.raises(ValueError, match="not 'Other GPU'"):
        update_table_file(path, "Other GPU", "model-c tp1", {})
    with pytest.raises(ValueError, match="block_k"):
        update_table_file(path, "Some GPU", "model-c tp1", {"24x64": {"1": {**CFG, "block_k": 12}}})
    with open(path) as f:
        assert json.load(f)["shapes"]["24x64"] == {"2": CFG}  # a bad update leaves the file as it was
