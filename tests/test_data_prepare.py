"""`data prepare`: the original TFRecord format, parallel/sharded determinism, resume, errors,
and the cached preparation a pretraining run makes from a raw corpus."""

from __future__ import annotations

import dataclasses
import filecmp
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from bert_jax import cli
from bert_jax.data.pipeline.tf_data import PipelineSettings, make_pretrain_iterator
from bert_jax.data.preparation.cached import prepare_cached
from bert_jax.data.preparation.groups import part_name
from bert_jax.data.preparation.local_runner import prepare_records
from bert_jax.data.preparation.settings import PrepareSettings
from bert_jax.data.preparation.stage import FORMAT_VERSION, _input_bytes, check_run
from bert_jax.data.records import tfrecord as records
from bert_jax.data.sources import embedded as sources
from bert_jax.data.tokenizers.load_or_train import load_tokenizer
from tests.data_fixtures import embedded_spm, embedded_spm_dir

LENGTH, SLOTS = 64, 10
NUM_GROUPS = 3


def _expected_parts() -> list[str]:
    """A shard per group: the 23 documents hash into 3 groups of at least two documents each."""
    return [part_name(g) for g in range(NUM_GROUPS)]


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
        "--num-groups",
        str(NUM_GROUPS),
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
        sources.embedded_documents("eval")
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


def test_output_is_the_same_for_any_worker_count(prepared, tmp_path):
    parallel = tmp_path / "parallel"
    assert cli.main(_prepare_args(parallel, "--num-workers", "2")) == 0
    for part in _expected_parts():
        assert filecmp.cmp(prepared / part, parallel / part, shallow=False)
    held = sorted(n for n in os.listdir(prepared / "heldout") if n.endswith(".tfrecord"))
    assert held
    for part in held:
        assert filecmp.cmp(prepared / "heldout" / part, parallel / "heldout" / part, False)


def test_rerun_resumes_and_changed_settings_are_refused(prepared, tmp_path, capsys):
    output = tmp_path / "resume"
    assert cli.main(_prepare_args(output)) == 0
    os.remove(output / "part-00001.tfrecord")  # as if the job died before this shard finished
    settings = PrepareSettings(
        max_seq_length=LENGTH,
        max_predictions_per_seq=SLOTS,
        dupe_factor=2,
        seed=5,
        num_groups=NUM_GROUPS,
    )
    result = prepare_records(["embedded:eval"], embedded_spm_dir(), output, settings)
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
        (["--heldout-share", "0.9"], "--heldout-share 0.9 must be in [0, 0.5]"),
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


def test_cached_preparation_of_a_corpus_is_reused(tmp_path):
    """What a pretraining run does with a raw corpus: prepare once, then read the records."""
    settings = PrepareSettings(
        max_seq_length=LENGTH, max_predictions_per_seq=SLOTS, dupe_factor=1, seed=1
    )
    spm = load_tokenizer(embedded_spm_dir())
    files = prepare_cached("embedded:eval", spm, settings, tmp_path)
    reader = PipelineSettings(
        batch_size=8,
        max_seq_length=LENGTH,
        max_predictions_per_seq=SLOTS,
        seed=1,
        dynamic_masking=True,
    )
    iterator = make_pretrain_iterator(files, reader, embedded_spm_dir())
    batch = next(iterator)
    assert batch["input_ids"].shape == (8, LENGTH) and batch["masked_lm_ids"].shape == (8, SLOTS)
    (prepared,) = list(tmp_path.iterdir())
    written = sorted(p.name for p in prepared.glob("*.tfrecord"))
    again = prepare_cached("embedded:eval", embedded_spm(), settings, tmp_path)
    assert again == files
    assert sorted(p.name for p in prepared.glob("*.tfrecord")) == written  # reused, not redone
    for key, value in next(make_pretrain_iterator(again, reader, embedded_spm())).items():
        np.testing.assert_array_equal(value, batch[key])


