"""`data prepare --runner beam` on Apache Beam's FnApiRunner (marker `beam`: `make test-beam`, in
.venv-beam): the records of the local path, byte for byte, on the three kinds of corpus read as
splits, gs:// in and out, a group whose first attempt fails or that runs twice, bad input.

Two worker processes (`--direct_num_workers=2 --direct_running_mode=multi_processing`) where the
records are compared; the fault cases patch a step of the pipeline, so they run Beam's workers
in this process (the FnApiRunner's default)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

pytest.importorskip("apache_beam")

from bert_jax import cli  # noqa: E402
from bert_jax.data.preparation import beam_pipeline as beam_lib  # noqa: E402
from bert_jax.data.preparation import beam_watch  # noqa: E402
from bert_jax.data.preparation import groups as groups_lib  # noqa: E402
from bert_jax.data.preparation.local_runner import prepare_records
from bert_jax.data.preparation.settings import PrepareSettings
from bert_jax.data.preparation.stage import FORMAT_VERSION, check_run
from bert_jax.data.records import manifest
from bert_jax.data.sources import embedded as sources  # noqa: E402
from tests.corpus_fixtures import (  # noqa: E402
    realistic_dump_xml,
    write_parquet,
    write_stream_per_page_bz2,
)
from tests.data_fixtures import embedded_spm_dir  # noqa: E402
from tests.faults import run_cli  # noqa: E402

pytestmark = pytest.mark.beam

TWO_PROCESSES = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]
SETTINGS = dict(max_seq_length=48, max_predictions_per_seq=8, dupe_factor=2, seed=7)


def _argv(inputs: list[str], output, *extra: str) -> list[str]:
    return [
        "data", "prepare", "--input", *inputs, "--tokenizer", embedded_spm_dir(),
        "--output", str(output), "--max-seq-length", "48", "--max-predictions-per-seq", "8",
        "--dupe-factor", "2", "--seed", "7", "--num-groups", "3", "--split-bytes", "2000",
        *extra,
    ]  # fmt: skip


def _settings(**changes) -> PrepareSettings:
    return PrepareSettings(**SETTINGS, num_groups=3, split_bytes=2000, **changes)


def _records(directory) -> dict[str, bytes]:
    return {
        name: (directory / name).read_bytes()
        for name in sorted(os.listdir(directory))
        if name.endswith(".tfrecord")
    }


def _counts(directory) -> dict[str, bytes]:
    """Each shard's counts (``part-NNNNN.json``), as bytes."""
    return {
        name: (directory / name).read_bytes()
        for name in sorted(os.listdir(directory))
        if name.startswith("part-") and name.endswith(".json")
    }


def _assert_same_records(local, beam, heldout: bool = True) -> None:
    """The same records, counts and manifest; and the same held-out records in ``heldout/``."""
    assert (beam / "heldout").is_dir() == (local / "heldout").is_dir()
    if heldout and (local / "heldout").is_dir():
        _assert_same_records(local / "heldout", beam / "heldout", heldout=False)
    assert _records(beam) == _records(local) and _records(local)
    assert _counts(beam) == _counts(local)
    local_stats = json.loads((local / "stats-0-of-1.json").read_text())
    beam_stats = json.loads((beam / "stats-0-of-1.json").read_text())
    assert beam_stats["corpus"] == local_stats["corpus"]
    assert beam_stats["parts"] == local_stats["parts"]
    assert beam_stats.get("heldout") == local_stats.get("heldout")
    assert json.loads((beam / "prepare_config.json").read_text()) == json.loads(
        (local / "prepare_config.json").read_text()
    )
    assert not [name for name in os.listdir(beam) if name.startswith(".")]  # no temporaries


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict[str, list[str]]:
    """The three kinds: the embedded corpus, a multistream Wikipedia dump (a bz2 stream per
    page), a Parquet file of several row groups. The dump has 20 articles: the held-out floor
    (at most one document in ten, none below two) holds out two, so every kind has held-out
    records to compare."""
    root = tmp_path_factory.mktemp("corpora")
    dump = root / "enwiki-pages-articles-multistream.xml.bz2"
    write_stream_per_page_bz2(dump, realistic_dump_xml(repeat=4))
    books = root / "books.parquet"
    rows = ["\n".join(document) for document in sources.embedded_documents("train")[:48]]
    write_parquet(books, rows, row_group_size=6)
    return {"embedded": ["embedded:eval"], "wikipedia": [str(dump)], "parquet": [str(books)]}


