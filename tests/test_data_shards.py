"""Past one machine, `data prepare --runner beam` is the one way: the flags of the earlier scheme
(`--shard-index I --num-shards N`, then `--merge`) are refused in one line naming `--runner beam`,
and directories that scheme wrote still read: merged ones as before, unmerged ones refused."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from bert_jax import cli
from bert_jax.data.pipeline.tf_data import PipelineSettings, make_pretrain_iterator
from bert_jax.data.records import manifest
from bert_jax.data.records import tfrecord as records
from tests.convert_fixtures import write_vocab
from tests.faults import run_cli
from tests.helpers import REAL_SENTENCES

LENGTH, SLOTS, GROUPS = 32, 5, 6
READER = PipelineSettings(batch_size=2, max_seq_length=LENGTH, max_predictions_per_seq=SLOTS)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    """Three small text files (four documents each) and a vocab covering them."""
    root = tmp_path_factory.mktemp("corpus")
    files = []
    for f, name in enumerate(["a.txt", "b.txt", "c.txt"]):
        documents = [
            [REAL_SENTENCES[(f + d + s) % len(REAL_SENTENCES)] for s in range(2 + d % 2)]
            for d in range(4)
        ]
        (root / name).write_text("\n\n".join("\n".join(d) for d in documents) + "\n")
        files.append(str(root / name))
    return {"inputs": files, "vocab": write_vocab(str(root / "vocab.txt"))}


def _argv(corpus: dict, output, *extra: str) -> list[str]:
    return [
        "data", "prepare", "--input", *corpus["inputs"], "--tokenizer", corpus["vocab"],
        "--output", str(output), "--max-seq-length", str(LENGTH), "--max-predictions-per-seq",
        str(SLOTS), "--dupe-factor", "2", "--seed", "5", "--num-groups", str(GROUPS),
        "--heldout-share", "0", *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def prepared(corpus, tmp_path_factory):
    output = tmp_path_factory.mktemp("prepared") / "one"
    assert cli.main(_argv(corpus, output)) == 0
    return output


def _rows(directory) -> list[tuple]:
    """Every record of `directory`, decoded, as a sorted list (the instances as a multiset)."""
    rows = []
    for batch in records.read_records(str(directory), LENGTH, SLOTS, batch_size=64):
        names = sorted(batch)
        for i in range(len(batch[names[0]])):
            rows.append(tuple(batch[name][i].tobytes() for name in names))
    return sorted(rows)


def _as_three_machines(directory, merged: bool) -> None:
    """`directory` as the earlier scheme left it: machine I of 3 wrote the groups g % 3 == I and
    its stats-I-of-3.json; `--merge` then added merged_shards to the manifest."""
    stats = json.loads((directory / manifest.COMPLETION_MARK).read_text())
    os.remove(directory / manifest.COMPLETION_MARK)
    for index in range(3):
        mine = [g for g in stats["parts"] if g % 3 == index]
        mark = {**stats, "shard": {"input_groups": GROUPS, "parts": mine}}
        del mark["parts"]
        (directory / manifest.stats_name(index, 3)).write_text(json.dumps(mark))
    if merged:
        config = json.loads((directory / "prepare_config.json").read_text())
        config.update(merged_shards=3)
        del config["heldout_share"]  # the earlier version recorded none
        (directory / "prepare_config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    "flags", [("--shard-index", "1", "--num-shards", "3"), ("--num-shards", "2"), ("--merge",)]
)
def test_the_flags_of_several_machines_are_refused_naming_the_beam_runner(
    corpus, tmp_path, capsys, flags
):
    output = tmp_path / "out"
    argv = ["data", "prepare", "--merge", "--output", str(output)]
    if flags != ("--merge",):
        argv = _argv(corpus, output, *flags)
    outcome = run_cli(capsys, argv)
    assert outcome.code == 2
    assert f"{flags[0]} is gone" in outcome.message and "--runner beam" in outcome.message
    assert len(outcome.err.strip().splitlines()) == 1
    assert not output.exists()


def test_a_directory_merged_by_an_earlier_version_still_reads(prepared, corpus, tmp_path):
    merged = tmp_path / "merged"
    shutil.copytree(prepared, merged)
    _as_three_machines(merged, merged=True)
    manifest.require_complete(str(merged))
    assert _rows(merged) == _rows(prepared) and _rows(prepared)
    files = records.list_record_files(str(merged))
    batch = next(make_pretrain_iterator(files, READER, corpus["vocab"]))
    assert batch["input_ids"].shape == (2, LENGTH)
    # Run again with the same settings: it resumes (nothing to write) as one machine's directory.
    assert cli.main(_argv(corpus, merged)) == 0
    names = os.listdir(merged)
    assert manifest.COMPLETION_MARK in names and manifest.stats_name(0, 3) not in names
    manifest.require_complete(str(merged))
    assert _rows(merged) == _rows(prepared)


def test_an_unmerged_directory_of_an_earlier_version_is_refused(prepared, tmp_path):
    unmerged = tmp_path / "unmerged"
    shutil.copytree(prepared, unmerged)
    _as_three_machines(unmerged, merged=False)
    with pytest.raises(manifest.UnmergedRecordsError, match="--runner beam"):
        manifest.require_complete(str(unmerged))
    os.remove(unmerged / manifest.stats_name(2, 3))  # a machine that never finished
    with pytest.raises(manifest.IncompleteRecordsError, match=r"machine\(s\) \[2\] of 3"):
        manifest.require_complete(str(unmerged))
