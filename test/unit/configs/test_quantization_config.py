from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="per-commit-cpu")

# config.json's quantization_config parsed into the checkpoint's weight format: the native FP8 layouts and the
# pack-quantized INT4 one (Kimi-K2-Thinking's experts) we run parse into a CheckpointQuantization, every other
# method is refused by name with the supported list.

import pytest
import torch

from sglang.srt.configs.quantization_config import (
    CheckpointQuantization,
    UnsupportedQuantization,
    parse_checkpoint_quantization,
)

FP8_BLOCK = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}


def compressed_tensors(strategy="channel", dynamic_acts=True, **weights):
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "strategy": strategy, "dynamic": False, **weights},
                "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": dynamic_acts},
            }
        },
        "ignore": ["lm_head", "re:.*mlp.gate$"],
        "kv_cache_scheme": None,
    }


def pack_quantized(**weights):
    """Kimi-K2-Thinking's quantization_config (as the test checkpoints' writer gives it), `weights` changed."""
    from sglang.test.int4_checkpoints import quantization_config

    config = quantization_config(32)
    group = config["config_groups"]["group_0"]
    return {**config, "config_groups": {"group_0": {**group, "weights": {**group["weights"], **weights}}}}


def test_dense_sparsity_config_parses():
    """A sparsity_config stored dense (the weights as they are) changes nothing we read."""
    dense = {**compressed_tensors(), "sparsity_config": {"format": "dense", "sparsity_structure": "2:4"}}
    assert parse_checkpoint_quantization(dense) == parse_checkpoint_quantization(compressed_tensors())


def test_pack_quantized_int4_parses():
    q = parse_checkpoint_quantization(pack_quantized())
    ignored = tuple(pack_quantized()["ignore"])
    assert q == CheckpointQuantization("compressed-tensors", "group", "weight_scale", "none", ignored, 32)
    assert q.is_int4 and q.block_size is None and q.is_ignored("model.layers.3.self_attn.o_proj")
    assert parse_checkpoint_quantization(pack_quantized(group_size=128)).group_size == 128


def test_full_precision_has_no_format():
    assert parse_checkpoint_quantization(None) is None
    assert parse_checkpoint_quantization({}) is None


def test_block_fp8_parses():
    q = parse_checkpoint_quantization({**FP8_BLOCK, "modules_to_not_convert": ["model.layers.0.mlp.gate"]})
    assert q == CheckpointQuantization("fp8", "block", "weight_scale_inv", "dynamic", ("model.layers.0.mlp.gate",))
    assert q.block_size == 128
    assert q.is_ignored("model.layers.0.mlp.gate") and not q.is_ignored("model.layers.1.mlp.gate")


@pytest.mark.parametrize("strategy", ["channel", "tensor"])
def test_compressed_tensors_float_parses(strategy):
    q = parse_checkpoint_quantization(compressed_tensors(strategy, dynamic_acts=False))
    assert (q.method, q.strategy, q.scale_name, q.activation_scheme) == (
        "compressed-tensors",
        strategy,
        "weight_scale",
        "static",
    )
    assert q.block_size is None
    assert q.is_ignored("lm_head") and q.is_ignored("model.layers.3.mlp.gate")
    assert not q.is_ignored("model.layers.3.mlp.gate_proj")


REFUSED = [
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm"}, "'awq'"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False}, "'gptq'"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "'bitsandbytes'"),
    ({"quant_method": "made-up-method"}, "'made-up-method'"),
    ({"load_in_8bit": True}, "no quant_method"),
    ({"quant_method": "fp8", "activation_scheme": "static"}, "weight_block_size None"),
    ({**FP8_BLOCK, "weight_block_size": [64, 64]}, "weight_block_size [64, 64]"),
    ({**FP8_BLOCK, "fmt": "e5m2"}, "fmt 'e5m2'"),
    ({**compressed_tensors(), "format": "marlin-24"}, "format 'marlin-24'"),
    ({**compressed_tensors(), "sparsity_config": {"format": "sparse-24-bitmask"}}, "sparsity_config format"),
    ({**pack_quantized(), "transform_config": {"config_groups": {"u": {"type": "hadamard"}}}}, "transform_config"),
    ({**compressed_tensors(), "format": "pack-quantized"}, "weights of type 'float' with 8 bits"),
    (pack_quantized(num_bits=8), "weights of type 'int' with 8 bits"),
    (pack_quantized(strategy="channel"), "weight strategy 'channel'"),
    (pack_quantized(symmetric=False), "asymmetric (zero-point)"),
    (pack_quantized(actorder="group"), "actorder 'group'"),
    (pack_quantized(group_size=None), "group_size None"),
    (
        {
            **pack_quantized(),
            "config_groups": {
                "g": {
                    **pack_quantized()["config_groups"]["group_0"],
                    "input_activations": {"num_bits": 8, "type": "int"},
                }
            },
        },
        "input_activations",
    ),  # fmt: skip
    (compressed_tensors(num_bits=4), "with 4 bits"),
    (compressed_tensors("group"), "strategy 'group'"),
    (
        {**compressed_tensors(), "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "attn_head"}},
        "kv_cache_scheme strategy 'attn_head'",
    ),
    ({**compressed_tensors(), "kv_cache_scheme": {"num_bits": 8, "type": "int"}}, "kv_cache_scheme of type 'int'"),
    (
        {**compressed_tensors(), "kv_cache_scheme": {"num_bits": 8, "type": "float", "dynamic": True}},
        "kv_cache_scheme with dynamic",
    ),
]


def test_compressed_tensors_with_per_tensor_kv_scales_parses():
    """kv_cache_scheme: one k_scale / v_scale per layer (model_loader/kv_scales.py), used by an fp8 KV cache."""
    scheme = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}
    q = parse_checkpoint_quantization({**compressed_tensors(), "kv_cache_scheme": scheme})
    assert q == parse_checkpoint_quantization(compressed_tensors())


