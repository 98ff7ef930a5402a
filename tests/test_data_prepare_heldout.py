"""`data prepare`'s held-out records: a share of the documents, chosen by a hash of their key,
written into ``heldout/`` as a records directory of its own and never into the training records.

Checked on real text (the embedded corpus): every document's sentences are looked for in the
records themselves (token ids, masked positions restored), so a held-out document found in the
training records fails, whatever the code that chose it says."""

from __future__ import annotations

import collections
import dataclasses
import filecmp
import json
import os

import numpy as np
import pytest

from bert_jax import cli
from bert_jax.data.layout import HELDOUT_MIN_DOCUMENTS, heldout_dir
from bert_jax.data.preparation.local_runner import prepare_records
from bert_jax.data.preparation.settings import PrepareSettings
from bert_jax.data.records import manifest
from bert_jax.data.records import tfrecord as records
from bert_jax.data.sources import embedded as sources
from bert_jax.data.tokenizers.load_or_train import check_prepared_with, load_tokenizer
from tests.data_fixtures import embedded_spm_dir

LENGTH, SLOTS = 64, 10
DOCUMENTS = 120  # of the embedded corpus's training split: a floor of 12, a share of 0.2 gives ~24
NGRAM = 10  # tokens in a row that identify a sentence of a document


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    documents = sources.embedded_documents("train")[:DOCUMENTS]
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n\n".join("\n".join(d) for d in documents) + "\n", encoding="utf-8")
    return str(path), documents


def _settings(**changes) -> PrepareSettings:
    return PrepareSettings(
        max_seq_length=LENGTH, max_predictions_per_seq=SLOTS, dupe_factor=1, num_groups=3, **changes
    )


def _ngrams(directory) -> set[tuple[int, ...]]:
    """Every NGRAM tokens in a row within one segment of the records in ``directory``, with the
    masked tokens put back."""
    found = set()
    for batch in records.read_records(str(directory), LENGTH, SLOTS, batch_size=256):
        for row in range(batch["input_ids"].shape[0]):
            ids = batch["input_ids"][row].copy()
            picked = batch["masked_lm_weights"][row] > 0
            ids[batch["masked_lm_positions"][row][picked]] = batch["masked_lm_ids"][row][picked]
            ids = ids[: int(batch["input_mask"][row].sum())]
            for segment in np.split(ids, np.flatnonzero(ids == 3)):  # [SEP] = 3
                tokens = [int(t) for t in segment if t not in (2, 3)]  # no [CLS], [SEP]
                found.update(tuple(tokens[i : i + NGRAM]) for i in range(len(tokens) - NGRAM + 1))
    return found


def _where(documents, directory) -> tuple[set[int], set[int]]:
    """The documents (by index) whose text is in the training records, and in the held-out, by
    the NGRAMs no other document holds (the corpus repeats some text: a document none of whose
    NGRAMs is its own is in neither)."""
    tokenizer = load_tokenizer(embedded_spm_dir())
    training, held = _ngrams(directory), _ngrams(heldout_dir(directory))
    grams = []
    for document in documents:
        mine = set()
        for sentence in document:
            ids = list(tokenizer.encode(sentence))
            mine.update(tuple(ids[i : i + NGRAM]) for i in range(len(ids) - NGRAM + 1))
        grams.append(mine)
    owners = collections.Counter(gram for mine in grams for gram in mine)
    in_training, in_heldout = set(), set()
    for index, mine in enumerate(grams):
        own = {gram for gram in mine if owners[gram] == 1}
        if own & training:
            in_training.add(index)
        if own & held:
            in_heldout.add(index)
    return in_training, in_heldout


