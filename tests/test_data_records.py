"""TFRecords in the original format: atomic writes, and records written by the original tool."""

from __future__ import annotations

import os

import numpy as np
import pytest

from bert_jax.data.records import tfrecord as records
from bert_jax.runtime.errors import UserError

LENGTH, SLOTS = 64, 10


def test_write_records_never_leaves_a_partial_file(tmp_path):
    path = tmp_path / "part-00000.tfrecord"

    def failing():
        yield b"one record"
        raise RuntimeError("disk full")

    class Records:
        def __iter__(self):
            return failing()

        def __len__(self):
            return 2

    with pytest.raises(RuntimeError, match="disk full"):
        records.write_records(str(path), Records())
    assert os.listdir(tmp_path) == []
    assert records.write_records(str(path), [b"a", b"b"]) == 2
    assert records.count_records(str(path)) == 2


def test_write_records_writes_the_bytes_of_tensorflows_writer(tmp_path):
    """The framing written without TensorFlow is TFRecordWriter's, byte for byte (an empty
    record, short and long ones)."""
    import tensorflow as tf

    rng = np.random.default_rng(3)
    serialized = [b"", b"x", *(rng.bytes(int(n)) for n in rng.integers(1, 5000, size=20))]
    ours, theirs = tmp_path / "ours.tfrecord", tmp_path / "theirs.tfrecord"
    assert records.write_records(str(ours), serialized) == len(serialized)
    with tf.io.TFRecordWriter(str(theirs)) as writer:
        for record in serialized:
            writer.write(record)
    assert ours.read_bytes() == theirs.read_bytes()
    assert [r.numpy() for r in tf.data.TFRecordDataset(str(ours))] == serialized


def test_records_written_like_the_original_tool_are_read(tmp_path):
    """Examples built the way create_pretraining_data.py builds them (int64 + float lists)."""
    import tensorflow as tf

    def int_feature(values):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=list(values)))

    path = tmp_path / "tf_examples.tfrecord"
    rng = np.random.default_rng(0)
    written = []
    with tf.io.TFRecordWriter(str(path)) as writer:
        for _ in range(5):
            ids = rng.integers(5, 3000, size=LENGTH)
            features = {
                "input_ids": int_feature(ids),
                "input_mask": int_feature([1] * LENGTH),
                "segment_ids": int_feature([0] * 32 + [1] * 32),
                "masked_lm_positions": int_feature([3, 7] + [0] * (SLOTS - 2)),
                "masked_lm_ids": int_feature([ids[3], ids[7]] + [0] * (SLOTS - 2)),
                "masked_lm_weights": tf.train.Feature(
                    float_list=tf.train.FloatList(value=[1.0, 1.0] + [0.0] * (SLOTS - 2))
                ),
                "next_sentence_labels": int_feature([1]),
            }
            example = tf.train.Example(features=tf.train.Features(feature=features))
            writer.write(example.SerializeToString())
            written.append(ids)
    (batch,) = list(records.read_records(str(path), LENGTH, SLOTS, batch_size=5))
    np.testing.assert_array_equal(batch["input_ids"], np.stack(written))
    assert batch["next_sentence_labels"].tolist() == [1] * 5
    assert batch["masked_lm_weights"].dtype == np.float32
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no .tfrecord files"):
        records.list_record_files(tmp_path / "empty")
    with pytest.raises(UserError, match="record file not found"):
        records.list_record_files(tmp_path / "missing.tfrecord")


def _tf_example_bytes(row: dict) -> bytes:
    import tensorflow as tf

    features = {
        name: tf.train.Feature(int64_list=tf.train.Int64List(value=np.atleast_1d(row[name])))
        for name in records.FEATURE_NAMES
        if name != "masked_lm_weights"
    }
    features["masked_lm_weights"] = tf.train.Feature(
        float_list=tf.train.FloatList(value=row["masked_lm_weights"])
    )
    example = tf.train.Example(features=tf.train.Features(feature=features))
    return example.SerializeToString(deterministic=True)


def test_hand_encoded_examples_are_the_bytes_tensorflow_writes():
    rng = np.random.default_rng(0)
    n = 40
    # Negative and multi-byte values exercise every varint length.
    arrays = {
        "input_ids": rng.integers(-3, 300_000, (n, LENGTH)),
        "input_mask": rng.integers(0, 2, (n, LENGTH)),
        "segment_ids": rng.integers(0, 2, (n, LENGTH)),
        "masked_lm_positions": rng.integers(0, LENGTH, (n, SLOTS)),
        "masked_lm_ids": rng.integers(0, 70_000, (n, SLOTS)),
        "masked_lm_weights": rng.random((n, SLOTS)).astype(np.float32),
        "next_sentence_labels": rng.integers(0, 2, (n,)),
    }
    serialized = records.serialize_arrays(arrays)
    for row in range(n):
        assert serialized[row] == _tf_example_bytes({k: v[row] for k, v in arrays.items()})

    # One unpadded instance, padded on the way out.
    ids = rng.integers(0, 30_522, 40).tolist()
    segments = [0] * 22 + [1] * 18
    positions = [3, 5, 30]
    padded = {
        "input_ids": np.pad(ids, (0, LENGTH - 40)),
        "input_mask": np.pad([1] * 40, (0, LENGTH - 40)),
        "segment_ids": np.pad(segments, (0, LENGTH - 40)),
        "masked_lm_positions": np.pad(positions, (0, SLOTS - 3)),
        "masked_lm_ids": np.pad([ids[p] for p in positions], (0, SLOTS - 3)),
        "masked_lm_weights": np.pad([1.0] * 3, (0, SLOTS - 3)).astype(np.float32),
        "next_sentence_labels": 1,
    }
    instance = records.serialize_example(
        ids, segments, positions, [ids[p] for p in positions], True, LENGTH, SLOTS
    )
    assert instance == _tf_example_bytes(padded)
    with pytest.raises(ValueError, match="41 tokens / 0 predictions; limits are 40 / 10"):
        records.serialize_example([1] * 41, [0] * 41, [], [], 0, 40, SLOTS)
