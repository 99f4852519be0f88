"""A GGUF file's metadata and tensor table, read in a fraction of the time `gguf.GGUFReader` takes.

`gguf.GGUFReader` turns every metadata value into numpy views one element at a time: for a file whose
tokenizer carries ~100k strings (SmolLM2's vocabulary and merges) that is ~2.7 s on one core, paid by every
process that reads the config (the server's main process and each scheduler). This reader walks the same
layout (gguf's spec: header, key/value pairs, tensor infos, aligned data) with `struct` over one memory map and
keeps the tensor data as the same numpy views GGUFReader gives (shape, dtype and byte layout, so
`gguf.quants.dequantize` takes them unchanged). Values are plain Python: scalars, str, lists.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, quant_shape_to_byte_shape

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# Fixed-size value types: struct format (little-endian).
_SCALAR = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
# Tensor types stored as plain numbers (the others are quantized blocks, kept as bytes like GGUFReader does).
_PLAIN_TENSOR = {
    GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F32: np.float32,
    GGMLQuantizationType.F64: np.float64,
    GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16,
    GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    tensor_type: GGMLQuantizationType
    shape: Tuple[int, ...]  # GGUF's order: fastest-varying dimension first
    data: np.ndarray  # a read-only view of the file: [rows..., cols] numbers, or [rows..., bytes] quantized


@dataclass(frozen=True)
class GGUFIndex:
    fields: Dict[str, Any]
    tensors: List[GGUFTensor]

    def field(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)


class _Cursor:
    def __init__(self, buf: memoryview) -> None:
        self.buf, self.pos = buf, 0

    def unpack(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.unpack("<Q")
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")  # a tokenizer may hold partial UTF-8 pieces

    def value(self, kind: int) -> Any:
        kind = GGUFValueType(kind)
        if kind == GGUFValueType.STRING:
            return self.string()
        if kind == GGUFValueType.ARRAY:
            item_kind, count = self.unpack("<I"), self.unpack("<Q")
            if item_kind in _SCALAR:  # one struct call for the whole array
                fmt = _SCALAR[GGUFValueType(item_kind)]
                items = struct.unpack_from(f"<{count}{fmt[1]}", self.buf, self.pos)
                self.pos += count * struct.calcsize(fmt)
                return list(items)
            return [self.value(item_kind) for _ in range(count)]
        return self.unpack(_SCALAR[kind])


def read_gguf_index(path: str) -> GGUFIndex:
    """The metadata and tensor table of the GGUF file at `path` (versions 2 and 3; ValueError otherwise)."""
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    buf = memoryview(mapped)
    cur = _Cursor(buf)
    if bytes(buf[:4]) != MAGIC:
        raise ValueError(f"{path} is not a GGUF file (magic {bytes(buf[:4])!r})")
    cur.pos = 4
    version = cur.unpack("<I")
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version} is not supported (2 and 3 are)")
    n_tensors, n_fields = cur.unpack("<Q"), cur.unpack("<Q")
    fields: Dict[str, Any] = {}
    for _ in range(n_fields):
        key = cur.string()
        fields[key] = cur.value(cur.unpack("<I"))
    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        dims = tuple(cur.unpack("<Q") for _ in range(cur.unpack("<I")))
        infos.append((name, GGMLQuantizationType(cur.unpack("<I")), dims, cur.unpack("<Q")))
    alignment = int(fields.get("general.alignment", DEFAULT_ALIGNMENT))
    data_start = -(-cur.pos // alignment) * alignment
    array = np.frombuffer(mapped, dtype=np.uint8)  # keeps the map alive as long as a tensor view does
    tensors = []
    for name, kind, dims, offset in infos:
        count = int(np.prod(dims, dtype=np.int64))
        block, block_bytes = GGML_QUANT_SIZES[kind]
        start = data_start + offset
        np_shape: Tuple[int, ...] = tuple(reversed(dims))
        if kind in _PLAIN_TENSOR:
            dtype = np.dtype(_PLAIN_TENSOR[kind])
            data = array[start : start + count * dtype.itemsize].view(dtype).reshape(np_shape)
        else:
            data = array[start : start + count * block_bytes // block].reshape(
                quant_shape_to_byte_shape(np_shape, kind)
            )
        tensors.append(GGUFTensor(name, kind, dims, data))
    return GGUFIndex(fields, tensors)
