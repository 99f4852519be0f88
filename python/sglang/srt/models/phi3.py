"""Phi-3 / Phi-3.5-mini / Phi-4-mini: the Llama decoder as transformers' Phi3 computes it.

What differs from Llama, and where it is handled:
- the checkpoint stores q/k/v as one `qkv_proj` and gate/up as one `gate_up_proj`: the same layout as our
  merged layers, whose loaders cut the fused tensor into its parts (so tensor parallelism splits it by head
  and by output like separate tensors); the names already match ours, so nothing is renamed;
- no projection has a bias, whatever `attention_bias` says (transformers' Phi3Attention ignores it);
- `partial_rotary_factor` (Phi-4-mini: 0.75): only the leading features of each head rotate
  (layers/rotary_embedding.py);
- `rope_scaling` longrope: the short factors and the attention factor, the context capped at
  `original_max_position_embeddings` (configs/model_config.py: transformers switches every position, cached
  ones included, to the long factors past it);
- `sliding_window` (Phi-3-mini-4k: 2047) windows every layer (configs/sliding_window.py);
- a native FP8 checkpoint on the GPU keeps its fused tensors' fp8 codes and scales (block fp8: the 128-row scale
  blocks of the fused tensor are cut at q|k|v and gate|up as the weights are, so every part must be a multiple of
  128 wide: refused at start-up by name otherwise, configs/quantization_config.py:check_block_fp8_layout).
"""

from __future__ import annotations

from sglang.srt.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM, LlamaModel


class Phi3Attention(LlamaAttention):
    reads_attention_bias = False


class Phi3DecoderLayer(LlamaDecoderLayer):
    attention_cls = Phi3Attention


class Phi3Model(LlamaModel):
    layer_cls = Phi3DecoderLayer


class Phi3ForCausalLM(LlamaForCausalLM):
    model_cls = Phi3Model
    # The checkpoint's qkv_proj / gate_up_proj are our parameters' names: the merged layers' loaders take the
    # fused tensors whole (shard id None); a checkpoint with separate q/k/v/gate/up tensors loads as Llama's.


EntryClass = Phi3ForCausalLM