@pytest.mark.parametrize("config,named", REFUSED, ids=[str(i) for i in range(len(REFUSED))])
def test_other_formats_are_refused_by_name(config, named):
    with pytest.raises(UnsupportedQuantization) as e:
        parse_checkpoint_quantization(config)
    message = str(e.value)
    assert message.startswith("quantization_config: ") and named in message
    assert "fp8 (weight_block_size [128, 128]" in message and "compressed-tensors (format float-quantized" in message


def _smollm2_shaped(**overrides):
    from transformers import LlamaConfig

    fields = dict(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3)
    return LlamaConfig(
        **{**fields, **overrides},
        num_hidden_layers=2,
        vocab_size=512,
        architectures=["LlamaForCausalLM"],
        quantization_config=FP8_BLOCK,
    )


def test_block_fp8_on_the_gpu_refuses_merged_parts_off_the_scale_blocks():
    """SmolLM2's dims: q is 9 x 64 = 576 wide, so k's rows would start inside q's last 128-row scale block of
    the merged qkv projection. The GPU keeps fp8 in merged layers: refused at start-up naming the fields; the
    CPU dequantizes at load and runs it."""
    from sglang.srt.configs.model_config import ModelConfig

    with pytest.raises(ValueError) as e:
        ModelConfig.from_hf_config(_smollm2_shaped(), dtype="bfloat16", device="cuda")
    assert "num_attention_heads x head_dim = 576" in str(e.value)
    assert "num_key_value_heads x head_dim = 192" in str(e.value) and "intermediate_size" not in str(e.value)
    assert ModelConfig.from_hf_config(_smollm2_shaped(), device="cpu").quantization is None
    aligned = _smollm2_shaped(hidden_size=512, num_attention_heads=8, num_key_value_heads=2)
    assert ModelConfig.from_hf_config(aligned, dtype="bfloat16", device="cuda").quantization == "fp8_block"


def test_int4_groups_the_gpu_cannot_split_are_refused_there_by_name():
    """The GPU's fused MoE splits its K steps by the int4 groups: a group that is not a power of two >= 16 is refused
    at start-up on CUDA naming group_size (before any weight); the CPU runs it."""
    from transformers import LlamaConfig

    from sglang.srt.configs.model_config import ModelConfig

    def config(size: int):
        return LlamaConfig(num_hidden_layers=2, vocab_size=512, quantization_config=pack_quantized(group_size=size))

    for size in (48, 8):
        with pytest.raises(UnsupportedQuantization, match=f"group_size {size} on the GPU"):
            ModelConfig.from_hf_config(config(size), dtype="bfloat16", device="cuda")
        assert ModelConfig.from_hf_config(config(size), device="cpu").checkpoint_quantization.group_size == size
    assert ModelConfig.from_hf_config(config(32), dtype="bfloat16", device="cuda").checkpoint_quantization.is_int4


