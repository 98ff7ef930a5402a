"""TFRecord files in the original google-research/bert pretraining format.

Each record is a ``tf.train.Example`` with exactly the original features, so data prepared by
either tool trains in the other:

=======================  =======  ===========================
feature                  type     length
=======================  =======  ===========================
input_ids                int64    max_seq_length
input_mask               int64    max_seq_length
segment_ids              int64    max_seq_length
masked_lm_positions      int64    max_predictions_per_seq
masked_lm_ids            int64    max_predictions_per_seq
masked_lm_weights        float    max_predictions_per_seq
next_sentence_labels     int64    1 (1 = B is a random sentence)
=======================  =======  ===========================

Public API: ``feature_spec``, ``serialize_example`` (one unpadded instance) and
``serialize_arrays`` (rows of batch arrays), both without TensorFlow; ``write_records`` (atomic: a
hidden temporary file renamed into place, so a crash never leaves a half-written shard under the
final name; without TensorFlow, TFRecord's framing byte for byte), ``parse_batch`` (batched
parse with int32/float32 casts and ``next_sentence_labels`` squeezed to [B]),
``list_record_files`` and ``read_records`` (NumPy rows, for inspection and tests).

TensorFlow is imported inside the functions that need it.
"""

from __future__ import annotations

import glob
import os
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence

import numpy as np

from bert_jax.data.layout import RECORD_SUFFIX
from bert_jax.runtime import fs
from bert_jax.runtime.errors import UserError
from bert_jax.runtime.outputs import temporary_name

INT_FEATURES = ("input_ids", "input_mask", "segment_ids")
PREDICTION_FEATURES = ("masked_lm_positions", "masked_lm_ids")
FEATURE_NAMES = (
    "input_ids",
    "input_mask",
    "segment_ids",
    "masked_lm_positions",
    "masked_lm_ids",
    "masked_lm_weights",
    "next_sentence_labels",
)
# Read-ahead per open record file; saying it explicitly also keeps TF from logging its default.
READ_BUFFER_BYTES = 1 << 20


def import_tensorflow():
    """TensorFlow for the input pipeline only: never let it claim an accelerator from JAX."""
    import tensorflow as tf

    try:
        tf.config.set_visible_devices([], "GPU")
    except RuntimeError:
        # Devices were already initialised by an earlier import in this process; they were
        # hidden then.
        pass
    return tf


def graph_function(fn):
    """``fn`` for tf.data to trace as written.

    tf.data otherwise passes every function through AutoGraph, which parses and rewrites its
    source (and that of each function it calls) so that Python ``if`` and ``for`` over tensors
    become graph ops: about a second of CPU in each process that builds a pipeline. The
    pipeline's functions branch on settings (Python values) only, never on a tensor, so the
    rewrite would change nothing; a function that did branch on a tensor fails when traced.
    """
    return import_tensorflow().autograph.experimental.do_not_convert(fn)


def feature_spec(max_seq_length: int, max_predictions_per_seq: int) -> dict:
    """The original parsing spec: ``tf.io.FixedLenFeature`` per feature."""
    tf = import_tensorflow()
    return {
        "input_ids": tf.io.FixedLenFeature([max_seq_length], tf.int64),
        "input_mask": tf.io.FixedLenFeature([max_seq_length], tf.int64),
        "segment_ids": tf.io.FixedLenFeature([max_seq_length], tf.int64),
        "masked_lm_positions": tf.io.FixedLenFeature([max_predictions_per_seq], tf.int64),
        "masked_lm_ids": tf.io.FixedLenFeature([max_predictions_per_seq], tf.int64),
        "masked_lm_weights": tf.io.FixedLenFeature([max_predictions_per_seq], tf.float32),
        "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
    }


# tf.train.Example written directly in the protobuf wire format. The schema (TensorFlow's
# example.proto / feature.proto): Example{features=1: Features}, Features{feature=1: map<string,
# Feature>}, Feature{oneof: float_list=2: FloatList, int64_list=3: Int64List}, and the lists hold
# one packed repeated field 1 (varints for int64, little-endian fixed32 for float). Map entries are
# {key=1, value=2} in ascending key order, which is what protobuf's deterministic serialization
# writes; tests check the bytes against ``tf.train.Example.SerializeToString``. Encoding by hand
# needs no TensorFlow (workers stay light) and is several times faster than building messages.
# Tags of the length-delimited fields 1, 2 and 3 (field number << 3 | wire type 2).
_FIELD_1, _FIELD_2, _FIELD_3 = b"\x0a", b"\x12", b"\x1a"
_INT64_LIST, _FLOAT_LIST = _FIELD_3, _FIELD_2  # Feature's oneof: int64_list = 3, float_list = 2
_FLOAT_ONE, _FLOAT_ZERO = struct.pack("<f", 1.0), struct.pack("<f", 0.0)


