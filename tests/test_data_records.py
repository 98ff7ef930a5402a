"""`data prepare` and TFRecords: round trip, parallel/sharded determinism, resume, errors."""

from __future__ import annotations

import filecmp
import json
import os

import numpy as np
import pytest

from bert_jax import cli
from bert_jax.data import corpus, prepare, records
from tests.data_fixtures import embedded_spm_dir

LENGTH, SLOTS = 64, 10
DOCUMENTS_PER_SHARD = 10


def _expected_parts() -> list[str]:
    """Groups of ten documents; a single leftover document joins the last group."""
    count = len(corpus.embedded_documents("eval"))
    groups = count // DOCUMENTS_PER_SHARD + (count % DOCUMENTS_PER_SHARD >= 2)
    return [prepare.part_name(g) for g in range(groups)]


def _original_feature_spec(tf, max_seq_length, max_predictions_per_seq):
    """The parsing spec of google-research/bert's run_pretraining.py, written out by hand."""
    return {
        "input_ids": tf.io.FixedLenFeature([max_seq_length], tf.int64),
        "input_mask": tf.io.FixedLenFeature([max_seq_length], tf.int64),
        "segment_ids": tf.io.FixedLenFeature([max_seq_length], tf.int64),
        "masked_lm_positions": tf.io.FixedLenFeature([max_predictions_per_seq], tf.int64),
        "masked_lm_ids": tf.io.FixedLenFeature([max_predictions_per_seq], tf.int64),
        "masked_lm_weights": tf.io.FixedLenFeature([max_predictions_per_seq], tf.float32),
        "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
    }


def _prepare_args(output, *extra):
    return [
        "data",
        "prepare",
        "--input",
        "embedded:eval",
        "--tokenizer",
        embedded_spm_dir(),
        "--output",
        str(output),
        "--max-seq-length",
        str(LENGTH),
        "--max-predictions-per-seq",
        str(SLOTS),
        "--masked-lm-prob",
        "0.15",
        "--short-seq-prob",
        "0.1",
        "--dupe-factor",
        "2",
        "--seed",
        "5",
        "--documents-per-shard",
        str(DOCUMENTS_PER_SHARD),
        *extra,
    ]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    output = tmp_path_factory.mktemp("prepared")
    assert cli.main(_prepare_args(output)) == 0
    return output


def test_prepared_records_parse_with_the_original_feature_spec(prepared):
    import tensorflow as tf

    names = sorted(os.listdir(prepared))
    parts = [n for n in names if n.endswith(".tfrecord")]
    assert parts == _expected_parts() and len(parts) >= 2
    assert {"prepare_config.json", "stats-0-of-1.json", "tokenizer"} <= set(names)
    assert not [n for n in names if n.startswith(".")]  # no temporary files left behind
    spec = _original_feature_spec(tf, LENGTH, SLOTS)
    total = 0
    for part in parts:
        with open(prepared / part.replace(".tfrecord", ".json")) as f:
            sidecar = json.load(f)
        dataset = tf.data.TFRecordDataset(str(prepared / part)).map(
            lambda s: tf.io.parse_single_example(s, spec)
        )
        rows = list(dataset.as_numpy_iterator())
        assert len(rows) == sidecar["instances"] > 0
        total += len(rows)
        for row in rows:
            assert row["input_ids"].dtype == np.int64 and row["input_ids"].shape == (LENGTH,)
            assert row["masked_lm_weights"].dtype == np.float32
            assert row["next_sentence_labels"].shape == (1,)
            assert row["next_sentence_labels"][0] in (0, 1)
            length = row["input_mask"].sum()
            assert row["input_ids"][0] == 2 and row["input_ids"][length - 1] == 3
            count = int(row["masked_lm_weights"].sum())
            assert count >= 1 and (row["masked_lm_weights"][:count] == 1).all()
            assert (row["masked_lm_positions"][count:] == 0).all()
            assert (row["masked_lm_positions"][:count] < length).all()
    with open(prepared / "stats-0-of-1.json") as f:
        stats = json.load(f)
    assert stats["instances"]["instances"] == total and stats["corpus"]["documents"] == len(
        corpus.embedded_documents("eval")
    )

    # The batch format (contract 1) from the same files.
    batch = next(records.read_records(str(prepared), LENGTH, SLOTS, batch_size=8))
    assert {k: (v.shape, v.dtype.name) for k, v in batch.items()} == {
        "input_ids": ((8, LENGTH), "int32"),
        "input_mask": ((8, LENGTH), "int32"),
        "segment_ids": ((8, LENGTH), "int32"),
        "masked_lm_positions": ((8, SLOTS), "int32"),
        "masked_lm_ids": ((8, SLOTS), "int32"),
        "masked_lm_weights": ((8, SLOTS), "float32"),
        "next_sentence_labels": ((8,), "int32"),
    }