@pytest.mark.parametrize("kind", ["embedded", "wikipedia", "parquet"])
def test_two_beam_workers_write_the_records_of_the_local_path(corpora, kind, tmp_path, capsys):
    inputs = corpora[kind]
    local, beam = tmp_path / "local", tmp_path / "beam"
    assert run_cli(capsys, _argv(inputs, local, "--num-workers", "2")).code == 0
    outcome = run_cli(capsys, [*_argv(inputs, beam, "--runner", "beam"), "--", *TWO_PROCESSES])
    assert outcome.code == 0, outcome.err
    _assert_same_records(local, beam)
    # The same held-out count of the corpus, and why, that the summary says.
    held = [json.loads((d / "stats-0-of-1.json").read_text())["heldout"] for d in (local, beam)]
    assert held[0] == held[1] and held[0]["of_corpus"]["documents"] > held[0]["documents"] > 0
    config = json.loads((beam / "prepare_config.json").read_text())
    assert config["num_groups"] == 3 and config["format_version"] == FORMAT_VERSION
    plan = check_run(inputs, embedded_spm_dir(), tmp_path / "plan", _settings())
    if kind != "embedded":  # read as several splits (the embedded corpus is one)
        assert len(plan.splits) > 1


def test_dry_run_prints_the_splits_and_options_and_runs_nothing(corpora, tmp_path, capsys):
    output = tmp_path / "never"
    argv = [*_argv(corpora["parquet"], output, "--runner", "beam", "--dry-run"), "--"]
    capsys.readouterr()
    assert cli.main([*argv, "--runner=DataflowRunner", "--project=p", "--region=r"]) == 0
    out = capsys.readouterr().out
    assert "parquet" in out and "into 3 training group(s)" in out and out.count("  parquet ") > 1
    assert "--runner=DataflowRunner" in out and "--project=p" in out and "--region=r" in out
    assert not output.exists()


def test_a_group_that_fails_its_first_attempt_is_finished_by_the_rerun(
    corpora, tmp_path, monkeypatch
):
    """A worker dies writing group 1 (its temporary file left behind): the job fails, leaves no
    completion mark (readers refuse the directory), and the same job run again finishes it with
    the bytes of the local path, the finished groups kept, no temporary file left."""
    inputs = corpora["parquet"]
    local = tmp_path / "local"
    prepare_records(inputs, embedded_spm_dir(), local, _settings())
    output = tmp_path / "beam"
    write_group = groups_lib.write_group

    def dies_writing_group_1(output_dir, group, counts, serialized):
        if group == 1:
            # The temporary name of a writer on another worker machine, killed mid-shard.
            temporary = ".part-00001.tfrecord.tmp-worker-7-1234-deadbeef"
            with open(os.path.join(output_dir, temporary), "wb") as f:
                f.write(b"half a shard")
            raise RuntimeError("worker lost")
        write_group(output_dir, group, counts, serialized)

    monkeypatch.setattr(groups_lib, "write_group", dies_writing_group_1)
    with pytest.raises(Exception, match="worker lost"):
        beam_lib.prepare_with_beam(inputs, embedded_spm_dir(), output, _settings(), [])
    assert not (output / "stats-0-of-1.json").exists()
    with pytest.raises(manifest.IncompleteRecordsError):
        manifest.require_complete(str(output))
    written_before = set(_records(output))
    assert "part-00001.tfrecord" not in written_before

    monkeypatch.setattr(groups_lib, "write_group", write_group)
    result = beam_lib.prepare_with_beam(inputs, embedded_spm_dir(), output, _settings(), [])
    assert result.groups_skipped == len(written_before)
    assert result.groups_written == len(_records(local)) - len(written_before)
    _assert_same_records(local, output)
    manifest.require_complete(str(output))