def _varint(value: int) -> bytes:
    """One varint; negative int64 values take ten bytes (two's complement), as protobuf's."""
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# Varints of 0 .. 2**16 - 1 (ids and lengths met in practice), looked up instead of computed;
# filled on first use (``_varints``). The table is twice as long, its upper half None: a negative
# value (which list indexing would wrap) or one past 2**16 finds None and takes the general path.
_TABLE_SIZE = 1 << 16
_VARINTS: list[bytes | None] = []
_KEYS = {name: _FIELD_1 + _varint(len(name)) + name.encode() for name in FEATURE_NAMES}
_KINDS = {
    name: _FLOAT_LIST if name == "masked_lm_weights" else _INT64_LIST for name in FEATURE_NAMES
}
_KEY_ORDER = tuple(sorted(FEATURE_NAMES))  # map entries in key order: deterministic serialization
# Everything of a map entry before its packed values depends only on the feature and the number
# of bytes of those values: cached by (name, size).
_PREFIXES: dict[tuple[str, int], bytes] = {}


def _varints() -> list[bytes | None]:
    if not _VARINTS:
        _VARINTS.extend(bytes((v,)) for v in range(1 << 7))
        _VARINTS.extend(bytes((v & 0x7F | 0x80, v >> 7)) for v in range(1 << 7, 1 << 14))
        _VARINTS.extend(
            bytes((v & 0x7F | 0x80, v >> 7 & 0x7F | 0x80, v >> 14))
            for v in range(1 << 14, _TABLE_SIZE)
        )
        _VARINTS.extend([None] * _TABLE_SIZE)
    return _VARINTS


def _packed_varints(values: Sequence[int]) -> bytes:
    try:
        return b"".join(map(_VARINTS.__getitem__, values))
    except (IndexError, TypeError):
        return b"".join(_varint(int(v)) for v in values)


def _packed_small(values: Sequence[int]) -> bytes:
    """``_packed_varints`` for values usually in [0, 128), where a varint is the byte itself."""
    try:
        packed = bytes(values)
    except ValueError:  # a value outside [0, 256)
        return _packed_varints(values)
    return packed if packed.isascii() else _packed_varints(values)


def _entry_prefix(name: str, size: int) -> bytes:
    """Map entry {key: name, value: Feature{kind: Int64List or FloatList{value: <size bytes>}}}
    up to where its packed values start."""
    prefix = _PREFIXES.get((name, size))
    if prefix is None:
        values_head = _FIELD_1 + _varint(size) if size else b""  # an empty list has no field
        feature_head = _KINDS[name] + _varint(len(values_head) + size) + values_head
        feature_size = len(feature_head) + size
        entry_head = _KEYS[name] + _FIELD_2 + _varint(feature_size) + feature_head
        entry_size = len(entry_head) + size
        prefix = _PREFIXES[(name, size)] = _FIELD_1 + _varint(entry_size) + entry_head
    return prefix


def _example(packed: Mapping[str, bytes]) -> bytes:
    """Example{features: Features{feature: a map entry per name}} from each feature's packed
    values."""
    parts = []
    for name in _KEY_ORDER:
        values = packed[name]
        parts.append(_PREFIXES.get((name, len(values))) or _entry_prefix(name, len(values)))
        parts.append(values)
    features = b"".join(parts)
    size = len(features)
    return _FIELD_1 + (_VARINTS[size] if size < _TABLE_SIZE else _varint(size)) + features


def serialize_example(
    input_ids: Sequence[int],
    segment_ids: Sequence[int],
    masked_lm_positions: Sequence[int],
    masked_lm_ids: Sequence[int],
    next_sentence_label: int,
    max_seq_length: int,
    max_predictions_per_seq: int,
) -> bytes:
    """One unpadded instance as a serialized Example (the bytes ``serialize_arrays`` writes).

    Padding is id 0, position 0; ``input_mask`` is 1 over the tokens and ``masked_lm_weights``
    1.0 over the predictions.
    """
    length, num_predictions = len(input_ids), len(masked_lm_positions)
    if length > max_seq_length or num_predictions > max_predictions_per_seq:
        raise ValueError(
            f"an instance has {length} tokens / {num_predictions} predictions; limits are "
            f"{max_seq_length} / {max_predictions_per_seq}"
        )
    _varints()
    pad = b"\x00" * (max_seq_length - length)  # the varint of 0
    pad_predictions = b"\x00" * (max_predictions_per_seq - num_predictions)
    return _example(
        {
            "input_ids": _packed_varints(input_ids) + pad,
            "input_mask": b"\x01" * length + pad,
            "segment_ids": _packed_small(segment_ids) + pad,
            "masked_lm_positions": _packed_small(masked_lm_positions) + pad_predictions,
            "masked_lm_ids": _packed_varints(masked_lm_ids) + pad_predictions,
            "masked_lm_weights": _FLOAT_ONE * num_predictions
            + _FLOAT_ZERO * (max_predictions_per_seq - num_predictions),
            "next_sentence_labels": _varint(int(next_sentence_label)),
        }
    )


