"""The safetensors format, read and written with NumPy: an 8-byte little-endian header length, a
JSON header of name -> dtype/shape/offsets, then raw little-endian bytes. Tensors are read on
demand; a truncated or inconsistent file raises `ConversionError` naming the tensor."""

from __future__ import annotations

import dataclasses
import json
import os
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from bert_jax.convert.strict import ConversionError
from bert_jax.runtime import fs


def _safetensors_dtypes() -> dict[str, np.dtype]:
    import ml_dtypes  # a JAX dependency; NumPy has no bfloat16 of its own

    return {
        "F64": np.dtype("<f8"),
        "F32": np.dtype("<f4"),
        "F16": np.dtype("<f2"),
        "BF16": np.dtype(ml_dtypes.bfloat16),
        "I64": np.dtype("<i8"),
        "I32": np.dtype("<i4"),
        "I16": np.dtype("<i2"),
        "I8": np.dtype("i1"),
        "U8": np.dtype("u1"),
        "BOOL": np.dtype("?"),
    }


_MAX_HEADER_BYTES = 100 * 1024 * 1024


@dataclasses.dataclass
class SafetensorsFile:
    """A lazily read safetensors file: `shapes` from the header, `read(name)` per tensor."""

    path: str
    header: dict[str, Any]
    data_start: int
    metadata: dict[str, str]

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: tuple(info["shape"]) for name, info in self.header.items()}

    def read(self, name: str) -> np.ndarray:
        info = self.header[name]
        dtypes = _safetensors_dtypes()
        if info["dtype"] not in dtypes:
            raise ConversionError(
                f"{self.path}: tensor {name!r} has unsupported dtype {info['dtype']}"
            )
        dtype = dtypes[info["dtype"]]
        begin, end = (int(x) for x in info["data_offsets"])
        shape = tuple(int(n) for n in info["shape"])
        count = int(np.prod(shape))
        if end - begin != count * dtype.itemsize:
            raise ConversionError(
                f"{self.path}: tensor {name!r} claims shape {shape} {info['dtype']} but holds "
                f"{end - begin} bytes (a truncated or corrupt file)"
            )
        raw = fs.read_bytes(self.path, self.data_start + begin, self.data_start + end)
        if len(raw) != end - begin:
            raise ConversionError(
                f"{self.path}: tensor {name!r} is cut short ({len(raw)} of {end - begin} bytes): "
                "the file is truncated"
            )
        return np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)


def read_safetensors(path: str | os.PathLike) -> SafetensorsFile:
    """Opens a safetensors file and validates its header (tensors are read on demand)."""
    path = os.fspath(path)
    size = fs.getsize(path)
    with fs.open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ConversionError(f"{path} is not a safetensors file (shorter than 8 bytes)")
        (length,) = struct.unpack("<Q", head)
        if length > min(_MAX_HEADER_BYTES, size - 8):
            raise ConversionError(f"{path} is not a safetensors file (header length {length})")
        try:
            header = json.loads(f.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ConversionError(f"{path}: unreadable safetensors header ({err})") from err
    metadata = header.pop("__metadata__", None) or {}
    data_start = 8 + length
    for name, info in header.items():
        end = int(info["data_offsets"][1])
        if data_start + end > size:
            raise ConversionError(
                f"{path}: tensor {name!r} ends at byte {data_start + end} but the file has "
                f"{size} bytes: the file is truncated"
            )
    return SafetensorsFile(path, header, data_start, metadata)


def write_safetensors(
    path: str | os.PathLike, tensors: Mapping[str, np.ndarray], metadata: dict[str, str] | None
) -> None:
    """Writes NumPy arrays as a safetensors file (what `safetensors.numpy.save_file` writes)."""
    names = {dtype: name for name, dtype in _safetensors_dtypes().items()}
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    offset = 0
    arrays = []
    for name in sorted(tensors):
        array = np.ascontiguousarray(tensors[name])
        dtype = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
        if dtype not in names:
            raise ValueError(f"tensor {name!r}: dtype {array.dtype} has no safetensors name")
        array = array.astype(dtype, copy=False)
        header[name] = {
            "dtype": names[dtype],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        offset += array.nbytes
        arrays.append(array)
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
    with fs.open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for array in arrays:
            f.write(array.tobytes())
