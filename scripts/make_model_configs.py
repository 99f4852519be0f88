"""Write config.json directories for real model shapes, to run with --load-format dummy --skip-tokenizer-init.

    python scripts/make_model_configs.py --out /tmp/model-configs
    python -m sglang.launch_server --model-path /tmp/model-configs/Llama-3.1-8B --load-format dummy --skip-tokenizer-init

Shapes are the published configs of each model (no weights are needed or downloaded).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Dict

LLAMA_31_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
}
QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "hidden_act": "silu",
    "attention_bias": False,
}
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "hidden_act": "silu",
    "attention_bias": False,
    "router_aux_loss_coef": 0.001,
    "output_router_logits": False,
}
# ~1B random-weight models for correctness against transformers on the GPU.
LLAMA_1B = {
    **LLAMA_31_8B,
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 16,
    "vocab_size": 32000,
    "max_position_embeddings": 8192,
    "rope_scaling": None,
    "eos_token_id": 2,
    "bos_token_id": 1,
}
QWEN3_1B = {
    **QWEN3_8B,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "num_hidden_layers": 16,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "max_position_embeddings": 8192,
    "eos_token_id": 2,
    "bos_token_id": 1,
}

# Phi-3-mini's geometry (32 heads of 96: half a head is not a power of two) with its sliding window cut to 64
# tokens, so that the GPU test's prompts run past it; and Phi-4-mini's (24 heads of 128, a quarter of each
# unrotated, longrope, tied embeddings). Both cut to 4 layers and a 32000-token vocabulary for random-weight
# tests; the longrope factors are made up (of the right length): the weights are random too.
PHI3_MINI_RANDOM = {
    "architectures": ["Phi3ForCausalLM"],
    "model_type": "phi3",
    "hidden_size": 3072,
    "intermediate_size": 8192,
    "num_hidden_layers": 4,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32064,
    "max_position_embeddings": 4096,
    "original_max_position_embeddings": 4096,
    "sliding_window": 64,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "hidden_act": "silu",
    "bos_token_id": 1,
    "eos_token_id": 32000,
    "pad_token_id": 32000,
}
PHI4_MINI_RANDOM = {
    **PHI3_MINI_RANDOM,
    "num_attention_heads": 24,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "max_position_embeddings": 131072,
    "sliding_window": None,
    "partial_rotary_factor": 0.75,
    "rope_theta": 250000.0,
    "rope_scaling": {
        "type": "longrope",
        "short_factor": [1.0 + 0.05 * i for i in range(48)],
        "long_factor": [1.0 + 1.5 * i for i in range(48)],
    },
    "tie_word_embeddings": True,
    "eos_token_id": 2,
    "pad_token_id": 0,
}

# DeepSeek family (MLA + DeepSeekMoE), bf16 shapes (the published V3 and Kimi-K2 checkpoints are block-FP8;
# their quantization_config is left out: these configs describe full-precision weights).
DEEPSEEK_V2_LITE = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    "hidden_size": 2048,
    "intermediate_size": 10944,
    "moe_intermediate_size": 1408,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "q_lora_rank": None,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "num_experts_per_tok": 6,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "n_group": 1,
    "topk_group": 1,
    "topk_method": "greedy",
    "scoring_func": "softmax",
    "norm_topk_prob": False,
    "routed_scaling_factor": 1.0,
    "vocab_size": 102400,
    "max_position_embeddings": 163840,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000,
    "rope_scaling": {
        "type": "yarn",
        "factor": 40,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 0.707,
        "mscale_all_dim": 0.707,
    },
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 100000,
    "eos_token_id": 100001,
    "hidden_act": "silu",
    "attention_bias": False,
}
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_nextn_predict_layers": 1,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "moe_layer_freq": 1,
    "n_group": 8,
    "topk_group": 4,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "vocab_size": 129280,
    "max_position_embeddings": 163840,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000,
    "rope_scaling": {
        "type": "yarn",
        "factor": 40,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 0,
    "eos_token_id": 1,
    "hidden_act": "silu",
    "attention_bias": False,
}
# Kimi-K2: DeepSeek-V3's architecture with 384 experts, 64 heads, one dense layer, its own model_type and
# auto_map (loaded as DeepSeek-V3's config: the checkpoint's Python is never run).
KIMI_K2 = {
    **DEEPSEEK_V3,
    "model_type": "kimi_k2",
    "auto_map": {
        "AutoConfig": "configuration_deepseek.DeepseekV3Config",
        "AutoModel": "modeling_deepseek.DeepseekV3Model",
        "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM",
    },
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "n_routed_experts": 384,
    "first_k_dense_replace": 1,
    "n_group": 1,
    "topk_group": 1,
    "num_nextn_predict_layers": 0,
    "routed_scaling_factor": 2.827,
    "vocab_size": 163840,
    "max_position_embeddings": 131072,
    "rope_theta": 50000.0,
    "rope_scaling": {
        "type": "yarn",
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "beta_fast": 1.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
    "bos_token_id": 163584,
    "eos_token_id": 163585,
}

# GLM-4.5-Air (zai-org/GLM-4.5-Air): 106B parameters, 12B active; its config.json in transformers 4's layout
# (partial_rotary_factor and rope_theta at the top). The MTP layer (num_nextn_predict_layers) is not built.
GLM_45_AIR = {
    "architectures": ["Glm4MoeForCausalLM"],
    "model_type": "glm4_moe",
    "hidden_size": 4096,
    "intermediate_size": 10944,
    "moe_intermediate_size": 1408,
    "num_hidden_layers": 46,
    "num_nextn_predict_layers": 1,
    "num_attention_heads": 96,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "attention_bias": True,
    "use_qk_norm": False,
    "partial_rotary_factor": 0.5,
    "n_routed_experts": 128,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 1,
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.0,
    "vocab_size": 151552,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 1000000,
    "rope_scaling": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "pad_token_id": 151329,
    "eos_token_id": [151329, 151336, 151338],
    "hidden_act": "silu",
}

# Sliding-window models (the hybrid SWA pool): transformers 5's layout, layer_types spelled out.
GEMMA_2_9B = {
    "architectures": ["Gemma2ForCausalLM"],
    "model_type": "gemma2",
    "hidden_size": 3584,
    "intermediate_size": 14336,
    "num_hidden_layers": 42,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 256,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "layer_types": ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(42)],
    "attn_logit_softcapping": 50.0,
    "final_logit_softcapping": 30.0,
    "vocab_size": 256000,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "hidden_activation": "gelu_pytorch_tanh",
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "bos_token_id": 2,
    "eos_token_id": 1,
    "pad_token_id": 0,
}

GEMMA_3_27B = {
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "hidden_size": 5376,
    "intermediate_size": 21504,
    "num_hidden_layers": 62,
    "num_attention_heads": 32,
    "num_key_value_heads": 16,
    "head_dim": 128,
    "query_pre_attn_scalar": 168,
    "sliding_window": 1024,
    "layer_types": ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(62)],
    "vocab_size": 262208,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
    },
    "hidden_activation": "gelu_pytorch_tanh",
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "bos_token_id": 2,
    "eos_token_id": [1, 106],
    "pad_token_id": 0,
}

SHAPES: Dict[str, dict] = {
    "Llama-3.1-8B": LLAMA_31_8B,
    "Qwen3-8B": QWEN3_8B,
    "Qwen3-30B-A3B": QWEN3_30B_A3B,
    "Qwen3-30B-A3B-12L": {**QWEN3_30B_A3B, "num_hidden_layers": 12},
    "Llama-1B-random": LLAMA_1B,
    "Qwen3-1B-random": QWEN3_1B,
    "Phi3-mini-random": PHI3_MINI_RANDOM,
    "Phi4-mini-random": PHI4_MINI_RANDOM,
    "DeepSeek-V2-Lite": DEEPSEEK_V2_LITE,
    "DeepSeek-V3": DEEPSEEK_V3,
    "DeepSeek-V3-4L": {**DEEPSEEK_V3, "num_hidden_layers": 4, "num_nextn_predict_layers": 0},
    "Kimi-K2": KIMI_K2,
    "GLM-4.5-Air": GLM_45_AIR,
    "GLM-4.5-Air-4L": {**GLM_45_AIR, "num_hidden_layers": 4, "num_nextn_predict_layers": 0},  # 1 dense + 3 MoE
    "Gemma-2-9B": GEMMA_2_9B,
    "Gemma-3-27B": GEMMA_3_27B,
}


def write_config(name: str, out_dir: str) -> str:
    path = os.path.join(out_dir, name)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(SHAPES[name], f, indent=2)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="/tmp/sglang-model-configs")
    parser.add_argument("--models", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    args = parser.parse_args()
    for name in args.models:
        print(write_config(name, args.out))


if __name__ == "__main__":
    main()