def serialize_arrays(arrays: Mapping[str, np.ndarray]) -> list[bytes]:
    """Serialize rows of batch-format arrays (``sentence_pairs.instances_to_arrays``) as Examples.

    No TensorFlow; the bytes are deterministic (map entries in key order), so they never depend
    on the process that made them. All rows are encoded at once with array operations: every
    piece of every record gets a fixed range of columns in one byte matrix (varints at their
    longest, prefixes at their longest), a mask says which bytes each row uses, and taking the
    used bytes row after row gives the records back to back.
    """
    num_rows = len(np.asarray(arrays["input_ids"]))
    if num_rows == 0:
        return []
    pieces: list[tuple[np.ndarray, np.ndarray | None]] = []
    features_size = np.zeros(num_rows, dtype=np.int64)
    for name in _KEY_ORDER:
        if name == "masked_lm_weights":
            weights = np.ascontiguousarray(arrays[name], dtype="<f4").reshape(num_rows, -1)
            values, used = weights.view(np.uint8), None
        else:
            values, used = _varint_columns(np.asarray(arrays[name]).reshape(num_rows, -1))
        size = np.full(num_rows, values.shape[1]) if used is None else used.sum(axis=1)
        prefix, prefix_used, prefix_size = _prefix_columns(name, size)
        pieces += [(prefix, prefix_used), (values, used)]
        features_size += prefix_size + size
    head, head_used = _varint_columns(features_size[:, None])
    pieces.insert(0, (np.full((num_rows, 1), _FIELD_1[0], dtype=np.uint8), None))
    pieces.insert(1, (head, head_used))
    matrix = np.concatenate([values for values, _ in pieces], axis=1)
    used = np.concatenate(
        [np.ones(v.shape, dtype=bool) if u is None else u for v, u in pieces], axis=1
    )
    data = matrix[used].tobytes()
    ends = np.cumsum(used.sum(axis=1)).tolist()
    return [data[start:end] for start, end in zip([0, *ends[:-1]], ends)]


