"""`data prepare` on several machines (`--shard-index I --num-shards N`) joined by `--merge`: the
same instances as one machine's run, and every inconsistency between the shards refused in one
line naming the shard, setting, input or part; training refuses shards that were not merged."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from bert_jax import cli
from bert_jax.data.pipeline.tf_data import PipelineSettings, make_pretrain_iterator
from bert_jax.data.records import manifest
from bert_jax.data.records import tfrecord as records
from bert_jax.runtime.errors import UserError
from tests.convert_fixtures import write_vocab
from tests.faults import assert_user_error, run_cli, tree_digest
from tests.helpers import REAL_SENTENCES

LENGTH, SLOTS, SHARDS = 32, 5, 3
READER = PipelineSettings(batch_size=2, max_seq_length=LENGTH, max_predictions_per_seq=SLOTS)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    """Three small text files (four documents each), a fourth one, and a vocab covering them."""
    root = tmp_path_factory.mktemp("corpus")
    files = []
    for f, name in enumerate(["a.txt", "b.txt", "c.txt", "d.txt"]):
        documents = [
            [REAL_SENTENCES[(f + d + s) % len(REAL_SENTENCES)] for s in range(2 + d % 2)]
            for d in range(4)
        ]
        (root / name).write_text("\n\n".join("\n".join(d) for d in documents) + "\n")
        files.append(str(root / name))
    vocab = write_vocab(str(root / "vocab.txt"))
    return {"inputs": files[:3], "extra": files[3], "vocab": vocab, "root": root}


def _prepare(corpus: dict, output, *extra: str, inputs=None, vocab=None) -> int:
    argv = [
        "data", "prepare", "--input", *(inputs or corpus["inputs"]),
        "--tokenizer", vocab or corpus["vocab"], "--output", str(output),
        "--max-seq-length", str(LENGTH), "--max-predictions-per-seq", str(SLOTS),
        "--dupe-factor", "2", "--seed", "5", "--num-groups", "6", *extra,
    ]  # fmt: skip
    return cli.main(argv)


def _shard(corpus: dict, output, index: int, *extra: str, **kwargs) -> None:
    flags = ("--shard-index", str(index), "--num-shards", str(SHARDS))
    assert _prepare(corpus, output, *flags, *extra, **kwargs) == 0


@pytest.fixture(scope="module")
def prepared(corpus, tmp_path_factory) -> dict:
    """One machine's output, and three machines' shards in one directory (not merged)."""
    root = tmp_path_factory.mktemp("prepared")
    assert _prepare(corpus, root / "single") == 0
    for index in range(SHARDS):
        _shard(corpus, root / "sharded", index)
    return {"single": root / "single", "sharded": root / "sharded"}


def _copy(prepared: dict, tmp_path):
    target = tmp_path / "sharded"
    shutil.copytree(prepared["sharded"], target)
    return target


def _merge(output) -> list[str]:
    return ["data", "prepare", "--merge", "--output", str(output)]


def _rows(directory) -> list[tuple]:
    """Every record of `directory`, decoded, as a sorted list (the instances as a multiset)."""
    rows = []
    for batch in records.read_records(str(directory), LENGTH, SLOTS, batch_size=64):
        names = sorted(batch)
        for i in range(len(batch[names[0]])):
            rows.append(tuple(batch[name][i].tobytes() for name in names))
    return sorted(rows)


def _take_shard(source, target, index: int) -> None:
    """Replaces shard `index` of `target` by the one another machine wrote into `source`, as a
    user who gathers the machines' directories into one does."""
    for directory, keep in ((target, False), (source, True)):
        for name in os.listdir(directory):
            part = name.startswith("part-") and int(name[5:10]) % SHARDS == index
            if part or name == manifest.stats_name(index, SHARDS):
                if keep:
                    shutil.copy(directory / name, target / name)
                else:
                    os.remove(directory / name)


def test_three_shards_merged_hold_the_instances_of_one_prepare(corpus, prepared, tmp_path, capsys):
    sharded = _copy(prepared, tmp_path)
    with pytest.raises(manifest.UnmergedRecordsError, match="--merge") as caught:
        make_pretrain_iterator(str(sharded), READER)  # what pretrain reads through
    assert isinstance(caught.value, UserError) and "\n" not in str(caught.value)
    assert str(sharded) in str(caught.value)

    outcome = run_cli(capsys, _merge(sharded))
    assert outcome.code == 0, outcome.err
    assert manifest.read(sharded).merged_shards == SHARDS
    assert manifest.read(sharded).setting_changes(manifest.read(prepared["single"])) == []
    assert len(_rows(prepared["single"])) > 20
    assert _rows(sharded) == _rows(prepared["single"])
    next(make_pretrain_iterator(str(sharded), READER))

    # A shard run again afterwards (its completion mark rewritten) needs a new merge.
    _shard(corpus, sharded, 1)
    with pytest.raises(manifest.UnmergedRecordsError):
        make_pretrain_iterator(str(sharded), READER)
    assert run_cli(capsys, _merge(sharded)).code == 0
    next(make_pretrain_iterator(str(sharded), READER))