def test_heldout_documents_are_never_in_the_training_records(corpus, tmp_path):
    path, documents = corpus
    output = tmp_path / "out"
    result = prepare_records([path], embedded_spm_dir(), output, _settings(heldout_share=0.2))
    held = result.heldout_stats
    assert result.heldout_dir == heldout_dir(output) and held.instances > 0
    assert held.documents + result.instance_stats.documents == len(documents)
    assert 0.1 <= held.documents / len(documents) <= 0.3  # 0.2 of 120 documents, by a hash
    in_training, in_heldout = _where(documents, output)
    assert in_heldout and not in_training & in_heldout
    # Nearly every document is found somewhere (a few are too short or repeated to be sure of).
    assert len(in_training | in_heldout) >= 0.8 * len(documents)
    assert len(in_heldout) <= held.documents
    assert f"Held out {held.documents} of {len(documents)} documents" in result.summary()
    assert f"; {held.instances} instances in {held.groups} held-out group(s)" in result.summary()

    # heldout/ is a records directory as any other: manifest, tokenizer, completion mark.
    held_dir = heldout_dir(output)
    manifest.require_complete(held_dir)
    check_prepared_with(load_tokenizer(embedded_spm_dir()), [("heldout", held_dir)], "its own")
    config = manifest.read(held_dir).settings
    assert config["heldout"] is True and config["heldout_share"] == 0.2
    assert manifest.read(str(output)).settings["heldout_share"] == 0.2
    stats = json.loads((output / "stats-0-of-1.json").read_text())
    of_corpus = result.heldout_count.as_dict()
    assert of_corpus["documents"] == len(documents)
    assert of_corpus["by_share"] + of_corpus["by_floor"] == held.documents
    assert stats["heldout"] == {
        "documents": held.documents,
        "instances": held.instances,
        "of_corpus": of_corpus,
    }
    # The training records' readers see only their own shards.
    assert all(os.path.dirname(f) == str(output) for f in result.files)


def test_a_small_share_is_raised_to_the_floor(corpus, tmp_path):
    """A share that would hold out no document of a small corpus holds out a tenth of it (under
    HELDOUT_MIN_DOCUMENTS), the documents of lowest rank; the same for any number of workers."""
    path, documents = corpus
    assert len(documents) // 10 < HELDOUT_MIN_DOCUMENTS
    settings = _settings(heldout_share=0.0001)
    one = prepare_records([path], embedded_spm_dir(), tmp_path / "one", settings)
    assert one.heldout_stats.documents == len(documents) // 10
    two = prepare_records(
        [path], embedded_spm_dir(), tmp_path / "two", dataclasses.replace(settings, num_workers=2)
    )
    for directory in ("", "heldout"):
        names = sorted(n for n in os.listdir(tmp_path / "one" / directory) if ".tfrecord" in n)
        assert names
        for name in names:
            assert filecmp.cmp(
                tmp_path / "one" / directory / name, tmp_path / "two" / directory / name, False
            )
    assert two.heldout_stats.documents == one.heldout_stats.documents
    in_training, in_heldout = _where(documents, tmp_path / "one")
    assert in_heldout and not in_training & in_heldout


def test_resume_overwrite_and_no_heldout(corpus, tmp_path, capsys):
    path, _ = corpus
    output = tmp_path / "out"
    settings = _settings(heldout_share=0.2)
    first = prepare_records([path], embedded_spm_dir(), output, settings)
    held = heldout_dir(output)
    kept = {
        name: (output / "heldout" / name).read_bytes()
        for name in os.listdir(held)
        if name.endswith(".tfrecord")
    }
    # As if the job died before a training shard and a held-out shard were written.
    os.remove(output / "part-00001.tfrecord")
    os.remove(os.path.join(held, "part-00000.tfrecord"))
    again = prepare_records([path], embedded_spm_dir(), output, settings)
    assert (again.groups_written, again.groups_skipped) == (1, 2)
    assert again.heldout_stats.documents == first.heldout_stats.documents
    assert kept and all((output / "heldout" / n).read_bytes() == b for n, b in kept.items())

    # Another share: refused by name without --overwrite; with it, the held-out records go.
    argv = [
        "data", "prepare", "--input", path, "--tokenizer", embedded_spm_dir(),
        "--output", str(output), "--max-seq-length", str(LENGTH), "--max-predictions-per-seq",
        str(SLOTS), "--dupe-factor", "1", "--num-groups", "3", "--heldout-share", "0",
    ]  # fmt: skip
    capsys.readouterr()
    assert cli.main(argv) == 2
    assert "heldout_share: 0.2 -> 0.0" in capsys.readouterr().err
    assert cli.main([*argv, "--overwrite"]) == 0
    assert not os.path.exists(held)
    assert "Held out" not in capsys.readouterr().out
    assert manifest.read(str(output)).settings["heldout_share"] == 0.0