def _varint_columns(values: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Varints of int64 values [N, K] as bytes [N, K * width] and which of them are used (None:
    all, one byte each); negative values take ten bytes (two's complement), as protobuf's."""
    values = values.astype(np.int64).view(np.uint64)
    largest = int(values.max()) if values.size else 0
    if largest < 0x80:
        return values.astype(np.uint8), None
    width = (largest.bit_length() + 6) // 7
    if largest < 1 << 32:
        values = values.astype(np.uint32)  # narrower arithmetic, same bytes
    data = np.empty((*values.shape, width), dtype=np.uint8)
    used = np.empty((*values.shape, width), dtype=bool)
    used[..., 0] = True
    for byte in range(width):
        group = values >> (7 * byte) if byte else values
        if byte + 1 < width:
            more = values >= (1 << (7 * (byte + 1)))
            data[..., byte] = (group & 0x7F) | (more.astype(np.uint8) << 7)
            used[..., byte + 1] = more
        else:
            data[..., byte] = group
    return data.reshape(len(values), -1), used.reshape(len(values), -1)


def _prefix_columns(name: str, size: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``_entry_prefix`` per row as bytes [N, longest], which are used, and their lengths."""
    sizes, inverse = np.unique(size, return_inverse=True)
    prefixes = [_PREFIXES.get((name, s)) or _entry_prefix(name, s) for s in sizes.tolist()]
    width = max(len(p) for p in prefixes)
    table = np.zeros((len(prefixes), width), dtype=np.uint8)
    lengths = np.array([len(p) for p in prefixes])
    for row, prefix in enumerate(prefixes):
        table[row, : len(prefix)] = np.frombuffer(prefix, dtype=np.uint8)
    used = np.arange(width) < lengths[:, None]
    inverse = inverse.reshape(-1)
    return table[inverse], used[inverse], lengths[inverse]


def _masked_crc(data: bytes) -> bytes:
    """TFRecord's checksum: CRC-32C, rotated and offset (``tensorflow/core/lib/hash/crc32c.h``)."""
    import google_crc32c  # gcsfs's dependency; its C implementation

    crc = google_crc32c.value(data)
    return struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)


def _framed(serialized: Iterable[bytes]) -> Iterator[bytes]:
    """Each record as TFRecord frames it: its length, the length's checksum, the record, its
    checksum (what ``tf.io.TFRecordWriter`` writes, byte for byte; tests/test_data_records.py)."""
    for record in serialized:
        length = struct.pack("<Q", len(record))
        yield length + _masked_crc(length)
        yield record
        yield _masked_crc(record)


def write_records(path: str, serialized: Sequence[bytes]) -> int:
    """Write serialized examples to ``path`` atomically; returns the number written. A full disk
    is the OSError it is. Without TensorFlow: a process that only writes records (a ``data
    prepare`` driver, a Beam worker) does not pay its import."""
    if fs.is_remote(path):  # the object appears whole when closed
        with fs.open(path, "wb") as f:
            f.writelines(_framed(serialized))
        return len(serialized)
    fs.makedirs(os.path.dirname(fs.abspath(path)), exist_ok=True)
    tmp = temporary_name(path)
    try:
        with open(tmp, "wb", buffering=1 << 20) as f:
            f.writelines(_framed(serialized))
        fs.rename(tmp, path)
    finally:
        if fs.exists(tmp):
            fs.remove(tmp)
    return len(serialized)


def records_bytes(serialized: Sequence[bytes]) -> int:
    """The size of a TFRecord file holding `serialized`: each record framed by 16 bytes (its
    length and two CRCs)."""
    return sum(len(record) + 16 for record in serialized)


def parse_batch(serialized, max_seq_length: int, max_predictions_per_seq: int) -> dict:
    """Parse a [B] string tensor into the batch format with explicit dtypes.

    int64 features become int32 (what the model consumes; TPUs would truncate silently anyway)
    and ``next_sentence_labels`` is squeezed from [B, 1] to [B].
    """
    tf = import_tensorflow()
    parsed = tf.io.parse_example(serialized, feature_spec(max_seq_length, max_predictions_per_seq))
    batch = {}
    for name in FEATURE_NAMES:
        value = parsed[name]
        batch[name] = value if value.dtype == tf.float32 else tf.cast(value, tf.int32)
    batch["next_sentence_labels"] = tf.squeeze(batch["next_sentence_labels"], axis=-1)
    return batch


def list_record_files(records: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    """Record files from a directory (its ``*.tfrecord*`` files), a glob, a file, or a list."""
    if isinstance(records, (str, os.PathLike)):
        records = [records]
    files: list[str] = []
    for item in records:
        item = os.fspath(item)
        if fs.isdir(item):
            found = sorted(
                os.path.join(item, f)
                for f in fs.listdir(item)
                if RECORD_SUFFIX in f and not f.startswith(".")
            )
            if not found:
                raise UserError(f"{item} holds no {RECORD_SUFFIX} files")
            files.extend(found)
        elif fs.isfile(item):  # before globbing: "part [1].tfrecord" is that file
            files.append(item)
        elif glob.has_magic(item):
            found = sorted(f for f in fs.glob(item) if fs.isfile(f))
            if not found:
                raise UserError(f"record pattern {item} matches no files")
            files.extend(found)
        else:
            raise UserError(f"record file not found: {item}")
    if not files:
        raise UserError("no record files given")
    return files


def read_records(
    records: str | os.PathLike | Sequence[str | os.PathLike],
    max_seq_length: int,
    max_predictions_per_seq: int,
    batch_size: int = 256,
) -> Iterator[dict[str, np.ndarray]]:
    """Batches (the last one may be short) of parsed records in file order, as NumPy arrays."""
    tf = import_tensorflow()
    files = list_record_files(records)
    dataset = tf.data.TFRecordDataset(files, buffer_size=READ_BUFFER_BYTES).batch(batch_size)
    dataset = dataset.map(
        graph_function(lambda s: parse_batch(s, max_seq_length, max_predictions_per_seq))
    )
    yield from dataset.as_numpy_iterator()


def count_records(path: str) -> int:
    """Number of records in one TFRecord file (reads it through once)."""
    tf = import_tensorflow()
    return int(
        tf.data.TFRecordDataset([path], buffer_size=READ_BUFFER_BYTES)
        .reduce(np.int64(0), graph_function(lambda n, _: n + 1))
        .numpy()
    )