@pytest.mark.parametrize(
    ("whole_word_mask", "digest"), [(False, "2cafea948f715856"), (True, "534598cee5e678fc")]
)
def test_records_keep_their_bytes_for_a_seed(tmp_path, whole_word_mask, digest):
    """The exact bytes written before masking and serialization were rewritten for speed.

    A change here means a fixed seed no longer reproduces earlier data (the WordPiece vocab is
    the shipped one, so only our code or NumPy's Generator streams can move it).
    """
    import hashlib

    from tests.data_fixtures import minilm_vocab_path

    settings = PrepareSettings(
        max_seq_length=64,
        max_predictions_per_seq=10,
        dupe_factor=2,
        seed=3,
        whole_word_mask=whole_word_mask,
        num_groups=1,  # one group, its documents in input order: the bytes of format v1 too
        heldout_share=0.0,  # every document in the training records, as before held-out ones
    )
    result = prepare_records(["embedded:eval"], minilm_vocab_path(), tmp_path, settings)
    assert result.instance_stats.instances == 636
    (path,) = result.files
    with open(path, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest()[:16] == digest


def test_a_manifest_from_before_the_splitter_was_recorded_reads_as_the_regex():
    """prepare_config.json of an earlier version has no `splitter` / `text_field`: it was split by
    the regex from JSONL's `text`, so a resume with syntok names that change, not `None`."""
    from bert_jax.data.records import manifest

    old = manifest.Manifest.from_json({"max_seq_length": 128, "seed": 1})
    assert old.settings["splitter"] == "regex" and old.settings["text_field"] == "text"
    new = manifest.Manifest.from_json(
        {"max_seq_length": 128, "seed": 1, "splitter": "syntok 1.4.4", "text_field": "text"}
    )
    assert old.setting_changes(new) == ["splitter: 'regex' -> 'syntok 1.4.4'"]


def test_the_summary_names_the_format_where_there_is_no_next_sentence():
    """Records without NSP have no random next to count: the summary line names their format
    and objective instead of "random next 0.0%"."""
    from bert_jax.data.preparation.groups import InstanceStats
    from bert_jax.data.preparation.result import PrepareResult
    from bert_jax.data.sources.corpus_stats import CorpusStats

    stats = InstanceStats(documents=3, instances=10, random_next=5, forced_random_next=1)

    def line(settings: dict) -> str:
        return PrepareResult("out", [], 1, 0, CorpusStats(), stats, 1.0, settings).summary()

    assert "(random next 50.0%, forced 10.0%)" in line({"instance_format": "sentence_pairs"})
    assert "(random next 50.0%, forced 10.0%)" in line({})  # records of earlier versions
    no_nsp = line({"instance_format": "full_sentences", "objective": "mlm"})
    assert "(full_sentences, mlm)" in no_nsp and "random next" not in no_nsp


def test_records_of_the_earlier_grouping_are_refused_on_resume(tmp_path, capsys):
    """Format v1 grouped consecutive documents; v2 hashes them into groups: a resumed directory
    would mix both (documents twice or not at all), so it is refused in one line."""
    output = tmp_path / "old"
    assert cli.main(_prepare_args(output)) == 0
    config = json.loads((output / "prepare_config.json").read_text())
    assert config["format_version"] == FORMAT_VERSION == 2
    assert config["num_groups"] == NUM_GROUPS
    config.update(format_version=1, documents_per_shard=10)  # as the earlier version wrote it
    del config["num_groups"]
    (output / "prepare_config.json").write_text(json.dumps(config))
    os.remove(output / "part-00001.tfrecord")
    capsys.readouterr()
    assert cli.main(_prepare_args(output)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "records of format v1" in err[0] and "--overwrite" in err[0]
    assert not (output / "part-00001.tfrecord").exists()  # nothing written


def test_progress_from_the_start_and_a_summary_whose_rates_add_up(tmp_path, capsys):
    """The command's lines, in the format of the other long commands ("data prepare: ..."): the
    cutting, the splits and groups, the reading, then splits and groups done with rate and ETA;
    the summary's instances per second are its instances over its wall seconds."""
    import logging
    import re

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    root.handlers = []  # the command's own logging setup, as a fresh process has it
    try:
        assert cli.main(_prepare_args(tmp_path / "out", "--num-workers", "2")) == 0
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers, root.level = handlers, level
    lines = capsys.readouterr().out.strip().splitlines()
    progress, summary = lines[:-1], lines[-1]
    assert all(line.startswith("data prepare: ") for line in progress), lines
    assert "cutting 1 input(s) into splits" in progress[0]
    assert (
        "1 split(s) of 1 input(s) into 3 training group(s) and 1 held-out group(s)" in progress[1]
    )
    assert "reading 1 split(s) with 2 worker(s), holding out 1.0% of the documents" in progress[2]
    assert re.search(r"splits read 1/1 \([0-9.]+/s, ETA 0m00s\)", progress[3])
    assert "writing 4 group(s), a shard each: 3 training, 1 held-out" in progress[5]
    assert re.search(r"groups written 4/4 \([0-9.]+/s, ETA 0m00s\)", progress[-1])
    found = re.search(r": (\d+) instances from .* (\d+) instances/s over ([0-9.]+)s wall", summary)
    instances, rate, wall = int(found[1]), int(found[2]), float(found[3])
    # The wall seconds are printed to 0.1 s: the rate lies between what those bounds give.
    assert instances / (wall + 0.05) - 1 <= rate <= instances / max(wall - 0.05, 1e-3) + 1
    cpu = re.search(r"took ([0-9.e-]+) worker CPU-s, (\d+) instances per CPU-second", summary)
    assert abs(int(cpu[2]) - instances / float(cpu[1])) <= 0.01 * int(cpu[2]) + 1


def test_the_dry_run_prints_the_splits_and_groups_and_writes_nothing(tmp_path, capsys):
    output = tmp_path / "never"
    capsys.readouterr()
    assert cli.main([*_prepare_args(output), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"into {NUM_GROUPS} training group(s) and 1 held-out" in out
    assert "embedded embedded:eval" in out
    # The settings the records would be made with, by their flags.
    assert "records made with --max-seq-length 64, " in out and "--random-next-prob 0.5" in out
    assert not output.exists()


def test_beam_options_need_the_beam_runner_and_beam_itself(tmp_path, capsys):
    import importlib.util

    output = tmp_path / "never"
    capsys.readouterr()
    assert cli.main([*_prepare_args(output), "--", "--direct_num_workers=2"]) == 2
    assert "need --runner beam" in capsys.readouterr().err
    if importlib.util.find_spec("apache_beam") is None:  # the main environment: no Beam
        assert cli.main([*_prepare_args(output), "--runner", "beam"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "pip install" in err[0] and "[beam]" in err[0]
    assert not output.exists()


def test_every_input_byte_is_read_once(tmp_path, monkeypatch):
    """The local path reads each split once: over a text file, a JSONL file and a multistream
    Wikipedia dump cut into several splits, the bytes read are the files' sizes."""
    from bert_jax.data.preparation import groups
    from bert_jax.data.sources import splits
    from tests.corpus_fixtures import realistic_dump_xml, write_stream_per_page_bz2

    documents = sources.embedded_documents("eval")
    text = tmp_path / "corpus.txt"
    text.write_text("\n\n".join("\n".join(d) for d in documents[:12]) + "\n", encoding="utf-8")
    jsonl = tmp_path / "corpus.jsonl"
    jsonl.write_text("".join(json.dumps({"text": " ".join(d)}) + "\n" for d in documents[12:]))
    dump = tmp_path / "enwiki-pages-articles-multistream.xml.bz2"
    write_stream_per_page_bz2(dump, realistic_dump_xml())
    count = splits.ByteCount()
    read_split = splits.read_split

    def counted(split, stats, **options):
        return read_split(split, stats, byte_count=count, **options)

    monkeypatch.setattr(groups.splits_lib, "read_split", counted)
    settings = PrepareSettings(
        max_seq_length=LENGTH,
        max_predictions_per_seq=SLOTS,
        dupe_factor=1,
        num_groups=2,
        split_bytes=1500,
    )
    inputs = [str(text), str(jsonl), str(dump)]
    plan = check_run(inputs, embedded_spm_dir(), tmp_path / "plan", settings)
    assert len(plan.splits) > 2 * len(inputs)  # each input in several splits
    result = prepare_records(inputs, embedded_spm_dir(), tmp_path / "out", settings)
    assert result.instance_stats.instances > 0
    assert count.content == sum(os.path.getsize(path) for path in inputs)


def test_a_local_prepare_reads_each_input_byte_once_in_all(tmp_path, monkeypatch):
    """Every read of an input file, through any opener (its identity for the manifest, the
    splits, the check that it is text), counted: text, JSONL and gzipped text inputs (a split
    each) are read exactly once over the whole run, a second run (a resume) once more."""
    import builtins
    import gzip

    documents = sources.embedded_documents("eval")
    text = tmp_path / "corpus.txt"
    text.write_text("\n\n".join("\n".join(d) for d in documents[:12]) + "\n", encoding="utf-8")
    jsonl = tmp_path / "corpus.jsonl"
    jsonl.write_text("".join(json.dumps({"text": " ".join(d)}) + "\n" for d in documents[12:]))
    packed = tmp_path / "more.txt.gz"
    packed.write_bytes(gzip.compress(text.read_bytes()[:20000]))
    inputs = [str(text), str(jsonl), str(packed)]
    read = dict.fromkeys(inputs, 0)
    real_open = builtins.open

    class Counted:
        def __init__(self, f, path):
            self._f, self._path = f, path

        def _count(self, n):
            read[self._path] += n or 0
            return n

        def read(self, *args):
            data = self._f.read(*args)
            self._count(len(data))
            return data

        def read1(self, *args):
            data = self._f.read1(*args)
            self._count(len(data))
            return data

        def readline(self, *args):
            data = self._f.readline(*args)
            self._count(len(data))
            return data

        def readinto(self, buffer):
            return self._count(self._f.readinto(buffer))

        def readinto1(self, buffer):
            return self._count(self._f.readinto1(buffer))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self._f.close()

        def __iter__(self):
            return iter(self.readline, b"")

        def __getattr__(self, name):
            return getattr(self._f, name)

    def counting_open(file, *args, **kwargs):
        f = real_open(file, *args, **kwargs)
        path = os.fspath(file) if isinstance(file, (str, os.PathLike)) else None
        return Counted(f, path) if path in read else f

    monkeypatch.setattr(builtins, "open", counting_open)
    settings = PrepareSettings(max_seq_length=LENGTH, max_predictions_per_seq=SLOTS, dupe_factor=1)
    result = prepare_records(inputs, embedded_spm_dir(), tmp_path / "out", settings)
    assert result.instance_stats.instances > 0
    assert read == {path: os.path.getsize(path) for path in inputs}
    prepare_records(inputs, embedded_spm_dir(), tmp_path / "out", settings)
    assert read == {path: 2 * os.path.getsize(path) for path in inputs}


def test_a_killed_runs_spilled_documents_are_removed_and_do_not_block_overwrite(tmp_path):
    """A run spills documents by group into a hidden folder named by its host and process; a
    later run on the host removes what a killed one left, and --overwrite is not stopped by it."""
    output = tmp_path / "out"
    settings = PrepareSettings(
        max_seq_length=LENGTH, max_predictions_per_seq=SLOTS, dupe_factor=1, num_groups=2
    )
    prepare_records(["embedded:eval"], embedded_spm_dir(), output, settings)
    dead = subprocess.Popen([sys.executable, "-c", ""])  # a process id no longer in use
    dead.wait()
    # What runs killed while reading leave: one of this host, one of another host (whose
    # process this host cannot see: kept, in case it still runs).
    spilled = [f".spill-0-of-1-{socket.gethostname()}-{dead.pid}", ".spill-0-of-1-other-1"]
    for name in spilled:
        (output / name).mkdir()
        (output / name / "split-000000.pkl").write_bytes(b"partial")
    # And half-written shards: this host's dead writer's (removed), another machine's (kept:
    # machines of --num-shards may write into one directory at once).
    temporaries = [
        f".part-00000.tfrecord.tmp-{socket.gethostname()}-{dead.pid}-0123abcd",
        ".part-00001.tfrecord.tmp-other-1-0123abcd",
    ]
    for name in temporaries:
        (output / name).write_bytes(b"half a shard")
    again = dataclasses.replace(settings, overwrite=True, seed=9)
    prepare_records(["embedded:eval"], embedded_spm_dir(), output, again)
    left = sorted(name for name in os.listdir(output) if name.startswith("."))
    assert left == sorted([spilled[1], temporaries[1]])


def test_a_tfds_source_is_cut_into_groups_by_its_recorded_size(monkeypatch):
    """A TFDS split's size is unknown to the splits (0 bytes) but recorded in its dataset info
    (``SplitInfo.num_bytes``): --group-bytes counts it, so a large TFDS corpus is not one group;
    one that cannot be looked up counts 0 (reading it then says what is wrong)."""
    import types

    import tensorflow_datasets as tfds

    from bert_jax.data.sources import splits

    def builder(name, data_dir=None):
        if name != "wiki/en":
            raise ValueError(f"no dataset {name}")
        sizes = {"train": 20 << 20}
        info = types.SimpleNamespace(
            splits={k: types.SimpleNamespace(num_bytes=v) for k, v in sizes.items()}
        )
        return types.SimpleNamespace(info=info)

    monkeypatch.setattr(tfds, "builder", builder)
    wiki = splits.Split(0, "tfds:wiki/en:train", "tfds", 0, -1)
    assert _input_bytes(wiki, None) == 20 << 20
    assert _input_bytes(splits.Split(0, "tfds:other:train", "tfds", 0, -1), None) == 0
    embedded = splits.Split(0, "embedded:eval", "embedded", 0, -1)
    assert _input_bytes(embedded, None) == 0


def test_records_that_recorded_their_inputs_sha256_resume_as_before(tmp_path, capsys):
    """Earlier versions named an input by its SHA-256: such a directory resumes when the file is
    the same (hashed once, to compare) and refuses it when it changed."""
    import hashlib

    corpus = tmp_path / "corpus.txt"
    documents = sources.embedded_documents("eval")
    corpus.write_text("\n\n".join("\n".join(d) for d in documents) + "\n", encoding="utf-8")
    args = _prepare_args(tmp_path / "out")
    args[args.index("--input") + 1] = str(corpus)
    assert cli.main(args) == 0
    config_path = tmp_path / "out" / "prepare_config.json"
    config = json.loads(config_path.read_text())
    digest = hashlib.sha256(corpus.read_bytes()).hexdigest()
    config["inputs"] = [{"path": str(corpus), "size": corpus.stat().st_size, "sha256": digest}]
    config_path.write_text(json.dumps(config))
    os.remove(tmp_path / "out" / "part-00001.tfrecord")
    assert cli.main(args) == 0  # resumed: the same content
    assert "wrote 1 shard(s), skipped 2" in capsys.readouterr().out
    config_path.write_text(json.dumps(config))
    corpus.write_text(corpus.read_text() + "\nOne more document.\nWith two lines.\n")
    assert cli.main(args) == 2
    assert "changed since" in capsys.readouterr().err
