from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="per-commit-cpu")

# Our GGUF reader (srt/model_loader/gguf_index.py) against gguf's own GGUFReader on the same files: every
# metadata value and every tensor (name, type, shape, the bytes of its data view) equal, for a file with
# every scalar kind, string arrays and quantized tensors written by gguf's GGUFWriter, and for SmolLM2's.

from typing import Optional

import gguf
import numpy as np
import pytest

from sglang.srt.model_loader.gguf_index import read_gguf_index
from sglang.test.runners import smollm2_gguf_path


def assert_same_as_gguf_reader(path: str, theirs: Optional[gguf.GGUFReader] = None) -> None:
    """Our index of `path` equals gguf's reader of it (`theirs`: that reader, already made)."""
    ours = read_gguf_index(path)
    theirs = theirs or gguf.GGUFReader(path)
    expected = {k: f.contents() for k, f in theirs.fields.items() if not k.startswith("GGUF.")}  # its pseudo-fields
    assert ours.fields.keys() == expected.keys()
    for key, value in expected.items():
        got = ours.fields[key]
        if isinstance(value, float) or (isinstance(value, list) and value and isinstance(value[0], float)):
            np.testing.assert_array_equal(np.float32(got), np.float32(value), err_msg=key)
        else:
            assert got == value, key
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for a, b in zip(ours.tensors, theirs.tensors):
        assert a.tensor_type == b.tensor_type and a.shape == tuple(int(d) for d in b.shape), a.name
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape, a.name
        assert np.array_equal(a.data, b.data), a.name


def test_every_value_kind_and_quantized_tensors(tmp_path):
    path = str(tmp_path / "kinds.gguf")
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(path, "llama")
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -5)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 0.1)
    w.add_float64("t.f64", 0.1)
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**62))
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo ✓")
    w.add_array("t.ints", [1, -2, 3])
    w.add_array("t.floats", [0.5, -1.25])
    w.add_array("t.strings", ["a", "", "日本", "<|endoftext|>"])
    w.add_tensor("f32", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((4, 2)).astype(np.float16))
    w.add_tensor("i32", np.arange(6, dtype=np.int32))
    q = gguf.quants.quantize(rng.standard_normal((2, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("q8", q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert_same_as_gguf_reader(path)
    index = read_gguf_index(path)
    assert index.field("t.strings") == ["a", "", "日本", "<|endoftext|>"] and index.field("t.u64") == 2**63 + 5
    dequantized = gguf.quants.dequantize(index.tensors[-1].data, index.tensors[-1].tensor_type)
    assert dequantized.shape == (2, 64)


def test_smollm2_file(smollm2_gguf_reader):
    assert_same_as_gguf_reader(smollm2_gguf_path(), smollm2_gguf_reader)


def test_not_a_gguf_file_is_refused(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"NOPE" + bytes(64))
    with pytest.raises(ValueError, match="not a GGUF file"):
        read_gguf_index(str(path))
