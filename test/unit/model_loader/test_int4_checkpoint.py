from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=2, suite="per-commit-cpu")

# A pack-quantized INT4 checkpoint's tensors (compressed-tensors W4A16) read by model_loader/int4_checkpoint.py: the
# packed words' bytes are the INT4 expert format's own bytes, kept matrices pass as those bytes with fp32 group scales,
# the others are dequantized exactly; incomplete or inconsistent parts are errors naming the weight.

import pytest
import torch

from sglang.srt.configs.quantization_config import CheckpointQuantization
from sglang.srt.layers.quantization.int4 import Int4FusedMoEMethod
from sglang.srt.layers.quantization.utils import pack_nibbles
from sglang.srt.model_loader.int4_checkpoint import checkpoint_int4_weights, int4_code_bytes
from sglang.test.int4_checkpoints import dequantize_int4_reference, pack_int4_words, quantize_int4

QUANT = CheckpointQuantization("compressed-tensors", "group", "weight_scale", "none", (), 32)


def _codes(rows: int, cols: int, seed: int) -> torch.Tensor:
    return torch.randint(-8, 8, (rows, cols), generator=torch.Generator().manual_seed(seed), dtype=torch.int8)


def test_packed_words_are_the_int4_formats_bytes():
    """Code 8j + i in bits 4i of word j (compressed-tensors' packing, written out) reads back as the INT4 format's
    bytes (two codes q + 8 a byte, the first in the low nibble), a width that is not a multiple of 8 included."""
    for cols in (64, 40):
        codes = _codes(6, cols, seed=cols)
        words = pack_int4_words(codes)
        assert words.dtype == torch.int32 and words.shape == (6, -(-cols // 8))
        spelled = torch.stack([(words.to(torch.int64) >> (4 * i)) & 15 for i in range(8)], dim=-1).view(6, -1)
        assert torch.equal(spelled[:, :cols] - 8, codes.to(torch.int64))
        assert torch.equal(int4_code_bytes(words, 6, cols), pack_nibbles((codes + 8).to(torch.uint8)))


def _parts(name: str, rows: int, cols: int, seed: int):
    w = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))
    codes, scale = quantize_int4(w, 32)
    tensors = {
        name + ".weight_packed": pack_int4_words(codes),
        name + ".weight_scale": scale,
        name + ".weight_shape": torch.tensor([rows, cols], dtype=torch.int32),
    }
    return tensors, codes, scale


def test_kept_matrices_pass_as_bytes_and_the_rest_dequantized():
    expert = "model.layers.1.mlp.experts.0.down_proj"
    dense = "model.layers.0.mlp.down_proj"
    e_parts, e_codes, e_scale = _parts(expert, 64, 96, seed=1)
    d_parts, d_codes, d_scale = _parts(dense, 32, 64, seed=2)
    stream = [("model.norm.weight", torch.ones(4)), *reversed(list(e_parts.items())), *d_parts.items()]
    out = dict(checkpoint_int4_weights(stream, QUANT, torch.float32, keep=lambda name: ".experts." in name))
    assert set(out) == {
        "model.norm.weight",
        expert + ".weight_packed",
        expert + ".weight_group_scale",
        dense + ".weight",
    }
    assert torch.equal(out[expert + ".weight_packed"], pack_nibbles((e_codes + 8).to(torch.uint8)))
    assert out[expert + ".weight_group_scale"].dtype == torch.float32
    assert torch.equal(out[expert + ".weight_group_scale"], e_scale.float())
    assert torch.equal(out[dense + ".weight"], dequantize_int4_reference(d_codes, d_scale, 32))
    method = Int4FusedMoEMethod(32)  # the kept bytes and scales are what the INT4 experts dequantize exactly
    kept = method.dequantize(out[expert + ".weight_packed"], out[expert + ".weight_group_scale"], 64, 96, torch.float32)
    assert torch.equal(kept, dequantize_int4_reference(e_codes, e_scale, 32))


def test_incomplete_or_inconsistent_parts_are_named():
    parts, _, _ = _parts("model.layers.0.mlp.experts.1.up_proj", 32, 64, seed=3)
    partial = [(n, t) for n, t in parts.items() if not n.endswith("weight_shape")]
    with pytest.raises(ValueError, match="experts.1.up_proj.*weight_shape"):
        list(checkpoint_int4_weights(partial, QUANT, torch.float32, keep=lambda n: True))
    wrong = {**parts, "model.layers.0.mlp.experts.1.up_proj.weight_scale": torch.ones(32, 3)}
    with pytest.raises(ValueError, match=r"up_proj.weight_scale of shape \(32, 3\)"):
        list(checkpoint_int4_weights(wrong.items(), QUANT, torch.float32, keep=lambda n: True))
    odd = {**parts, "model.layers.0.mlp.experts.1.up_proj.weight_shape": torch.tensor([32, 63], dtype=torch.int32)}
    with pytest.raises(ValueError, match="odd width"):
        list(checkpoint_int4_weights(odd.items(), QUANT, torch.float32, keep=lambda n: True))
