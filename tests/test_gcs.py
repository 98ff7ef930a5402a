"""gs:// end to end against a Cloud Storage emulator on localhost (marker `gcs`: `make test-gcs`).

Prepare records into the bucket, pretrain with the workdir in the bucket, stop it with SIGTERM,
resume, export, encode from the bucket: the features equal those of the same run on local disk.
Then the bad cases: a missing bucket, no credentials, a permission refused, a transient outage
(503s for 4 s mid-save, from the proxy in front of the emulator: fake-gcs-server forgets
resumable uploads when restarted, Cloud Storage does not), each one line naming the URL, no
checkpoint lost. Then `convert`, `glue` and `finetune` with their model, data and outputs in the
bucket, a checkpoint save never committed (set aside on resume), and `config.resume_from` and
`config.init_from` in the bucket.
How each client library is pointed at the emulator: tests/gcs_emulator.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from bert_jax.runtime import fs
from bert_jax.training import workdir as workdir_lib
from tests import gcs_emulator
from tests.faults import run_cli
from tests.helpers import TINY_PRETRAIN_FLAGS

pytestmark = pytest.mark.gcs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUCKET = "gs://bert-jax-test"
# The model directory `convert` writes into the bucket; fine-tuning starts from it.
MODEL = f"{BUCKET}/converted"


def jax_leaves(tree):
    import jax

    return jax.tree.leaves(tree)


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    with gcs_emulator.running(tmp_path_factory.mktemp("gcs")) as running:
        running.create_bucket(BUCKET[len("gs://") :])
        running.create_bucket(gcs_emulator.FORBIDDEN_BUCKET)
        yield running


@pytest.fixture(scope="module")
def corpus(emulator, tmp_path_factory):
    """A small corpus and its SentencePiece tokenizer, each locally and in the bucket."""
    from bert_jax.data.sources import embedded as sources
    from bert_jax.data.tokenizers.sentencepiece import train_sentencepiece

    root = tmp_path_factory.mktemp("gcs_corpus")
    documents = list(sources.embedded_documents("train"))[:400]
    text = "\n\n".join("\n".join(document) for document in documents) + "\n"
    (root / "corpus.txt").write_text(text, encoding="utf-8")
    fs.write_text(f"{BUCKET}/corpus.txt", text)
    train_sentencepiece([f"{BUCKET}/corpus.txt"], 1000, f"{BUCKET}/tok", lowercase=True)
    fs.copy_to_local(f"{BUCKET}/tok", str(root / "tok"))
    (root / "texts.txt").write_text("the language reference\nhello world\n", encoding="utf-8")
    return root


def prepare_argv(source, tokenizer, output):
    return [
        "data",
        "prepare",
        "--input",
        source,
        "--tokenizer",
        tokenizer,
        "--output",
        output,
        "--max-seq-length",
        "32",
        "--max-predictions-per-seq",
        "5",
        "--dupe-factor",
        "2",
        "--seed",
        "3",
    ]


def pretrain_argv(data, workdir, total_steps=8, every=2) -> list[str]:
    values = {
        **TINY_PRETRAIN_FLAGS,
        "total_steps": total_steps,
        "phase1.data": data,
        "checkpoint.every_steps": every,
        "log_every_steps": 1,
    }
    flags = [f"--config.{key}={value}" for key, value in values.items()]
    config_file = os.path.join(REPO, "configs", "bert.py")
    return ["pretrain", f"--config={config_file}:tiny", f"--workdir={workdir}", *flags]


def cli_process(argv) -> subprocess.Popen:
    """`bert-jax argv` in a child process (os.environ points it at the emulator)."""
    env = {**os.environ, "PYTHONPATH": REPO}
    return subprocess.Popen(
        [sys.executable, "-m", "bert_jax.cli", *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def run_until(process, marker: str, action=None) -> str:
    """Reads the child's output; calls `action` once a line contains `marker`."""
    lines = []
    for line in process.stdout:
        lines.append(line)
        if action is not None and marker in line:
            action()
            action = None
    process.wait(timeout=300)
    return "".join(lines)