def test_output_is_the_same_for_any_worker_count_and_machine_split(prepared, tmp_path):
    parallel = tmp_path / "parallel"
    assert cli.main(_prepare_args(parallel, "--num-workers", "2")) == 0
    machines = tmp_path / "machines"
    for index in ("1", "0"):
        assert cli.main(_prepare_args(machines, "--num-shards", "2", "--shard-index", index)) == 0
    assert os.path.exists(machines / "stats-0-of-2.json")
    for part in _expected_parts():
        assert filecmp.cmp(prepared / part, parallel / part, shallow=False)
        assert filecmp.cmp(prepared / part, machines / part, shallow=False)


def test_rerun_resumes_and_changed_settings_are_refused(prepared, tmp_path, capsys):
    output = tmp_path / "resume"
    assert cli.main(_prepare_args(output)) == 0
    os.remove(output / "part-00001.tfrecord")  # as if the job died before this shard finished
    result = prepare.prepare_records(
        ["embedded:eval"],
        embedded_spm_dir(),
        output,
        max_seq_length=LENGTH,
        max_predictions_per_seq=SLOTS,
        dupe_factor=2,
        seed=5,
        documents_per_shard=DOCUMENTS_PER_SHARD,
    )
    assert (result.groups_written, result.groups_skipped) == (1, len(_expected_parts()) - 1)
    assert filecmp.cmp(prepared / "part-00001.tfrecord", output / "part-00001.tfrecord", False)

    capsys.readouterr()
    changed = _prepare_args(output)
    changed[changed.index("--seed") + 1] = "6"
    assert cli.main(changed) == 2
    err = capsys.readouterr().err
    assert "different settings" in err and "seed: 5 -> 6" in err and "--overwrite" in err
    before = (output / "part-00000.tfrecord").read_bytes()
    assert cli.main([*changed, "--overwrite"]) == 0
    assert (output / "part-00000.tfrecord").read_bytes() != before


def test_bad_input_and_settings_are_clear_errors(tmp_path, capsys):
    out = tmp_path / "out"
    cases = [
        (["--input", str(tmp_path / "missing.txt")], "missing.txt"),
        (["--max-predictions-per-seq", "100"], "--max-predictions-per-seq 100 must be in [1"),
        (["--masked-lm-prob", "0"], "--masked-lm-prob 0.0 must be in (0, 1)"),
        (["--num-shards", "2", "--shard-index", "2"], "--shard-index 2 must be in [0"),
        (["--tokenizer", str(tmp_path / "no_tokenizer")], "no_tokenizer"),
    ]
    for override, message in cases:
        args = _prepare_args(out)
        flag = override[0]
        if flag in args:
            args[args.index(flag) + 1] = override[1]
            args += override[2:]
        else:
            args += override
        assert cli.main(args) == 2, override
        assert message in capsys.readouterr().err, override
    assert not os.path.exists(out)  # nothing was created for bad input

    one_document = tmp_path / "one.txt"
    one_document.write_text("A lonely sentence.\nAnother one.\n", encoding="utf-8")
    args = _prepare_args(tmp_path / "out2")
    args[args.index("--input") + 1] = str(one_document)
    assert cli.main(args) == 2
    assert "1 usable document(s); sentence pairs need at least two" in capsys.readouterr().err


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