def test_merge_refuses_shards_of_the_old_text_extraction(prepared, tmp_path, capsys):
    """Shards whose completion marks were written before text extraction was recorded (their
    words may differ from this version's) are refused by name, whether all or some are old."""
    sharded = _copy(prepared, tmp_path)
    for index in (1, 0):
        stats = sharded / manifest.stats_name(index, SHARDS)
        payload = json.loads(stats.read_text())
        del payload["shard"]["manifest"]["text_extraction"]
        stats.write_text(json.dumps(payload))
        before = tree_digest(sharded)
        outcome = run_cli(capsys, _merge(sharded))
        assert_user_error(outcome, "text extraction v1", "extracts v2", "--overwrite")
        assert tree_digest(sharded) == before


def test_merge_refuses_a_missing_or_incomplete_shard(prepared, tmp_path, capsys):
    sharded = _copy(prepared, tmp_path)
    stats = sharded / manifest.stats_name(1, SHARDS)
    kept = stats.read_bytes()

    def refused(*named: str) -> None:
        before = tree_digest(sharded)
        assert_user_error(run_cli(capsys, _merge(sharded)), *named)
        assert tree_digest(sharded) == before  # nothing written, nothing trusted
        with pytest.raises(manifest.IncompleteRecordsError):
            make_pretrain_iterator(str(sharded), READER)

    os.remove(stats)  # machine 1 never finished
    refused("shard 1 of 3", "stats-1-of-3.json", "--shard-index 1")
    payload = json.loads(kept)
    del payload["shard"]  # a completion mark of earlier versions
    stats.write_text(json.dumps(payload))
    refused(str(stats), "--shard-index 1")
    stats.write_bytes(kept)

    lost = sorted(n for n in os.listdir(sharded) if n.startswith("part-00002.tfrecord"))
    os.rename(sharded / lost[0], tmp_path / lost[0])  # a part of shard 2 went missing
    refused("part-00002.tfrecord", "shard 2 of 3")
    os.rename(tmp_path / lost[0], sharded / lost[0])

    for suffix in ("tfrecord", "json"):  # a part that no shard wrote (another run's)
        shutil.copy(sharded / f"part-00000.{suffix}", sharded / f"part-00099.{suffix}")
    refused("part-00099.tfrecord", "none of the 3 shards")
    for suffix in ("tfrecord", "json"):
        os.remove(sharded / f"part-00099.{suffix}")

    shutil.copy(stats, sharded / manifest.stats_name(0, 2))  # one machine ran with --num-shards 2
    refused("--num-shards", "2 and 3")
    os.remove(sharded / manifest.stats_name(0, 2))
    assert run_cli(capsys, _merge(sharded)).code == 0

    assert_user_error(run_cli(capsys, [*_merge(sharded), "--input", "x.txt"]), "--output only")
    argv = ["data", "prepare", "--output", str(tmp_path / "new"), "--input", "x.txt"]
    assert_user_error(run_cli(capsys, argv), "--tokenizer", "required")
    assert_user_error(run_cli(capsys, _merge(tmp_path / "absent")), "--output", "absent")


def test_merge_refuses_shards_with_other_settings_or_tokenizer(corpus, prepared, tmp_path, capsys):
    sharded = _copy(prepared, tmp_path)
    _shard(corpus, tmp_path / "machine1", 1, "--seed", "6")
    _take_shard(tmp_path / "machine1", sharded, 1)
    assert_user_error(run_cli(capsys, _merge(sharded)), "shard 1 of 3", "seed: 5 -> 6")

    sharded = _copy(prepared, tmp_path / "again")
    vocab = write_vocab(str(tmp_path / "other_vocab.txt"), size=200)
    _shard(corpus, tmp_path / "machine2", 2, vocab=vocab)
    _take_shard(tmp_path / "machine2", sharded, 2)
    assert_user_error(run_cli(capsys, _merge(sharded)), "shard 2 of 3", "tokenizer_fingerprint")


def test_merge_refuses_an_input_not_read_by_every_shard(corpus, prepared, tmp_path, capsys):
    sharded = _copy(prepared, tmp_path)
    _shard(corpus, tmp_path / "machine2", 2, inputs=[*corpus["inputs"], corpus["extra"]])
    _take_shard(tmp_path / "machine2", sharded, 2)
    outcome = run_cli(capsys, _merge(sharded))
    assert_user_error(outcome, corpus["extra"], "read by shard 2", "not by shards 0, 1")

    sharded = _copy(prepared, tmp_path / "again")
    _shard(corpus, tmp_path / "machine1", 1, inputs=corpus["inputs"][:2])
    _take_shard(tmp_path / "machine1", sharded, 1)
    outcome = run_cli(capsys, _merge(sharded))
    assert_user_error(outcome, corpus["inputs"][2], "shards 0, 2", "not by shard 1")