def test_records_prepared_before_heldout_read_and_resume_as_before(corpus, tmp_path):
    """A directory from before held-out records (no heldout_share in its manifest, no heldout/)
    reads as a directory with none, and a run with --heldout-share 0 resumes it."""
    path, _ = corpus
    output = tmp_path / "old"
    settings = _settings(heldout_share=0.0)
    prepare_records([path], embedded_spm_dir(), output, settings)
    config = json.loads((output / "prepare_config.json").read_text())
    del config["heldout_share"]  # what earlier versions wrote
    (output / "prepare_config.json").write_text(json.dumps(config))
    manifest.require_complete(str(output))
    assert manifest.read(str(output)).settings["heldout_share"] == 0.0
    again = prepare_records([path], embedded_spm_dir(), output, settings)
    assert (again.groups_written, again.groups_skipped) == (0, 3)
    assert not os.path.exists(heldout_dir(output))


def test_the_command_says_what_it_held_out_and_the_groups_it_wrote(tmp_path, capsys):
    """`bert-jax data prepare` on 97 documents of prose with the default share (1%): its lines
    give the held-out count it wrote (the floor's 9, a tenth of 97, not 1% of them) and why, and
    one count of groups, training and held-out apart, that the records directories bear out."""
    import logging
    import re

    documents = sources.embedded_documents("train")[:97]
    path = tmp_path / "corpus.txt"
    path.write_text("\n\n".join("\n".join(d) for d in documents) + "\n", encoding="utf-8")
    output = tmp_path / "out"
    argv = [
        "data", "prepare", "--input", str(path), "--tokenizer", embedded_spm_dir(),
        "--output", str(output), "--max-seq-length", str(LENGTH), "--max-predictions-per-seq",
        str(SLOTS), "--dupe-factor", "1", "--num-workers", "1",
    ]  # fmt: skip
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    root.handlers = []  # the command's own logging setup, as a fresh process has it
    capsys.readouterr()
    try:
        assert cli.main(argv) == 0
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers, root.level = handlers, level
    out = capsys.readouterr().out
    stats = json.loads((output / "stats-0-of-1.json").read_text())
    held_stats = json.loads((output / "heldout" / "stats-0-of-1.json").read_text())
    held = held_stats["instances"]["documents"]
    assert stats["corpus"]["documents"] == len(documents) == 97
    assert held == 97 // 10  # the floor: at most one in ten of a corpus under 1000 documents

    found = re.search(
        r"held out (\d+) of (\d+) documents: (\d+) by the 1\.0% share \(--heldout-share\), "
        r"(\d+) more to reach the floor of (\d+) \(at least 100 documents, at most one in 10\)",
        out,
    )
    assert found, out
    total, corpus, by_share, by_floor, floor = map(int, found.groups())
    assert (total, corpus, floor) == (held, 97, held) and by_share + by_floor == held
    assert f"Held out {held} of 97 documents: {by_share} by the 1.0% share" in out

    # One count of groups, from the layout to the last progress line, as the directories hold.
    training = manifest.read(str(output)).settings["num_groups"]
    held_groups = manifest.read(heldout_dir(output)).settings["num_groups"]
    shards = [len(list(d.glob("part-*.tfrecord"))) for d in (output, output / "heldout")]
    assert shards == [training, held_groups] == [1, 1]
    assert f"into {training} training group(s) and {held_groups} held-out group(s)" in out
    assert f"writing {sum(shards)} group(s), a shard each: 1 training, 1 held-out" in out
    assert f"groups written {sum(shards)}/{sum(shards)} " in out
    assert "holding out 1.0% of the documents (at least 100 documents, at most one in 10)" in out