def test_block_fp8_tensor_parallel_shares_must_be_whole_scale_blocks(tmp_path):
    """Each rank loads its share of every merged part; a share that is not whole 128-row blocks would cut a scale
    block between two ranks. Refused at start-up naming --tp-size and the parts (with each rank's share), before
    any weight is read; the shares are split as the layers split them (KV heads replicated past their count)."""
    from sglang.srt.configs.device_config import described_device
    from sglang.srt.configs.engine_config import resolve_engine_config
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.server_args import ServerArgs, ServerArgsError

    heads_128 = dict(hidden_size=1024, num_attention_heads=8, num_key_value_heads=2, head_dim=128)
    fine = _smollm2_shaped(**heads_128)  # q 8 x 128, kv 2 x 128, intermediate 1536
    for tp in (1, 2, 4):  # at 4 each rank holds one replicated KV head: 128 rows
        assert ModelConfig.from_hf_config(fine, dtype="bfloat16", device="cuda", tp_size=tp).quantization == "fp8_block"
    ragged = _smollm2_shaped(**heads_128, intermediate_size=1664)  # 13 blocks: 832 rows a rank at 2
    ModelConfig.from_hf_config(ragged, dtype="bfloat16", device="cuda")  # one rank: whole blocks
    with pytest.raises(ValueError, match=r"--tp-size 2: .*intermediate_size \(832/832\)") as e:
        ModelConfig.from_hf_config(ragged, dtype="bfloat16", device="cuda", tp_size=2)
    assert "head_dim" not in str(e.value)
    heads_64 = _smollm2_shaped(hidden_size=512, num_attention_heads=8, num_key_value_heads=2)  # 64-wide heads
    with pytest.raises(ValueError, match=r"num_key_value_heads x head_dim \(64/64\)") as e:
        ModelConfig.from_hf_config(heads_64, dtype="bfloat16", device="cuda", tp_size=2)
    assert "num_attention_heads" not in str(e.value)  # 4 query heads a rank: 256 rows
    # From the command line: --tp-size reaches the check (a config.json alone: no weight to read).
    d = tmp_path / "ragged"
    d.mkdir()
    ragged.to_json_file(str(d / "config.json"))
    args = ServerArgs(model_path=str(d), device="cuda", load_format="dummy", dtype="bfloat16", tp_size=2)
    with pytest.raises(ServerArgsError, match=r"--tp-size 2: .*intermediate_size"):
        resolve_engine_config(args, device=described_device("cuda", 81_559))


def test_block_fp8_mla_tensor_parallel_shares_split_by_whole_heads():
    """DeepSeek-V3's layout (MLA): q_b_proj's rows and o_proj's input columns split by whole heads, the dense, routed
    and shared MLP widths evenly. Refused at start-up naming --tp-size and the part whose shares cut a scale
    block; the merged MLP parts must be whole blocks at one rank too."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.test.tiny_deepseek import tiny_deepseek_config

    dims = dict(qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, intermediate_size=1024, n_shared_experts=1)
    v3 = tiny_deepseek_config("v3", **dims, num_attention_heads=8, moe_intermediate_size=512)
    v3.quantization_config = FP8_BLOCK
    for tp in (1, 2, 4):  # 8 heads: 2 a rank at 4 (384 query rows, 256 value columns); 128 expert rows
        assert ModelConfig.from_hf_config(v3, dtype="bfloat16", device="cuda", tp_size=tp).quantization == "fp8_block"
    with pytest.raises(ValueError, match=r"--tp-size 8: .*moe_intermediate_size \(64/64") as e:
        ModelConfig.from_hf_config(v3, dtype="bfloat16", device="cuda", tp_size=8)  # one head (192 rows) a rank
    assert "qk_rope_head_dim" in str(e.value) and "v_head_dim (128/" not in str(e.value)
    six_heads = tiny_deepseek_config("v3", **dims, num_attention_heads=6, moe_intermediate_size=512)
    six_heads.quantization_config = FP8_BLOCK
    with pytest.raises(ValueError, match=r"qk_rope_head_dim\) \(384/384/192/192\)") as e:
        ModelConfig.from_hf_config(six_heads, dtype="bfloat16", device="cuda", tp_size=4)
    assert "v_head_dim" not in str(e.value) and "intermediate_size" not in str(e.value)  # 256/256/128/128 is whole
    ragged = tiny_deepseek_config("v3", **dims, num_attention_heads=8, moe_intermediate_size=320)
    ragged.quantization_config = FP8_BLOCK
    with pytest.raises(ValueError, match="moe_intermediate_size = 320"):
        ModelConfig.from_hf_config(ragged, dtype="bfloat16", device="cuda")


@pytest.mark.parametrize(
    "architecture",
    ["Glm4MoeForCausalLM", "Qwen2MoeForCausalLM", "MixtralForCausalLM", "OlmoeForCausalLM", "Phi3ForCausalLM",
     "Gemma2ForCausalLM", "Gemma3ForCausalLM"],
)  # fmt: skip
def test_block_fp8_stays_fp8_on_the_gpu_for(architecture):
    """The architectures whose layers take the checkpoint's format (each has its CPU test of the GPU's format:
    test/registered/models/test_*fp8_checkpoint*.py); the CPU still dequantizes at load."""
    from sglang.srt.configs.quantization_config import linear_weight_format

    quant = parse_checkpoint_quantization(FP8_BLOCK)
    assert linear_weight_format(quant, "cuda", torch.bfloat16, architecture) == "fp8_block"
    assert linear_weight_format(quant, "cpu", torch.float32, architecture) is None
