"""GGUF weights -> Hugging Face-named float tensors (dequantized with the gguf package).

llama.cpp's converter permutes the rows of Q and K of Llama-architecture models (it expects the
interleaved rotary layout); we undo that so the HF rotate-half rotary applies unchanged.
"""

from __future__ import annotations

import re
from typing import Iterator, Optional, Tuple

import gguf
import numpy as np
import torch
from tqdm.auto import tqdm

from sglang.srt.configs.model_config import total_num_kv_heads
from sglang.srt.model_loader.gguf_config import config_from_gguf, open_gguf
from sglang.srt.model_loader.gguf_dequant import dequantize_torch

# GGUF per-block tensor name -> HF name (within model.layers.{i}.)
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")
ROPE_FREQS = "rope_freqs.weight"
_EXPERT_STACKS = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}


def hf_name(gguf_name: str) -> Optional[str]:
    m = _BLOCK_RE.match(gguf_name)
    if m:
        layer, part, kind = m.groups()
        if part in _BLOCK_NAMES:
            return f"model.layers.{layer}.{_BLOCK_NAMES[part]}.{kind}"
        return None
    base, _, kind = gguf_name.rpartition(".")
    return f"{_GLOBAL_NAMES[base]}.{kind}" if base in _GLOBAL_NAMES else None


def undo_rotary_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's permute(): rows go from interleaved pairs back to two halves per head."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def dequantize(tensor) -> np.ndarray:
    values = dequantize_torch(tensor.data, tensor.tensor_type)  # the legacy block types, else gguf's numpy code
    data = values.numpy() if values is not None else gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    # GGUF lists dims fastest-first; numpy data is already [rows, cols] for 2-D tensors.
    return np.asarray(data, dtype=np.float32).reshape([int(d) for d in reversed(tensor.shape)])


def gguf_weights_iterator(path: str, show_progress: bool = True) -> Iterator[Tuple[str, torch.Tensor]]:
    reader = open_gguf(path)
    config = config_from_gguf(path)
    permute = config.gguf_architecture == "llama"
    for tensor in tqdm(reader.tensors, desc="Loading GGUF weights", disable=not show_progress):
        if tensor.name == ROPE_FREQS:
            continue  # not a weight: config_from_gguf made it the rotary frequencies (config.rope_freq_factors)
        m = _BLOCK_RE.match(tensor.name)
        if m and m.group(2) in _EXPERT_STACKS:
            stacked = dequantize(tensor)  # [experts, out, in]
            for e in range(stacked.shape[0]):
                name = f"model.layers.{m.group(1)}.mlp.experts.{e}.{_EXPERT_STACKS[m.group(2)]}.weight"
                yield name, torch.tensor(stacked[e])
            continue
        name = hf_name(tensor.name)
        if name is None:
            raise ValueError(f"GGUF tensor {tensor.name} has no Hugging Face counterpart")
        w = dequantize(tensor)
        if permute and name.endswith("q_proj.weight"):
            w = undo_rotary_permute(w, config.num_attention_heads)
        elif permute and name.endswith("k_proj.weight"):
            w = undo_rotary_permute(w, total_num_kv_heads(config))  # the one KV-heads rule (MHA: = heads)
        yield name, torch.tensor(w)  # a copy: the reader's arrays are read-only memory maps