def test_end_to_end_in_the_bucket_equals_local_disk(emulator, corpus, tmp_path, capsys):
    local = tmp_path / "local"
    for target, tokenizer in (
        (f"{BUCKET}/data", f"{BUCKET}/tok"),
        (local / "data", corpus / "tok"),
    ):
        source = f"{BUCKET}/corpus.txt" if fs.is_remote(target) else str(corpus / "corpus.txt")
        outcome = run_cli(capsys, prepare_argv(source, str(tokenizer), str(target)))
        assert outcome.code == 0, outcome.err
    remote_parts = sorted(n for n in fs.listdir(f"{BUCKET}/data") if n.endswith(".tfrecord"))
    local_parts = sorted(n for n in os.listdir(local / "data") if n.endswith(".tfrecord"))
    assert remote_parts == local_parts and remote_parts
    for name in remote_parts:  # the same records, byte for byte
        assert fs.read_bytes(f"{BUCKET}/data/{name}") == (local / "data" / name).read_bytes()

    # Pretrain in the bucket: stopped by SIGTERM after step 3, then resumed to the end.
    workdir = f"{BUCKET}/run"
    first = cli_process(pretrain_argv(f"{BUCKET}/data", workdir))
    output = run_until(first, "step 3/", lambda: first.send_signal(signal.SIGTERM))
    assert first.returncode == 143, output
    assert "preemption requested" in output, output
    assert not fs.exists(f"{workdir}/model/config.json")
    second = cli_process(pretrain_argv(f"{BUCKET}/data", workdir))
    output = run_until(second, "")
    assert second.returncode == 0, output
    assert "starting at step" in output and "from checkpoint gs://" in output, output
    assert not fs.exists(f"{workdir}/{workdir_lib.LOCK_NAME}")  # released
    rows = [json.loads(line) for line in fs.read_text(f"{workdir}/metrics.jsonl").splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "train"] == list(range(1, 9))
    assert any(n.startswith("events.out.tfevents") for n in fs.listdir(f"{workdir}/tensorboard"))
    assert fs.exists(f"{workdir}/model/config.json")

    # The same run on local disk, uninterrupted.
    outcome = run_cli(capsys, pretrain_argv(str(local / "data"), str(local / "run")))
    assert outcome.code == 0, outcome.err

    texts = str(corpus / "texts.txt")
    for model, out in ((workdir, f"{BUCKET}/features.npy"), (local / "run", local / "f.npy")):
        argv = ["encode", "--model", str(model), "--input", texts, "--output", str(out)]
        outcome = run_cli(capsys, argv)
        assert outcome.code == 0, outcome.err
    import io

    remote = np.load(io.BytesIO(fs.read_bytes(f"{BUCKET}/features.npy")))
    np.testing.assert_array_equal(remote, np.load(local / "f.npy"))


def test_workdir_lock_in_a_bucket_has_one_holder(emulator):
    workdir = f"{BUCKET}/locked"
    first = workdir_lib.WorkdirLock(workdir)
    first.acquire()
    try:
        holder = json.loads(fs.read_text(first.path))
        assert holder["pid"] == os.getpid()
        second = workdir_lib.WorkdirLock(workdir)
        second._is_stale = lambda holder: False  # another live run (same pid here)
        with pytest.raises(workdir_lib.WorkdirLockedError, match="gs://bert-jax-test/locked"):
            second.acquire()
    finally:
        first.release()
    assert not fs.exists(first.path)
    assert fs.create_exclusive(f"{workdir}/x", b"1") and not fs.create_exclusive(
        f"{workdir}/x", b"2"
    )
    assert fs.read_bytes(f"{workdir}/x") == b"1"


def test_overwrite_in_a_bucket_replaces_only_what_bert_jax_wrote(emulator, corpus, capsys):
    foreign = f"{BUCKET}/foreign"
    fs.write_text(f"{foreign}/notes.txt", "mine")
    argv = prepare_argv(f"{BUCKET}/corpus.txt", f"{BUCKET}/tok", foreign) + ["--overwrite"]
    outcome = run_cli(capsys, argv)
    assert outcome.code == 2 and foreign in outcome.message, outcome.err
    assert fs.read_text(f"{foreign}/notes.txt") == "mine"


def test_missing_bucket_is_one_line_naming_the_url(emulator, corpus, capsys):
    output = "gs://no-such-bucket-here/data"
    outcome = run_cli(capsys, prepare_argv(f"{BUCKET}/corpus.txt", f"{BUCKET}/tok", output))
    assert outcome.code == 2, outcome.err
    assert "gs://no-such-bucket-here" in outcome.message and "does not exist" in outcome.message
    assert "Traceback" not in outcome.err


def test_permission_refused_is_one_line_naming_the_url(emulator, corpus, capsys):
    output = f"gs://{gcs_emulator.FORBIDDEN_BUCKET}/data"
    outcome = run_cli(capsys, prepare_argv(f"{BUCKET}/corpus.txt", f"{BUCKET}/tok", output))
    assert outcome.code == 2, outcome.err
    assert (
        "permission denied" in outcome.message and gcs_emulator.FORBIDDEN_BUCKET in outcome.message
    )
    assert "Traceback" not in outcome.err