def test_a_group_run_twice_leaves_one_shard_and_counts_once(corpora, tmp_path, monkeypatch):
    """A runner may run a bundle again after a lost worker (or twice, speculatively): the
    shard is rewritten to the same bytes, never duplicated, and its counts are summed once."""
    inputs = corpora["wikipedia"]
    local = tmp_path / "local"
    expected = prepare_records(inputs, embedded_spm_dir(), local, _settings())
    calls = tmp_path / "calls"  # the step is pickled: what it records goes to a file
    write_once = beam_lib._write_group

    def write_twice(group_documents, targets, *args):
        (held, group), keyed = group_documents
        keyed = list(keyed)
        first = list(write_once(((held, group), keyed), targets, *args))
        directory = targets[held][0]
        shard = os.path.join(directory, groups_lib.part_name(group))
        before = open(shard, "rb").read() if os.path.exists(shard) else None
        if first:  # a group made (a held-out group left with no document is not)
            with open(calls, "a") as f:
                f.write(f"{os.path.basename(directory)}/{group}\n")
        # In another order: the same shard.
        again = list(write_once(((held, group), list(reversed(keyed))), targets, *args))
        assert (open(shard, "rb").read() if os.path.exists(shard) else None) == before
        assert [where for where, _ in again] == [where for where, _ in first]
        return again

    monkeypatch.setattr(beam_lib, "_write_group", write_twice)
    output = tmp_path / "beam"
    result = beam_lib.prepare_with_beam(inputs, embedded_spm_dir(), output, _settings(), [])
    # The three groups, and the held-out group (3 groups x --heldout-share 0.01, rounded up)
    # where the corpus has documents enough for one.
    held = ["heldout/0"] if (local / "heldout").is_dir() else []
    assert sorted(calls.read_text().split()) == ["beam/0", "beam/1", "beam/2", *held]
    assert result.instance_stats.instances == expected.instance_stats.instances
    _assert_same_records(local, output)


def test_bad_input_is_the_local_paths_one_line(tmp_path, capsys):
    """Found by a worker (a line too long for --strict, read in a worker process), or before
    the job (a damaged Parquet file's footer, text that is not UTF-8): the same one line, exit
    2, as the local path, and no completion mark."""
    damaged = tmp_path / "damaged.parquet"
    damaged.write_bytes(b"PAR1" + b"\x00" * 64 + b"PAR1")
    latin = tmp_path / "latin.txt"
    latin.write_bytes("Caf\xe9 au lait.\nA second line.\n".encode("latin-1"))
    long_line = tmp_path / "long.txt"
    long_line.write_text("Short.\nShort too.\n\n" + "word " * 20 + "\nEnd.\n", encoding="utf-8")
    strict = ("--strict", "--max-line-bytes", "50")
    for bad, extra in ((long_line, strict), (damaged, ()), (latin, ())):
        # An output of its own each: a refused run may leave the directory it started.
        local = run_cli(capsys, _argv([str(bad)], tmp_path / f"local-{bad.name}", *extra))
        argv = _argv([str(bad)], tmp_path / f"beam-{bad.name}", *extra, "--runner", "beam")
        beam = run_cli(capsys, [*argv, "--", *TWO_PROCESSES])
        assert local.code == beam.code == 2, beam.err
        assert beam.message == local.message and str(bad) in beam.message
        assert "Traceback" not in beam.err
        assert not (tmp_path / f"beam-{bad.name}" / "stats-0-of-1.json").exists()


