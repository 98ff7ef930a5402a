"""Faults and bad input around outputs and inputs: `--overwrite` replaces only what bert-jax wrote
(atomically), damaged TFRecords are named (or skipped and counted), binary or non-UTF-8 input is
refused before anything is written, and `data prepare` knows its inputs and its unfinished runs."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from bert_jax.convert import model_dir
from bert_jax.data.pipeline.tf_data import PipelineSettings, make_pretrain_iterator, synthetic_batch
from bert_jax.data.records import manifest
from bert_jax.data.records import tfrecord as records
from bert_jax.data.records.integrity import CorruptRecordError
from bert_jax.runtime import outputs as files
from bert_jax.runtime.errors import UserError
from tests.convert_fixtures import random_params, write_vocab
from tests.faults import assert_user_error, run_cli, tree_digest
from tests.helpers import REAL_SENTENCES, tiny_config

PNG_BYTES = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)) * 4
LENGTH, SLOTS = 32, 5


# --- shared fixtures ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    """One tiny bert-jax model directory, the source of every conversion here."""
    path = tmp_path_factory.mktemp("source") / "model"
    config = tiny_config(vocab_size=128, num_hidden_layers=1)
    model_dir.save_model_dir(path, config, random_params(config))
    return str(path)


@pytest.fixture(scope="module")
def vocab(tmp_path_factory) -> str:
    return write_vocab(str(tmp_path_factory.mktemp("vocab") / "vocab.txt"))


def _corpus(path, variant: str = "") -> str:
    """A few documents of real sentences (a blank line between documents)."""
    documents = [REAL_SENTENCES[i::4] for i in range(4)]
    text = "\n\n".join("\n".join(d) for d in documents) + "\n" + variant
    path.write_text(text, encoding="utf-8")
    return str(path)


def _prepare(corpus: str, vocab: str, output, *extra: str) -> list[str]:
    return [
        "data", "prepare", "--input", corpus, "--tokenizer", vocab, "--output", str(output),
        "--max-seq-length", str(LENGTH), "--max-predictions-per-seq", str(SLOTS),
        "--dupe-factor", "1", "--num-groups", "2", "--seed", "5", *extra,
    ]  # fmt: skip


def _convert(model: str, dst, *extra: str, to: str = "bert-jax") -> list[str]:
    return ["convert", "--from", "bert-jax", model, "--to", to, str(dst), *extra]


def _siblings_left(path) -> list[str]:
    parent, name = os.path.split(os.path.abspath(path))
    return [n for n in os.listdir(parent) if n.startswith(f".{name}.")]


# --- 1. --overwrite replaces only what bert-jax wrote ------------------------------------------


def test_convert_overwrite_refuses_the_current_directory(model, tmp_path, monkeypatch, capsys):
    here = tmp_path / "project"
    here.mkdir()
    (here / "train.py").write_text("print('my code')\n")
    monkeypatch.chdir(here)
    before = tree_digest(here)
    outcome = run_cli(capsys, _convert(model, ".", "--overwrite"))
    assert_user_error(outcome, str(here), "current directory")
    assert tree_digest(here) == before


def test_convert_overwrite_refuses_the_home_directory(model, tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("export PATH\n")
    monkeypatch.setenv("HOME", str(home))
    before = tree_digest(home)
    outcome = run_cli(capsys, _convert(model, home, "--overwrite"))
    assert_user_error(outcome, str(home), "home directory")
    assert tree_digest(home) == before


def test_convert_overwrite_refuses_a_directory_of_other_files(model, tmp_path, capsys):
    target = tmp_path / "notes"
    target.mkdir()
    (target / "thesis.tex").write_text("\\begin{document}\n")
    before = tree_digest(tmp_path)
    outcome = run_cli(capsys, _convert(model, target, "--overwrite"))
    assert_user_error(outcome, str(target), "no config.json with a bert_jax block")
    assert tree_digest(tmp_path) == before


def test_convert_overwrite_refuses_a_pretraining_workdir(model, tmp_path, capsys):
    workdir = tmp_path / "run"
    (workdir / "checkpoints" / "100").mkdir(parents=True)
    (workdir / "checkpoints" / "100" / "state").write_bytes(b"weights")
    (workdir / "config.json").write_text(json.dumps({"model": {"size": "tiny"}}))
    (workdir / "metrics.jsonl").write_text("{}\n")
    before = tree_digest(tmp_path)
    outcome = run_cli(capsys, _convert(model, workdir, "--overwrite"))
    assert_user_error(outcome, str(workdir), "pretraining workdir")
    assert tree_digest(tmp_path) == before


def test_convert_overwrite_refuses_a_model_directory_holding_a_stray_file(model, tmp_path, capsys):
    target = tmp_path / "out"
    assert run_cli(capsys, _convert(model, target)).code == 0
    (target / "my_notes.txt").write_text("keep me\n")
    before = tree_digest(tmp_path)
    outcome = run_cli(capsys, _convert(model, target, "--overwrite"))
    assert_user_error(outcome, str(target), "my_notes.txt")
    assert tree_digest(tmp_path) == before


def test_convert_overwrite_replaces_a_model_directory_atomically(model, tmp_path, capsys):
    target = tmp_path / "out"
    assert run_cli(capsys, _convert(model, target)).code == 0
    first = tree_digest(target)
    outcome = run_cli(capsys, _convert(model, target, "--overwrite", "--drop-heads"))
    assert outcome.code == 0, outcome.err
    assert tree_digest(target) != first
    assert not model_dir.load_model_dir(target, load_params=False).has_heads
    assert _siblings_left(target) == []


def test_a_failed_hf_export_leaves_the_previous_one_whole(model, tmp_path, capsys, monkeypatch):
    target = tmp_path / "hf"
    assert run_cli(capsys, _convert(model, target, to="hf")).code == 0
    assert "bert_jax_export.json" in os.listdir(target)
    before = tree_digest(tmp_path)
    from bert_jax.convert import hf

    def half_written(path, *args):
        with open(os.path.join(path, "config.json"), "w") as f:
            f.write("{")
        raise PermissionError(13, "Permission denied", os.path.join(path, "model.safetensors"))

    monkeypatch.setattr(hf, "write_hf_dir", half_written)
    outcome = run_cli(capsys, _convert(model, target, "--overwrite", to="hf"))
    assert_user_error(outcome, "model.safetensors")
    assert tree_digest(tmp_path) == before  # the old export, and no temporary sibling


def test_hf_overwrite_refuses_a_hugging_face_directory_it_did_not_write(model, tmp_path, capsys):
    downloaded = tmp_path / "bert-base-uncased"
    downloaded.mkdir()
    (downloaded / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (downloaded / "model.safetensors").write_bytes(b"weights from the hub")
    before = tree_digest(tmp_path)
    outcome = run_cli(capsys, _convert(model, downloaded, "--overwrite", to="hf"))
    assert_user_error(outcome, str(downloaded), "bert_jax_export.json")
    assert tree_digest(tmp_path) == before


def test_replace_rule_refuses_the_root_and_a_plain_file(tmp_path):
    kind = model_dir.MODEL_DIR_KIND
    with pytest.raises(files.OutputInTheWayError, match="root directory"):
        files.check_replaceable("/", kind)
    plain = tmp_path / "weights.bin"
    plain.write_bytes(b"1")
    with pytest.raises(files.OutputInTheWayError, match="not a directory"):
        files.check_replaceable(plain, kind)
    files.check_replaceable(tmp_path / "new", kind)  # missing: nothing to replace
    (tmp_path / "empty").mkdir()
    files.check_replaceable(tmp_path / "empty", kind)  # empty: nothing to lose


def test_prepare_overwrite_refuses_a_foreign_directory(vocab, tmp_path, capsys):
    corpus = _corpus(tmp_path / "corpus.txt")
    target = tmp_path / "data"
    target.mkdir()
    (target / "important.csv").write_text("a,b\n")
    before = tree_digest(tmp_path)
    outcome = run_cli(capsys, _prepare(corpus, vocab, target, "--overwrite"))
    assert_user_error(outcome, str(target), "prepare_config.json")
    assert tree_digest(tmp_path) == before


def test_prepare_refuses_to_write_into_a_foreign_directory(vocab, tmp_path, capsys):
    corpus = _corpus(tmp_path / "corpus.txt")
    before = tree_digest(tmp_path)
    outcome = run_cli(capsys, _prepare(corpus, vocab, tmp_path))  # the corpus's own folder
    assert_user_error(outcome, str(tmp_path), "prepare_config.json")
    assert tree_digest(tmp_path) == before


# --- 3. damaged records named, or skipped and counted; input that is not text -----------------


def _write_records(directory, files_count: int = 3, rows: int = 8) -> list[str]:
    os.makedirs(directory, exist_ok=True)
    paths = []
    for i in range(files_count):
        batch = synthetic_batch(rows, LENGTH, SLOTS, vocab_size=100, seed=i)
        path = os.path.join(directory, f"part-{i:05d}.tfrecord")
        records.write_records(path, records.serialize_arrays(batch))
        paths.append(path)
    return paths


def _record_offset(path: str, index: int) -> int:
    """Byte offset of record `index` (each: 8 length, 4 CRC, data, 4 CRC)."""
    data, offset = open(path, "rb").read(), 0
    for _ in range(index):
        offset += 16 + int.from_bytes(data[offset : offset + 8], "little")
    return offset


def _iterate(directory, skip: bool = False, epochs: int = 1):
    settings = PipelineSettings(
        batch_size=4, max_seq_length=LENGTH, max_predictions_per_seq=SLOTS, seed=1,
        num_epochs=epochs, skip_corrupt_records=skip,
    )  # fmt: skip
    iterator = make_pretrain_iterator(str(directory), settings)
    return iterator, [batch["input_ids"] for batch in iterator]


def test_a_truncated_record_file_is_named_with_the_record(tmp_path):
    paths = _write_records(tmp_path / "records")
    data = open(paths[1], "rb").read()
    cut = _record_offset(paths[1], 5) + 20
    with open(paths[1], "wb") as f:
        f.write(data[:cut])
    before = tree_digest(tmp_path)
    with pytest.raises(CorruptRecordError, match="record 5 is damaged") as caught:
        _iterate(tmp_path / "records")
    assert isinstance(caught.value, UserError) and paths[1] in str(caught.value)
    assert "\n" not in str(caught.value) and "skip_corrupt_records" in str(caught.value)
    assert tree_digest(tmp_path) == before


def test_a_flipped_byte_is_named_with_the_file_and_record(tmp_path):
    paths = _write_records(tmp_path / "records")
    data = bytearray(open(paths[2], "rb").read())
    data[_record_offset(paths[2], 3) + 40] ^= 0xFF
    open(paths[2], "wb").write(bytes(data))
    with pytest.raises(CorruptRecordError, match="record 3 is damaged") as caught:
        _iterate(tmp_path / "records")
    assert paths[2] in str(caught.value)


def test_a_damaged_first_record_is_named_before_reading(tmp_path):
    paths = _write_records(tmp_path / "records")
    data = bytearray(open(paths[0], "rb").read())
    data[30] ^= 0xFF
    open(paths[0], "wb").write(bytes(data))
    settings = PipelineSettings(batch_size=4, max_seq_length=LENGTH, max_predictions_per_seq=SLOTS)
    with pytest.raises(CorruptRecordError, match="record 0 is damaged") as caught:
        make_pretrain_iterator(str(tmp_path / "records"), settings)
    assert paths[0] in str(caught.value)


def test_skip_corrupt_records_is_opt_in_and_counted(tmp_path):
    paths = _write_records(tmp_path / "records")
    data = bytearray(open(paths[1], "rb").read())
    data[_record_offset(paths[1], 4) + 40] ^= 0xFF
    open(paths[1], "wb").write(bytes(data))
    iterator, batches = _iterate(tmp_path / "records", skip=True, epochs=2)
    assert iterator.corrupt_records == 1
    assert iterator.corrupt_files == {paths[1]: 4}
    # 8 + 4 + 8 intact records: 5 batches of 4 per epoch, every row distinct.
    assert len(batches) == 10
    rows = {row.tobytes() for batch in batches[:5] for row in batch}
    assert len(rows) == 20
    # Resuming mid-epoch reproduces the same batches.
    resumed, _ = _iterate(tmp_path / "records", skip=True, epochs=2)
    resumed.set_state({**iterator.get_state(), "epoch": 1, "batches_in_epoch": 2})
    rest = [batch["input_ids"] for batch in resumed]
    assert len(rest) == 3
    for a, b in zip(rest, batches[7:]):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("command", ["data prepare", "tokenizer train"])
@pytest.mark.parametrize("bad", ["png", "latin1"])
def test_binary_or_latin1_input_is_refused_before_writing(bad, command, vocab, tmp_path, capsys):
    good = _corpus(tmp_path / "good.txt")
    path = tmp_path / ("photo.png" if bad == "png" else "old.txt")
    if bad == "png":
        path.write_bytes(PNG_BYTES)
    else:
        path.write_bytes("Caf\u00e9 au lait.\nNa\u00efve text.\n".encode("latin-1"))
    out = tmp_path / "out"
    before = tree_digest(tmp_path)
    if command == "data prepare":
        argv = _prepare(good, vocab, out)
        argv[argv.index("--input") + 1 : argv.index("--input") + 2] = [good, str(path)]
    else:
        argv = ["tokenizer", "train", "--input", good, str(path), "--vocab-size", "50"]
        argv += ["--output", str(out)]
    outcome = run_cli(capsys, argv)
    assert_user_error(outcome, str(path), "binary" if bad == "png" else "line 1")
    assert tree_digest(tmp_path) == before and not out.exists()


# --- 5. data prepare knows its inputs, and its unfinished runs ---------------------------------


def test_changed_input_is_refused_without_overwrite_and_rebuilt_with_it(vocab, tmp_path, capsys):
    corpus = _corpus(tmp_path / "corpus.txt")
    out = tmp_path / "data"
    assert run_cli(capsys, _prepare(corpus, vocab, out)).code == 0
    recorded = manifest.read_prepare_config(out)["inputs"]
    assert recorded[0]["path"] == corpus and recorded[0]["size"] == os.path.getsize(corpus)
    assert recorded[0]["mtime_ns"] == os.stat(corpus).st_mtime_ns  # metadata: no read of its own
    _corpus(tmp_path / "corpus.txt", variant="\nA new last document.\nIt has two lines.\n")
    before = tree_digest(out)
    outcome = run_cli(capsys, _prepare(corpus, vocab, out))
    assert_user_error(outcome, corpus, "changed", "--overwrite", only_line=False)
    assert tree_digest(out) == before
    assert run_cli(capsys, _prepare(corpus, vocab, out, "--overwrite")).code == 0
    assert manifest.read_prepare_config(out)["inputs"][0] != recorded[0]
    assert tree_digest(out) != before


def test_unchanged_input_resumes(vocab, tmp_path, capsys):
    corpus = _corpus(tmp_path / "corpus.txt")
    out = tmp_path / "data"
    assert run_cli(capsys, _prepare(corpus, vocab, out)).code == 0
    complete = tree_digest(out)
    os.remove(out / "part-00001.tfrecord")  # as if the run had died before this shard
    outcome = run_cli(capsys, _prepare(corpus, vocab, out))
    assert outcome.code == 0, outcome.err
    with open(out / "stats-0-of-1.json") as f:
        stats = json.load(f)
    assert (stats["groups_written"], stats["groups_skipped"]) == (1, 1)
    assert tree_digest(out).keys() == complete.keys()
    for name, digest in complete.items():
        if name.endswith(".tfrecord"):
            assert tree_digest(out)[name] == digest, name


def test_a_failed_prepare_leaves_nothing_a_reader_trusts(vocab, tmp_path, capsys, monkeypatch):
    from bert_jax.data.preparation import groups

    corpus = _corpus(tmp_path / "corpus.txt")
    out = tmp_path / "data"
    real_write, calls = groups.write_group, []

    def dies_after_one(*args):
        calls.append(args[1])
        if len(calls) > 1:
            raise KeyboardInterrupt  # killed mid-run
        real_write(*args)

    monkeypatch.setattr(groups, "write_group", dies_after_one)
    with pytest.raises(KeyboardInterrupt):
        run_cli(capsys, _prepare(corpus, vocab, out))
    assert os.path.exists(out / "part-00000.tfrecord")  # finished shards are kept for resume
    settings = PipelineSettings(batch_size=2, max_seq_length=LENGTH, max_predictions_per_seq=SLOTS)
    with pytest.raises(manifest.IncompleteRecordsError, match="did not finish") as caught:
        make_pretrain_iterator(str(out), settings)
    assert str(out) in str(caught.value)
    monkeypatch.setattr(groups, "write_group", real_write)
    assert run_cli(capsys, _prepare(corpus, vocab, out)).code == 0
    next(make_pretrain_iterator(str(out), settings))


def test_a_cached_preparation_is_not_reused_after_its_corpus_changed(vocab, tmp_path):
    from bert_jax.data.preparation.cached import prepare_cached
    from bert_jax.data.preparation.settings import PrepareSettings

    corpus = _corpus(tmp_path / "corpus.txt")
    settings = PrepareSettings(
        max_seq_length=LENGTH, max_predictions_per_seq=SLOTS, dupe_factor=1, num_groups=2
    )
    first = prepare_cached(corpus, vocab, settings, tmp_path / "cache")
    assert prepare_cached(corpus, vocab, settings, tmp_path / "cache") == first
    _corpus(tmp_path / "corpus.txt", variant="\nA new last document.\nIt has two lines.\n")
    second = prepare_cached(corpus, vocab, settings, tmp_path / "cache")
    assert os.path.dirname(second[0]) != os.path.dirname(first[0])
    assert len(os.listdir(tmp_path / "cache")) == 2  # the earlier preparation is left as it was


@pytest.mark.parametrize("command", ["finetune", "glue"])
def test_finetune_refuses_a_workdir_of_other_files(command, model, tmp_path, capsys):
    from tests.glue_fixtures.tiny import GLUE_DIR

    workdir = tmp_path / "code"
    workdir.mkdir()
    (workdir / "result.csv").write_text("mine\n")
    before = tree_digest(tmp_path)
    task = ["--task", "glue/RTE"] if command == "finetune" else ["--tasks", "RTE"]
    argv = [command, "--model", model, "--data", GLUE_DIR, "--workdir", str(workdir), *task]
    outcome = run_cli(capsys, argv)
    assert_user_error(outcome, str(workdir), "bert_jax_finetune.json", only_line=False)
    assert tree_digest(tmp_path) == before


def test_prepare_overwrite_with_a_shorter_corpus_leaves_no_stale_shard(vocab, tmp_path, capsys):
    corpus = _corpus(tmp_path / "corpus.txt")
    out = tmp_path / "data"
    assert run_cli(capsys, _prepare(corpus, vocab, out)).code == 0
    assert os.path.exists(out / "part-00001.tfrecord")
    documents = [REAL_SENTENCES[0:3], REAL_SENTENCES[3:6]]
    (tmp_path / "corpus.txt").write_text("\n\n".join("\n".join(d) for d in documents) + "\n")
    # Two documents, one group (hashed into two groups, each might hold one: no pairs at all).
    overwrite = _prepare(corpus, vocab, out, "--overwrite", "--num-groups", "1")
    assert run_cli(capsys, overwrite).code == 0
    names = sorted(n for n in os.listdir(out) if n.startswith("part-"))
    assert names == ["part-00000.json", "part-00000.tfrecord"]
    settings = PipelineSettings(batch_size=1, max_seq_length=LENGTH, max_predictions_per_seq=SLOTS)
    next(make_pretrain_iterator(str(out), settings))


def test_compressed_input_is_checked_decompressed_and_hashed_as_stored(tmp_path):
    import gzip
    import hashlib

    good, bad = tmp_path / "good.txt.gz", tmp_path / "bad.txt.gz"
    good.write_bytes(gzip.compress("Stra\u00dfe und Caf\u00e9.\n".encode("utf-8")))
    bad.write_bytes(gzip.compress("Line one.\nStra\u00dfe.\n".encode("latin-1")))
    (identity,) = manifest.input_identity([str(good)])  # from metadata: nothing read
    assert identity == {
        "path": str(good),
        "size": good.stat().st_size,
        "mtime_ns": good.stat().st_mtime_ns,
    }
    assert manifest._content_identity(str(good))["sha256"] == (
        hashlib.sha256(good.read_bytes()).hexdigest()
    )
    with pytest.raises(manifest.InputError, match="line 2") as caught:
        manifest.check_text_inputs([str(good), str(bad)])
    assert str(bad) in str(caught.value)
    (tmp_path / "cut.txt.gz").write_bytes(good.read_bytes()[:-6])
    with pytest.raises(manifest.InputError, match="cannot be read"):
        manifest.check_text_inputs([str(tmp_path / "cut.txt.gz")])


def test_a_killed_overwrite_sets_the_old_shards_aside_until_a_rerun_completes(
    vocab, tmp_path, capsys, monkeypatch
):
    from bert_jax.data.preparation import groups

    corpus = _corpus(tmp_path / "corpus.txt")
    out = tmp_path / "data"
    assert run_cli(capsys, _prepare(corpus, vocab, out)).code == 0
    old = tree_digest(out)
    _corpus(tmp_path / "corpus.txt", variant="\nA new last document.\nIt has two lines.\n")
    real_write = groups.write_group

    def killed(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(groups, "write_group", killed)
    with pytest.raises(KeyboardInterrupt):
        run_cli(capsys, _prepare(corpus, vocab, out, "--overwrite"))
    aside = out / ".old-parts-0-of-1"
    assert {f"part-0000{i}.tfrecord" for i in (0, 1)} <= set(os.listdir(aside))
    assert tree_digest(aside)["part-00000.tfrecord"] == old["part-00000.tfrecord"]
    assert not [n for n in os.listdir(out) if n.startswith("part-")]  # nothing old is resumed
    monkeypatch.setattr(groups, "write_group", real_write)
    assert run_cli(capsys, _prepare(corpus, vocab, out)).code == 0  # resumes the new inputs
    assert not aside.exists()
    settings = PipelineSettings(batch_size=1, max_seq_length=LENGTH, max_predictions_per_seq=SLOTS)
    next(make_pretrain_iterator(str(out), settings))


# --- A splitter never changes the words it is given ----------------------------------------------


def test_prepare_stops_at_a_splitter_that_changes_words(vocab, tmp_path, capsys, monkeypatch):
    """The check runs inside data prepare: a splitter whose sentences are not its text (what
    syntok's normalised tokens did to "don't") stops the run, naming the splitter and the text."""
    from bert_jax.data import sentences

    corpus = tmp_path / "corpus.jsonl"
    texts = [" ".join(REAL_SENTENCES[i::3]) + " I don't know why." for i in range(3)]
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    out = tmp_path / "data"
    monkeypatch.setitem(
        sentences._PARAGRAPH_SPLITTERS, "regex", lambda p: [p.replace("n't", "not")]
    )
    sentences.splitter.cache_clear()
    try:
        outcome = run_cli(capsys, _prepare(str(corpus), vocab, out, "--splitter", "regex"))
    finally:
        sentences.splitter.cache_clear()
    assert_user_error(outcome, "--splitter regex changed the text", "don't")
    assert "Traceback" not in outcome.err
    assert not out.exists()  # the output it started is removed: nothing left to trust


def _as_made_by_the_old_code(config_path) -> None:
    """prepare_config.json as versions before text extraction was recorded wrote it."""
    payload = json.loads(config_path.read_text())
    del payload["text_extraction"]
    config_path.write_text(json.dumps(payload))


def test_records_of_the_old_text_extraction_are_not_resumed(vocab, tmp_path, capsys):
    corpus = tmp_path / "corpus.jsonl"
    texts = [" ".join(REAL_SENTENCES[i::4]) for i in range(4)]
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    out = tmp_path / "data"
    assert run_cli(capsys, _prepare(str(corpus), vocab, out)).code == 0
    assert manifest.read_prepare_config(out)["text_extraction"] == 2
    _as_made_by_the_old_code(out / "prepare_config.json")
    os.remove(out / "part-00001.tfrecord")  # an interrupted run of the old code
    before = tree_digest(out)
    outcome = run_cli(capsys, _prepare(str(corpus), vocab, out))
    assert_user_error(
        outcome, str(out), "records were made with text extraction v1", "extracts v2", "--overwrite"
    )
    assert tree_digest(out) == before
    assert run_cli(capsys, _prepare(str(corpus), vocab, out, "--overwrite")).code == 0
    assert manifest.read_prepare_config(out)["text_extraction"] == 2
    settings = PipelineSettings(batch_size=1, max_seq_length=LENGTH, max_predictions_per_seq=SLOTS)
    next(make_pretrain_iterator(str(out), settings))


# --- An existing path is that path, whatever its name holds --------------------------------------


def test_an_input_named_like_a_glob_is_that_file(vocab, tmp_path, capsys):
    """`corpus [2020].txt` exists: it is the input, not a pattern matching `corpus 2.txt` or
    nothing; a real pattern still expands."""
    from bert_jax.data.sources import kinds as sources

    corpus = _corpus(tmp_path / "corpus [2020].txt")
    (tmp_path / "corpus 2.txt").write_text("Another file the class [2020] would match.\n")
    assert sources.expand_sources([corpus]) == [corpus]
    assert sources.expand_sources([str(tmp_path / "corpus [0-9].txt")]) == [
        str(tmp_path / "corpus 2.txt")
    ]
    out = tmp_path / "data"
    outcome = run_cli(capsys, _prepare(corpus, vocab, out))
    assert outcome.code == 0, outcome.err
    assert [entry["path"] for entry in manifest.read_prepare_config(out)["inputs"]] == [corpus]
    shard = out / "part [1].tfrecord"
    os.rename(out / "part-00000.tfrecord", shard)
    assert records.list_record_files([str(shard)]) == [str(shard)]


# --- A full output disk ---------------------------------------------------------------------------


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("full_at", ["part-00001.tfrecord", "part-00001.json"])
def test_prepare_on_a_full_disk_is_one_line_and_a_rerun_writes_the_same_records(
    full_at, vocab, tmp_path, capsys, monkeypatch
):
    """The disk fills while the second shard is written: an OSError for the records (their
    writer is pointed at /dev/full through a link) or for the counts beside them. One line naming
    where and how much, exit 2; nothing half-written is left or trusted; a rerun writes identical
    records."""
    corpus = _corpus(tmp_path / "corpus.txt")
    reference, out = tmp_path / "reference", tmp_path / "data"
    assert run_cli(capsys, _prepare(corpus, vocab, reference)).code == 0
    module = records if full_at.endswith(".tfrecord") else files
    real_name = module.temporary_name

    def fills_up(path):
        name = real_name(path)
        if os.path.basename(path) == full_at:
            os.symlink("/dev/full", name)  # removed (the link, not the device) by the writer
        return name

    monkeypatch.setattr(module, "temporary_name", fills_up)
    outcome = run_cli(capsys, _prepare(corpus, vocab, out))
    monkeypatch.setattr(module, "temporary_name", real_name)
    assert_user_error(
        outcome,
        f"no space left on device writing part-00001.tfrecord in --output {out}",
        "the shard takes about",
        "B are free",
        "the 1 shard(s) finished are kept",
        only_line=False,
    )
    assert "Traceback" not in outcome.err and len(outcome.err.splitlines()) < 10, outcome.err
    assert not [n for n in os.listdir(out) if n.startswith(".") or n.startswith("stats-")]
    assert not os.path.exists(out / "part-00001.tfrecord")
    settings = PipelineSettings(batch_size=1, max_seq_length=LENGTH, max_predictions_per_seq=SLOTS)
    with pytest.raises(manifest.IncompleteRecordsError):
        make_pretrain_iterator(str(out), settings)
    assert run_cli(capsys, _prepare(corpus, vocab, out)).code == 0
    made, wanted = tree_digest(out), tree_digest(reference)
    shards = [name for name in wanted if name.endswith(".tfrecord")]
    assert len(shards) == 2 and all(made[name] == wanted[name] for name in shards)