def test_no_credentials_is_one_line_naming_the_url(emulator, corpus, tmp_path):
    """No emulator, no Application Default Credentials: refused before any request is made."""
    env = {k: v for k, v in os.environ.items() if k not in emulator.env()}
    env.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
    env.update(
        PYTHONPATH=REPO,
        HOME=str(tmp_path),
        CLOUDSDK_CONFIG=str(tmp_path / "gcloud"),
        GCE_METADATA_HOST="127.0.0.1:9",  # no metadata server: not a Google Cloud VM
        GCE_METADATA_IP="127.0.0.1:9",
    )
    argv = ["encode", "--model", f"{BUCKET}/run", "--input", str(corpus / "texts.txt")]
    result = subprocess.run(
        [sys.executable, "-m", "bert_jax.cli", *argv, "--output", str(tmp_path / "f.npy")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert "no Google Cloud credentials" in last and "Traceback" not in result.stderr


def test_emulator_restart_keeps_the_bucket(emulator):
    fs.write_text(f"{BUCKET}/restart.txt", "kept")
    emulator.stop()
    emulator.start()
    assert fs.read_text(f"{BUCKET}/restart.txt") == "kept"


def test_transient_outage_is_retried_and_loses_no_checkpoint(emulator, corpus):
    """Cloud Storage answers 503 for a few seconds after step 3 (while a checkpoint is saved):
    every client retries, the run ends normally, with every checkpoint it saved."""
    workdir = f"{BUCKET}/outage"

    def outage():
        with emulator.outage():
            time.sleep(4)

    process = cli_process(pretrain_argv(f"{BUCKET}/data", workdir, total_steps=8, every=2))
    output = run_until(process, "step 3/", outage)
    assert process.returncode == 0, output
    steps = sorted(int(n) for n in fs.listdir(f"{workdir}/checkpoints") if n.isdigit())
    assert steps == [4, 6, 8], output  # keep=3 of 2, 4, 6, 8
    for step in steps:
        assert fs.exists(f"{workdir}/checkpoints/{step}/commit_success.txt")


def test_convert_reads_and_writes_model_directories_in_the_bucket(emulator, tmp_path, capsys):
    """A Google TF1 checkpoint in the bucket (read by TensorFlow's own GCS file system) converts
    into a bert-jax model directory in the bucket, that one into a Hugging Face directory in the
    bucket (safetensors read back in ranges): the params equal the same conversions on disk.
    `--overwrite` replaces only an earlier export of the same kind."""
    from bert_jax.training import load_model
    from tests.convert_fixtures import google_bert_config, tf1_arrays, write_tf1_checkpoint
    from tests.helpers import tiny_config

    config = tiny_config(hidden_act="gelu_new", num_hidden_layers=1)
    local_tf1 = str(tmp_path / "tf1")
    write_tf1_checkpoint(local_tf1, tf1_arrays(config, seed=5), google_bert_config(config), 512)
    fs.upload(local_tf1, f"{BUCKET}/tf1")

    steps = [
        (["tf1", f"{BUCKET}/tf1"], ["bert-jax", MODEL]),
        (["bert-jax", MODEL], ["hf", f"{BUCKET}/hf"]),
        (["hf", f"{BUCKET}/hf"], ["bert-jax", str(tmp_path / "back")]),
        (["tf1", local_tf1], ["bert-jax", str(tmp_path / "local")]),
    ]
    for source, target in steps:
        outcome = run_cli(capsys, ["convert", "--from", *source, "--to", *target])
        assert outcome.code == 0, outcome.err
    assert fs.exists(f"{BUCKET}/hf/bert_jax_export.json")
    assert fs.exists(f"{BUCKET}/hf/model.safetensors") and fs.exists(f"{BUCKET}/hf/vocab.txt")
    expected = load_model.load_model_dir(tmp_path / "local").params
    for path in (MODEL, tmp_path / "back"):
        loaded = load_model.load_model_dir(path, load_tokenizer=True)
        assert loaded.tokenizer.vocab_size <= 512
        for got, want in zip(jax_leaves(loaded.params), jax_leaves(expected)):
            np.testing.assert_array_equal(got, want)

    # --overwrite: an earlier export is replaced, a directory bert-jax did not write is not.
    argv = ["convert", "--from", "bert-jax", MODEL, "--to", "hf", f"{BUCKET}/hf", "--overwrite"]
    assert run_cli(capsys, argv).code == 0
    fs.write_text(f"{BUCKET}/theirs/notes.txt", "mine")
    argv[-2] = f"{BUCKET}/theirs"
    outcome = run_cli(capsys, argv)
    assert outcome.code == 2 and f"{BUCKET}/theirs" in outcome.message, outcome.err
    assert fs.listdir(f"{BUCKET}/theirs") == ["notes.txt"]
    assert not [n for n in fs.listdir(BUCKET) if n.startswith(".")]  # no hidden leftovers


SMALL_FLAGS = ["--epochs", "1", "--batch-size", "8", "--eval-batch-size", "8"]
SMALL_FLAGS += ["--max-seq-length", "32"]


def test_finetune_and_glue_read_and_write_the_bucket(emulator, tmp_path, capsys):
    """`glue` and `finetune` (CoNLL-2003) with the model, the data and the workdir in the
    bucket (the model `convert` wrote there): results, predictions, reports and plots (drawn
    locally, then uploaded) land in the bucket."""
    from tests.glue_fixtures.tiny import GLUE_DIR
    from tests.test_ner import CONLL_TEXT

    fs.upload(os.path.join(GLUE_DIR, "RTE"), f"{BUCKET}/glue/RTE")
    for name in ("eng.train", "eng.testa", "eng.testb"):
        fs.write_text(f"{BUCKET}/conll/{name}", CONLL_TEXT)

    workdir = f"{BUCKET}/glue_run"
    argv = ["glue", "--model", MODEL, "--data", f"{BUCKET}/glue", "--workdir", workdir]
    argv += ["--tasks", "RTE", "--learning-rates", "5e-5", "--seeds", "0", *SMALL_FLAGS]
    outcome = run_cli(capsys, argv)
    assert outcome.code == 0, outcome.err
    results = json.loads(fs.read_text(f"{workdir}/results.json"))
    assert set(results["tasks"]) == {"RTE"}
    assert results["protocol"]["model"] == MODEL
    assert fs.read_text(f"{workdir}/submission/RTE.tsv").startswith("index\tprediction\n")
    assert fs.read_bytes(f"{workdir}/plots/RTE.png").startswith(b"\x89PNG")
    assert fs.exists(f"{workdir}/trials/RTE/lr=5e-05_seed=0/result.json")

    workdir = f"{BUCKET}/ner_run"
    argv = ["finetune", "--model", MODEL, "--task", "conll2003", "--data", f"{BUCKET}/conll"]
    outcome = run_cli(capsys, [*argv, "--workdir", workdir, *SMALL_FLAGS])
    assert outcome.code == 0, outcome.err
    result = json.loads(fs.read_text(f"{workdir}/result.json"))
    assert result["model"] == MODEL and result["data"] == f"{BUCKET}/conll"
    assert fs.exists(f"{workdir}/dev_predictions.txt") and fs.exists(f"{workdir}/results.md")
    assert fs.read_bytes(f"{workdir}/plots/conll2003.png").startswith(b"\x89PNG")
    assert not [n for n in fs.listdir(workdir) if n.startswith(".")]  # no temporary files

    # A workdir bert-jax did not write is refused, naming it, and left as it was.
    fs.write_text(f"{BUCKET}/theirs_ft/notes.txt", "mine")
    outcome = run_cli(capsys, [*argv, "--workdir", f"{BUCKET}/theirs_ft", *SMALL_FLAGS])
    assert outcome.code == 2 and f"{BUCKET}/theirs_ft" in outcome.message, outcome.err
    assert fs.listdir(f"{BUCKET}/theirs_ft") == ["notes.txt"]


def _pretrain_here(capsys, argv) -> str:
    """`bert-jax pretrain` in this process; asserts exit 0 and returns all it printed."""
    from bert_jax import cli

    capsys.readouterr()
    code = cli.main(argv)
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert code == 0, out
    return out


def test_uncommitted_save_is_set_aside_and_resume_from_reads_the_bucket(emulator, capsys):
    """A save killed midway in a bucket leaves `<step>/` without commit_success.txt (written here
    by hand: the end-to-end run's step 8 copied without its marker, as a SIGKILL between the
    arrays and the marker leaves it). The next run sets it aside (never deleted), resumes by
    `config.resume_from` from another run's checkpoint in the bucket (the end-to-end run's step
    6 with its config.json: the same schedule), and saves step 8 again: Orbax's own listing of
    the bucket must not remember the step set aside."""
    source, workdir = f"{BUCKET}/run/checkpoints/8", f"{BUCKET}/killed"
    for path in fs.walk_files(source):
        if not path.endswith("/commit_success.txt"):
            fs.write_bytes(f"{workdir}/checkpoints/8" + path[len(source) :], fs.read_bytes(path))
    earlier = f"{BUCKET}/earlier"  # a run stopped at step 6
    for path in fs.walk_files(f"{BUCKET}/run/checkpoints/6"):
        fs.write_bytes(earlier + path[len(f"{BUCKET}/run") :], fs.read_bytes(path))
    fs.write_bytes(f"{earlier}/config.json", fs.read_bytes(f"{BUCKET}/run/config.json"))
    argv = pretrain_argv(f"{BUCKET}/data", workdir, total_steps=8, every=2)
    out = _pretrain_here(capsys, [*argv, f"--config.resume_from={earlier}"])
    assert "set aside checkpoint save(s) an interrupted run never committed" in out, out
    assert f"starting at step 6 from config.resume_from={earlier} step 6" in out, out
    names = fs.listdir(f"{workdir}/checkpoints")
    aside = [n for n in names if n.startswith("8.uncommitted-")]
    assert len(aside) == 1 and "8" in names and "6" not in names, names
    assert fs.exists(f"{workdir}/checkpoints/8/commit_success.txt")
    assert not fs.exists(f"{workdir}/checkpoints/{aside[0]}/commit_success.txt")
    rows = [json.loads(line) for line in fs.read_text(f"{workdir}/metrics.jsonl").splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "train"] == [7, 8]


def test_init_from_reads_a_model_directory_in_the_bucket(emulator, capsys):
    """`config.init_from` from the end-to-end run's exported model in the bucket: its parameters
    are read (shapes checked against the config) and the new run trains and checkpoints."""
    workdir = f"{BUCKET}/from_model"
    argv = pretrain_argv(f"{BUCKET}/data", workdir, total_steps=2, every=2)
    out = _pretrain_here(capsys, [*argv, f"--config.init_from={BUCKET}/run/model"])
    assert f"starting at step 0 from config.init_from={BUCKET}/run/model (params only)" in out, out
    rows = [json.loads(line) for line in fs.read_text(f"{workdir}/metrics.jsonl").splitlines()]
    train = [r for r in rows if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2]
    assert fs.exists(f"{workdir}/checkpoints/2/commit_success.txt")


def test_parquet_and_a_wikipedia_dump_from_the_bucket(emulator, corpus, tmp_path, capsys):
    """The paper's kinds of corpus, read from the bucket a batch of rows / a page at a time (the
    dump in chunks of streams, by two workers): the records equal those prepared from the same
    files on local disk in one process, and a damaged Parquet file in the bucket is one line
    naming its URL."""
    from bert_jax.data.sources import embedded as sources
    from tests.corpus_fixtures import wikipedia_dump_xml, write_multistream_bz2, write_parquet

    books = ["\n".join(document) for document in sources.embedded_documents("train")[:40]]
    names = ("enwiki-multistream1.xml-p1p9.bz2", "books.parquet")
    local = tmp_path / "corpus"
    local.mkdir()
    write_multistream_bz2(local / names[0], wikipedia_dump_xml())
    write_parquet(local / names[1], books)
    for name in names:
        fs.upload(str(local / name), f"{BUCKET}/wiki_books/{name}")
    tokenizer = str(corpus / "tok")
    argv = prepare_argv(f"{BUCKET}/wiki_books/{names[0]}", tokenizer, f"{BUCKET}/wiki_books_data")
    argv += ["--num-workers", "2"]  # the dump's streams read in chunks by the workers
    assert run_cli(capsys, [*argv[:4], f"{BUCKET}/wiki_books/{names[1]}", *argv[4:]]).code == 0
    argv = prepare_argv(str(local / names[0]), tokenizer, str(tmp_path / "data"))
    assert run_cli(capsys, [*argv[:4], str(local / names[1]), *argv[4:]]).code == 0
    parts = sorted(p.name for p in (tmp_path / "data").glob("part-*.tfrecord"))
    assert parts
    for name in parts:
        remote = fs.read_bytes(f"{BUCKET}/wiki_books_data/{name}")
        assert remote == (tmp_path / "data" / name).read_bytes()

    fs.write_bytes(f"{BUCKET}/wiki_books/damaged.parquet", b"PAR1" + b"\x00" * 64 + b"PAR1")
    argv = prepare_argv(f"{BUCKET}/wiki_books/damaged.parquet", tokenizer, f"{BUCKET}/damaged")
    outcome = run_cli(capsys, argv)
    assert outcome.code == 2, outcome.err
    assert f"{BUCKET}/wiki_books/damaged.parquet: not a readable Parquet file" in outcome.message