def test_a_user_error_in_a_step_run_in_this_process_is_one_line(tmp_path, capsys, caplog):
    """Beam's default, its worker in this process: a step's user error is the command's one line,
    without the failed step's traceback that Beam logs."""
    text = tmp_path / "one.txt"
    text.write_text("One sentence.\n", encoding="utf-8")
    capsys.readouterr()
    code = cli.main(_argv([str(text)], tmp_path / "out", "--runner", "beam"))
    shown = capsys.readouterr()
    assert code == 2 and "hold 1 usable document" in shown.err.splitlines()[-1]
    assert "Traceback" not in shown.out + shown.err + caplog.text, caplog.text


def test_from_a_bucket_into_a_bucket(corpora, tmp_path, capsys):
    """gs:// in and gs:// out (Cloud Storage emulator): two Beam workers read the inputs' splits
    from the bucket and write the shards, completion mark and tokenizer into it; the records
    equal the local path's from the same files on local disk."""
    from bert_jax.runtime import fs
    from tests import gcs_emulator

    bucket = "gs://bert-jax-beam"
    with gcs_emulator.running(tmp_path / "gcs") as emulator:
        emulator.create_bucket(bucket[len("gs://") :])
        remote = []
        for path in (*corpora["wikipedia"], *corpora["parquet"]):
            remote.append(f"{bucket}/in/{os.path.basename(path)}")
            fs.upload(path, remote[-1])
        argv = [*_argv(remote, f"{bucket}/out", "--runner", "beam"), "--", *TWO_PROCESSES]
        outcome = run_cli(capsys, argv)
        assert outcome.code == 0, outcome.err
        local = tmp_path / "local"
        local_inputs = [*corpora["wikipedia"], *corpora["parquet"]]
        assert run_cli(capsys, _argv(local_inputs, local)).code == 0
        names = fs.listdir(f"{bucket}/out")
        assert "stats-0-of-1.json" in names and "tokenizer" in names
        assert not [name for name in names if name.startswith(".")]
        for name, data in {**_records(local), **_counts(local)}.items():
            assert fs.read_bytes(f"{bucket}/out/{name}") == data, name
        assert sorted(n for n in names if n.startswith("part-")) == sorted(
            {**_records(local), **_counts(local)}
        )


def test_beam_counters_are_the_summarys_counts(corpora, tmp_path, monkeypatch):
    """Beam's counters (what Dataflow's console shows), summed over two worker processes, equal
    the local path's summary: documents read, input bytes (the files' sizes), groups and
    instances, the held-out records' apart."""
    text = tmp_path / "books.txt"
    text.write_text(
        "".join("\n".join(d) + "\n\n" for d in sources.embedded_documents("train")[:40]),
        encoding="utf-8",
    )
    inputs = [str(text), *corpora["wikipedia"]]
    local = prepare_records(inputs, embedded_spm_dir(), tmp_path / "local", _settings())
    found = []
    job_counters = beam_watch.job_counters

    def recording(job):
        found.append(job_counters(job))
        return found[-1]

    monkeypatch.setattr(beam_watch, "job_counters", recording)
    beam = beam_lib.prepare_with_beam(
        inputs, embedded_spm_dir(), tmp_path / "beam", _settings(), TWO_PROCESSES
    )
    assert local.heldout_stats is not None and local.heldout_stats.instances > 0
    assert found == [
        {
            "documents": local.corpus_stats.documents,
            "input_bytes": sum(os.path.getsize(path) for path in inputs),
            "groups": local.instance_stats.groups,
            "instances": local.instance_stats.instances,
            "heldout_groups": local.heldout_stats.groups,
            "heldout_instances": local.heldout_stats.instances,
        }
    ]
    assert set(found[0]) == set(beam_watch.COUNTERS)
    assert beam.instance_stats.instances == local.instance_stats.instances


