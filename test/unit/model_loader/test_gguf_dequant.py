from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="per-commit-cpu")

# model_loader/gguf_dequant.py: Q4_0, Q4_1 and Q8_0 blocks dequantize to exactly gguf's own float32 values (random
# blocks with every nibble and int8 value, finite fp16 scales of every magnitude, and the built-in SmolLM2's tensors
# of those types); other types are left to gguf.

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from sglang.srt.model_loader.gguf_dequant import BLOCK_BYTES, dequantize_torch


def random_blocks(qtype: Q, rows: int, blocks_per_row: int, seed: int) -> np.ndarray:
    """Raw rows of `qtype` blocks: random payload bytes, scale fields set to random finite fp16 values."""
    rng = np.random.default_rng(seed)
    size = BLOCK_BYTES[qtype]
    raw = rng.integers(0, 256, size=(rows * blocks_per_row, size), dtype=np.uint8)
    scales = 2 if qtype == Q.Q4_1 else 1  # Q4_1 has d and m
    magnitudes = rng.uniform(-14, 15, size=(raw.shape[0], scales))  # fp16's normal range, both signs
    values = (np.sign(rng.standard_normal(magnitudes.shape)) * np.exp2(magnitudes)).astype(np.float16)
    raw[:, : 2 * scales] = values.view(np.uint8).reshape(raw.shape[0], 2 * scales)
    return raw.reshape(rows, blocks_per_row * size)


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q8_0])
def test_blocks_match_gguf_bit_for_bit(qtype: Q) -> None:
    data = random_blocks(qtype, rows=37, blocks_per_row=5, seed=int(qtype))
    got = dequantize_torch(data, qtype)
    want = gguf.quants.dequantize(data, qtype)
    assert got.dtype == torch.float32 and tuple(got.shape) == want.shape == (37, 5 * 32)
    assert np.array_equal(bits(got.numpy()), bits(want))


def test_other_types_are_left_to_gguf() -> None:
    assert dequantize_torch(np.zeros((2, 210), dtype=np.uint8), Q.Q6_K) is None
    assert dequantize_torch(np.zeros((2, 4), dtype=np.float32), Q.F32) is None


def test_smollm2_tensors_match_gguf(smollm2_gguf_reader) -> None:
    picked = {}
    for t in smollm2_gguf_reader.tensors:  # the first tensor of each type done here (the file has Q4_1 and one Q8_0)
        if t.tensor_type in BLOCK_BYTES:
            picked.setdefault(t.tensor_type, t)
    assert Q.Q4_1 in picked and Q.Q8_0 in picked
    for t in picked.values():
        want = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        assert np.array_equal(bits(dequantize_torch(t.data, t.tensor_type).numpy()), bits(want)), t.name
