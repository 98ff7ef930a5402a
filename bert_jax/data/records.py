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

Public API: ``feature_spec``, ``serialize_arrays`` (no TensorFlow needed), ``write_records``
(atomic: a hidden temporary file renamed into place, so a crash never leaves a half-written shard
under the final name),
``parse_batch`` (batched parse with int32/float32 casts and ``next_sentence_labels`` squeezed to
[B]), ``list_record_files`` and ``read_records`` (NumPy rows, for inspection and tests).

TensorFlow is imported inside the functions that need it.
"""

from __future__ import annotations

import functools
import glob
import os
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from bert_jax.data.files import temporary_name
from bert_jax.data.layout import RECORD_SUFFIX

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


@functools.lru_cache(maxsize=1)
def _example_class():
    """``tf.train.Example`` rebuilt from its schema with plain protobuf.

    Same package, message names and field numbers as TensorFlow's example.proto/feature.proto,
    so the bytes are identical (tests check), but serializing needs no TensorFlow: preparation
    workers stay light (no multi-second import, no hundreds of MB each).
    """
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    repeated, optional = field.LABEL_REPEATED, field.LABEL_OPTIONAL
    schema = descriptor_pb2.FileDescriptorProto(
        name="bert_jax/tf_example.proto", package="tensorflow", syntax="proto3"
    )
    for name, value_type in (
        ("BytesList", field.TYPE_BYTES),
        ("FloatList", field.TYPE_FLOAT),
        ("Int64List", field.TYPE_INT64),
    ):
        message = schema.message_type.add(name=name)
        message.field.add(name="value", number=1, type=value_type, label=repeated)
    feature = schema.message_type.add(name="Feature")
    feature.oneof_decl.add(name="kind")
    for number, name, type_name in (
        (1, "bytes_list", ".tensorflow.BytesList"),
        (2, "float_list", ".tensorflow.FloatList"),
        (3, "int64_list", ".tensorflow.Int64List"),
    ):
        feature.field.add(
            name=name,
            number=number,
            type=field.TYPE_MESSAGE,
            label=optional,
            type_name=type_name,
            oneof_index=0,
        )
    features = schema.message_type.add(name="Features")
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=field.TYPE_STRING, label=optional)
    entry.field.add(
        name="value",
        number=2,
        type=field.TYPE_MESSAGE,
        label=optional,
        type_name=".tensorflow.Feature",
    )
    features.field.add(
        name="feature",
        number=1,
        type=field.TYPE_MESSAGE,
        label=repeated,
        type_name=".tensorflow.Features.FeatureEntry",
    )
    example = schema.message_type.add(name="Example")
    example.field.add(
        name="features",
        number=1,
        type=field.TYPE_MESSAGE,
        label=optional,
        type_name=".tensorflow.Features",
    )
    # A private pool: TensorFlow registers its own tensorflow.Example in the default one.
    pool = descriptor_pool.DescriptorPool()
    pool.Add(schema)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Example"))


def serialize_arrays(arrays: Mapping[str, np.ndarray]) -> list[bytes]:
    """Serialize rows of batch-format arrays (``instances.instances_to_arrays``) as Examples.

    Pure protobuf (no TensorFlow). Serialization is deterministic (map entries in key order), so
    the bytes never depend on the process that made them.
    """
    example_class = _example_class()
    columns = {name: np.asarray(arrays[name]).tolist() for name in FEATURE_NAMES}
    serialized = []
    for row in range(len(columns["input_ids"])):
        example = example_class()
        feature = example.features.feature
        for name in (*INT_FEATURES, *PREDICTION_FEATURES):
            feature[name].int64_list.value.extend(columns[name][row])
        feature["masked_lm_weights"].float_list.value.extend(columns["masked_lm_weights"][row])
        feature["next_sentence_labels"].int64_list.value.append(
            columns["next_sentence_labels"][row]
        )
        serialized.append(example.SerializeToString(deterministic=True))
    return serialized


def write_records(path: str, serialized: Sequence[bytes]) -> int:
    """Write serialized examples to ``path`` atomically; returns the number written."""
    tf = import_tensorflow()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = temporary_name(path)
    try:
        with tf.io.TFRecordWriter(tmp) as writer:
            for record in serialized:
                writer.write(record)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return len(serialized)


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
        if os.path.isdir(item):
            found = sorted(
                os.path.join(item, f)
                for f in os.listdir(item)
                if RECORD_SUFFIX in f and not f.startswith(".")
            )
            if not found:
                raise ValueError(f"{item} holds no {RECORD_SUFFIX} files")
            files.extend(found)
        elif glob.has_magic(item):
            found = sorted(f for f in glob.glob(item) if os.path.isfile(f))
            if not found:
                raise ValueError(f"record pattern {item} matches no files")
            files.extend(found)
        elif os.path.isfile(item):
            files.append(item)
        else:
            raise FileNotFoundError(f"record file not found: {item}")
    if not files:
        raise ValueError("no record files given")
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
    dataset = dataset.map(lambda s: parse_batch(s, max_seq_length, max_predictions_per_seq))
    yield from dataset.as_numpy_iterator()


def count_records(path: str) -> int:
    """Number of records in one TFRecord file (reads it through once)."""
    tf = import_tensorflow()
    return int(
        tf.data.TFRecordDataset([path], buffer_size=READ_BUFFER_BYTES)
        .reduce(np.int64(0), lambda n, _: n + 1)
        .numpy()
    )