def _run_beam_command(corpora, output, *beam_options: str) -> str:
    """`bert-jax data prepare --runner beam` as a user runs it (a process of its own, so that
    what Beam's worker processes print reaches its stderr too); its stdout and stderr."""
    argv = [*_argv(corpora["parquet"], output, "--runner", "beam"), "--", *beam_options]
    done = subprocess.run(
        [sys.executable, "-m", "bert_jax.cli", *argv],
        capture_output=True,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr


def test_a_run_shows_bert_jax_progress_and_hides_beams_lines(corpora, tmp_path):
    """Two worker processes: the job's first line, the local path's progress lines and its
    summary; none of Beam's INFO or WARNING lines, the driver's or the workers'. Beam's own
    option --default_sdk_harness_log_level=INFO shows them."""
    shown = _run_beam_command(corpora, tmp_path / "quiet", *TWO_PROCESSES)
    lines = shown.splitlines()
    layout = "into 3 training group(s) and 1 held-out group(s)"  # written side by side
    assert any("Beam job: " in line and layout in line for line in lines), shown
    progress = [line for line in lines if "groups written " in line]
    assert progress and re.search(r"groups written 4/4 \([0-9.]+/s, ETA ", progress[-1]), shown
    assert any(line.startswith("wrote 3 shard(s)") for line in lines), shown
    beams = [
        line
        for line in lines
        if "apache_beam" in line or "sdk_worker" in line or re.match(r"(INFO|WARNING):", line)
    ]
    assert beams == [], shown
    assert len(lines) < 15, shown

    asked = _run_beam_command(
        corpora, tmp_path / "verbose", *TWO_PROCESSES, "--default_sdk_harness_log_level=INFO"
    )
    assert "apache_beam" in asked and "groups written 4/4" in asked


def test_a_run_refused_after_its_workers_started_leaves_none(corpora, tmp_path):
    """The FnApiRunner's worker processes start before the command's own checks (to import Beam
    meanwhile): a check that refuses the run (--max-seq-length past every size preset) is still
    its one line, and ends them: no process of theirs and no folder of theirs is left."""
    argv = [*_argv(corpora["parquet"], tmp_path / "never", "--runner", "beam")]
    argv[argv.index("--max-seq-length") + 1] = "100000"
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "bert_jax.cli", *argv, "--", *TWO_PROCESSES],
        capture_output=True,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        env={**os.environ, "TMPDIR": str(temporary)},
        check=False,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    err = done.stderr.strip().splitlines()
    assert len(err) == 1 and "--max-seq-length" in err[0], done.stderr
    assert os.listdir(temporary) == []  # Standbys' folder and the workers' log: removed
    assert not (tmp_path / "never").exists()
    # A waiting worker process ends with the command (it watches its parent): none is left.
    mine = subprocess.run(["pgrep", "-f", str(temporary)], capture_output=True, text=True)
    assert mine.stdout.strip() == "", mine.stdout


def test_the_waiting_workers_share_one_import_and_end_with_close(tmp_path):
    """Standbys: one process imports Beam and the steps, then forks the waiting workers (its
    children: Beam is imported once, not per worker); close ends them all and the folder."""
    from bert_jax.data.preparation.beam_workers import Standbys

    standbys = Standbys(2, str(tmp_path / "workers.log"))
    server = standbys.server
    waiting = []
    for _ in range(600):  # the import: seconds on a busy machine
        found = subprocess.run(["pgrep", "-P", str(server.pid)], capture_output=True, text=True)
        waiting = found.stdout.split()
        if len(waiting) == 2 or server.poll() is not None:
            break
        time.sleep(0.1)
    try:
        assert len(waiting) == 2, (tmp_path / "workers.log").read_text()
    finally:
        standbys.close()
    assert server.returncode is not None and not os.path.exists(standbys.directory)
    for pid in waiting:
        assert not os.path.exists(f"/proc/{pid}"), pid
