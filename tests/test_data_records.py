"""TFRecords in the original format: atomic writes, and records written by the original tool."""

from __future__ import annotations

import os

import numpy as np
import pytest

from bert_jax.data import records

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
    with pytest.raises(FileNotFoundError, match="record file not found"):
        records.list_record_files(tmp_path / "missing.tfrecord")
