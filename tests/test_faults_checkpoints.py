"""Fault battery (issue 17): damaged checkpoints and model directories, two runs on one workdir,
a full disk, what a killed run leaves behind, metrics rows of redone steps.

One tiny pretraining run (8 steps, checkpoints at 4 and 8, exported) is shared by the module; each
case damages a copy. Cases resume through `bert-jax pretrain` with `total_steps=4` where only the
restore matters (nothing is trained or compiled then).
"""

from __future__ import annotations

import errno
import glob
import os
import re
import shutil
import socket
import subprocess
import sys

import numpy as np
import pytest

from bert_jax import cli
from bert_jax.training import metric_writers, pretrain
from bert_jax.training import workdir as workdir_lib
from tests.faults import assert_user_error, run_cli, tree_digest
from tests.helpers import TINY_PRETRAIN_FLAGS
from tests.test_pretrain import ONE_PHASE, losses_by_step, sigterm_at, small_config

# A failed Orbax read's coroutines are collected after the test that caused them; the command
# itself prints nothing of them (checkpoint_health.read_or_problem).
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def run(shared_dirs, tmp_path_factory):
    """The shared run: its workdir (checkpoints 4 and 8, model/) and its losses by step."""
    workdir = str(tmp_path_factory.mktemp("faults_run") / "run")
    config = small_config(shared_dirs, total_steps=8, export_model=True, **ONE_PHASE)
    pretrain.pretrain(config, workdir)
    return workdir, losses_by_step(workdir)


def copy_run(run, tmp_path) -> str:
    workdir = str(tmp_path / "run")
    shutil.copytree(run[0], workdir, ignore=shutil.ignore_patterns("tensorboard"))
    return workdir


def pretrain_argv(shared_dirs, workdir, total_steps=4, **more) -> list[str]:
    """`bert-jax pretrain` with the shared run's config (small_config, one phase)."""
    values = {
        **TINY_PRETRAIN_FLAGS,
        "total_steps": total_steps,
        "data.tokenizer": shared_dirs["tokenizer"],
        "data.cache_dir": shared_dirs["cache"],
        "checkpoint.every_steps": 4,
        "log_every_steps": 1,
        "export_model": False,
        **more,
    }
    flags = [f"--config.{key}={value}" for key, value in values.items()]
    config_file = os.path.join(REPO, "configs", "bert.py")
    return ["pretrain", f"--config={config_file}:tiny", f"--workdir={workdir}", *flags]


def largest_file(pattern: str) -> str:
    return max(glob.glob(pattern, recursive=True), key=os.path.getsize)


def truncate(path: str, size: int | None = None) -> None:
    """Cuts a file to `size` bytes (default: half of it)."""
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2 if size is None else size)


def set_aside_dirs(workdir: str, step: int) -> list[str]:
    return glob.glob(os.path.join(workdir, "checkpoints", f"{step}.corrupt-*"))


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def warnings_about(caplog, step: int) -> list[str]:
    """The bert_jax log lines about checkpoint `step` (on stderr outside pytest)."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "bert_jax" and f"checkpoint step {step} " in r.getMessage()
    ]


def assert_fell_back(outcome, caplog, workdir, step, problem, before):
    """Exit 0; one log line naming the step, its problem and where it went; the damaged
    checkpoint moved unchanged, the earlier one untouched, no lock left."""
    assert outcome.code == 0, outcome.err[-3000:]
    (line,) = warnings_about(caplog, step)
    assert problem in line and "set aside as" in line and "resuming from step 4" in line, line
    assert "\n" not in line
    (aside,) = set_aside_dirs(workdir, step)
    assert tree_digest(aside) == before[str(step)]
    assert tree_digest(os.path.join(workdir, "checkpoints", "4")) == before["4"]
    assert not os.path.exists(os.path.join(workdir, workdir_lib.LOCK_NAME))


def checkpoint_digests(workdir):
    root = os.path.join(workdir, "checkpoints")
    return {name: tree_digest(os.path.join(root, name)) for name in os.listdir(root)}


# --- Damaged checkpoints on resume ---


def test_truncated_latest_checkpoint_resumes_from_the_one_before_exactly(
    run, shared_dirs, tmp_path, caplog
):
    """The step-8 array file cut in half: step 4 is used (state and data position), the run is
    the shared run's step for step, preempted once on the way (the lock goes with it), and
    metrics.jsonl holds each step once."""
    workdir = copy_run(run, tmp_path)
    truncate(largest_file(os.path.join(workdir, "checkpoints", "8", "state", "**", "d", "*")))
    before = checkpoint_digests(workdir)
    config = small_config(shared_dirs, total_steps=8, **ONE_PHASE)

    first = pretrain.pretrain(config, workdir, step_hook=sigterm_at(5))
    assert first.preempted and first.final_step == 6
    (line,) = warnings_about(caplog, 8)
    assert "OUT_OF_RANGE" in line and "/checkpoints/8/state/" in line, line
    assert not os.path.exists(os.path.join(workdir, workdir_lib.LOCK_NAME))
    (aside,) = set_aside_dirs(workdir, 8)
    assert tree_digest(aside) == before["8"]
    second = pretrain.pretrain(config, workdir)
    assert second.final_step == 8
    assert tree_digest(os.path.join(workdir, "checkpoints", "4")) == before["4"]

    rows = metric_writers.read_jsonl(os.path.join(workdir, "metrics.jsonl"), kind="train")
    assert [row["step"] for row in rows] == list(range(1, 9))
    got, expected = losses_by_step(workdir), run[1]
    assert [got[s] for s in range(1, 9)] == [expected[s] for s in range(1, 9)]


@pytest.mark.parametrize(
    "damage, problem",
    [
        ("state/_METADATA", "state/_METADATA is missing"),
        ("data/manifest.ocdbt", "data/manifest.ocdbt is missing"),
        ("state/ocdbt.process_0/d", "Error reading"),
        ("state/d", "state/ metadata cannot be read: no readable tree metadata"),
    ],
)
def test_damaged_latest_checkpoint_is_set_aside(
    run, shared_dirs, tmp_path, capsys, caplog, damage, problem
):
    workdir = copy_run(run, tmp_path)
    target = os.path.join(workdir, "checkpoints", "8", damage)
    if os.path.isdir(target):
        for name in os.listdir(target):
            os.remove(os.path.join(target, name))
    else:
        os.remove(target)
    before = checkpoint_digests(workdir)
    outcome = run_cli(capsys, pretrain_argv(shared_dirs, workdir))
    assert_fell_back(outcome, caplog, workdir, 8, problem, before)
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints")))[0] == "4"


def test_checkpoint_of_other_shapes_is_set_aside(run, shared_dirs, tmp_path, capsys, caplog):
    """A newer checkpoint whose params have other shapes than the run's model (here: another
    hidden size, saved at step 12) is found from its metadata alone."""
    import jax

    from bert_jax.core import optim, partitioning
    from bert_jax.core.trainer import ShardedTrainer
    from bert_jax.training import checkpointing, config_lib, data_position

    workdir = copy_run(run, tmp_path)
    config = small_config(shared_dirs, total_steps=8, **ONE_PHASE)
    config.model.hidden_size, config.model.intermediate_size = 32, 64
    mesh = partitioning.make_mesh(config.mesh.shape)
    tx, _ = optim.from_config(config.optimizer, [8], [config.phase1])
    # Zeros in the state's shapes and shardings: only the metadata is read (an init compiles).
    abstract = ShardedTrainer(config_lib.bert_config(config), tx, mesh).abstract_state()
    other = jax.tree.map(
        lambda leaf: jax.device_put(np.zeros(leaf.shape, leaf.dtype), leaf.sharding), abstract
    )
    saver = checkpointing.Checkpointer(os.path.join(workdir, "checkpoints"), async_save=False)
    saver.save(12, other, data_position.encode_position(0, None, mesh))
    saver.close()
    before = checkpoint_digests(workdir)

    outcome = run_cli(capsys, pretrain_argv(shared_dirs, workdir))
    assert outcome.code == 0, outcome.err[-3000:]
    (line,) = warnings_about(caplog, 12)
    assert "LayerNorm/bias has shape (32,) but the run's config implies (64,)" in line, line
    assert "set aside as" in line
    (aside,) = set_aside_dirs(workdir, 12)
    assert tree_digest(aside) == before["12"]
    assert tree_digest(os.path.join(workdir, "checkpoints", "8")) == before["8"]


def test_resume_from_a_run_with_a_damaged_latest_checkpoint(
    run, shared_dirs, tmp_path, capsys, caplog
):
    """`config.resume_from` another run: its newest intact checkpoint is used, and nothing of
    that run is moved or changed."""
    source = copy_run(run, tmp_path)
    os.remove(os.path.join(source, "checkpoints", "8", "state", "_METADATA"))
    before = tree_digest(source)
    workdir = str(tmp_path / "continued")
    argv = pretrain_argv(shared_dirs, workdir, **{"resume_from": source})
    outcome = run_cli(capsys, argv)
    assert outcome.code == 0, outcome.err[-3000:]
    (line,) = warnings_about(caplog, 8)
    assert "state/_METADATA is missing" in line and "using step 4" in line, line
    assert tree_digest(source) == before


def test_no_intact_checkpoint_is_exit_2_and_changes_nothing(run, shared_dirs, tmp_path, capsys):
    workdir = copy_run(run, tmp_path)
    os.remove(os.path.join(workdir, "checkpoints", "8", "state", "_METADATA"))
    truncate(largest_file(os.path.join(workdir, "checkpoints", "4", "state", "**", "d", "*")))
    before = tree_digest(os.path.join(workdir, "checkpoints"))
    outcome = run_cli(capsys, pretrain_argv(shared_dirs, workdir))
    assert_user_error(
        outcome,
        "no checkpoint in",
        "step 8: state/_METADATA is missing",
        "step 4:",
        only_line=False,
    )
    assert tree_digest(os.path.join(workdir, "checkpoints")) == before
    assert not os.path.exists(os.path.join(workdir, workdir_lib.LOCK_NAME))


def test_changed_model_config_is_exit_2_naming_the_settings(run, shared_dirs, tmp_path, capsys):
    """Another model size on a workdir with checkpoints: the checkpoints are fine, the config
    changed. The refusal names the differing settings (read from the workdir's config.json) and
    how to go on, before anything compiles; nothing in the workdir changes, config.json included."""
    workdir = copy_run(run, tmp_path)
    before = tree_digest(workdir)
    argv = pretrain_argv(shared_dirs, workdir, **{"model.intermediate_size": 96})
    outcome = run_cli(capsys, argv)
    assert_user_error(
        outcome,
        f"--workdir {workdir} holds checkpoints of another model",
        "config.model.intermediate_size=96 here, 128 there",
        os.path.join(workdir, "config.json"),
        "use another --workdir",
        "run with the workdir's model settings",
    )
    assert "step 8" not in outcome.message  # not reported as damaged checkpoints
    assert tree_digest(workdir) == before


# --- One writer per workdir ---


def write_lock(workdir, host, pid, started="2026-01-01T00:00:00+00:00"):
    lock = os.path.join(workdir, workdir_lib.LOCK_NAME)
    with open(lock, "w", encoding="utf-8") as f:
        f.write(f'{{"host": "{host}", "pid": {pid}, "started": "{started}"}}\n')
    return lock


def test_second_run_on_a_workdir_is_refused_naming_the_holder(run, shared_dirs, tmp_path, capsys):
    workdir = copy_run(run, tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        write_lock(workdir, socket.gethostname(), holder.pid)
        before = tree_digest(workdir)
        outcome = run_cli(capsys, pretrain_argv(shared_dirs, workdir))
    finally:
        holder.kill()
        holder.wait()
    assert_user_error(
        outcome, workdir, f"pid {holder.pid}", socket.gethostname(), "2026-01-01T00:00:00"
    )
    assert tree_digest(workdir) == before


def test_lock_held_on_another_host_is_refused_with_the_file_to_delete(
    run, shared_dirs, tmp_path, capsys
):
    workdir = copy_run(run, tmp_path)
    lock = write_lock(workdir, "other-host.example", 4242)
    before = tree_digest(workdir)
    outcome = run_cli(capsys, pretrain_argv(shared_dirs, workdir))
    assert_user_error(outcome, "host other-host.example, pid 4242", f"delete {lock}")
    assert tree_digest(workdir) == before


def test_stale_lock_is_taken_over_and_leftovers_are_removed(run, shared_dirs, tmp_path, capsys):
    """A killed run's lock (its pid gone), Orbax temporary save directories and export
    leftovers go; files that only look alike stay."""
    workdir = copy_run(run, tmp_path)
    write_lock(workdir, socket.gethostname(), dead_pid())
    leftovers = [
        os.path.join(workdir, "checkpoints", "12.orbax-checkpoint-tmp-1795598774"),
        os.path.join(workdir, "checkpoints", "16.orbax-checkpoint-tmp"),
        os.path.join(workdir, ".model.tmp-0a1b2c3d"),
        os.path.join(workdir, ".model.old-0a1b2c3d"),  # model/ is in place
    ]
    lookalikes = [
        os.path.join(workdir, "checkpoints", "notes.orbax-checkpoint-tmp-1"),
        os.path.join(workdir, "checkpoints", "12.orbax-checkpoint-tmp-mine"),
        os.path.join(workdir, ".model.tmp-mine"),
        os.path.join(workdir, "model.tmp-0a1b2c3d"),
    ]
    for path in leftovers + lookalikes:
        os.makedirs(path)
        with open(os.path.join(path, "x"), "w") as f:
            f.write("x")
    keep = {p: tree_digest(p) for p in lookalikes + [os.path.join(workdir, "checkpoints", "8")]}
    outcome = run_cli(capsys, pretrain_argv(shared_dirs, workdir))
    assert outcome.code == 0, outcome.err[-3000:]
    assert not [p for p in leftovers if os.path.exists(p)]
    assert {p: tree_digest(p) for p in keep} == keep
    assert not os.path.exists(os.path.join(workdir, workdir_lib.LOCK_NAME))


def test_unreadable_lock_is_refused_while_fresh_then_taken_over(tmp_path):
    lock_path = tmp_path / workdir_lib.LOCK_NAME
    lock_path.write_text("")  # another run between creating and writing it, or a crash there
    with pytest.raises(workdir_lib.WorkdirLockedError, match=str(lock_path)):
        workdir_lib.WorkdirLock(tmp_path).acquire()
    assert lock_path.read_text() == ""
    os.utime(lock_path, (0, 0))  # long ago: a crash while writing it
    with workdir_lib.WorkdirLock(tmp_path) as lock:
        assert f'"pid": {os.getpid()}' in lock_path.read_text()
    assert not lock.held and not lock_path.exists()


def test_lock_is_released_on_an_exception(tmp_path):
    with pytest.raises(RuntimeError), workdir_lib.WorkdirLock(tmp_path) as lock:
        assert lock.held and os.path.exists(lock.path)
        raise RuntimeError("boom")
    assert not os.path.exists(tmp_path / workdir_lib.LOCK_NAME)


# --- A full disk ---


def test_disk_full_during_a_save_is_one_line_and_keeps_the_last_checkpoint(
    run, shared_dirs, tmp_path, capsys, monkeypatch
):
    from orbax.checkpoint._src.path import async_path

    workdir = copy_run(run, tmp_path)
    # Resumed at step 4 (a finished run is not resumed on a longer schedule), so step 8 is saved.
    shutil.rmtree(os.path.join(workdir, "checkpoints", "8"))
    original = async_path.write_text

    async def full_disk(path, text):
        if "orbax-checkpoint-tmp" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return await original(path, text)

    monkeypatch.setattr(async_path, "write_text", full_disk)
    before = tree_digest(os.path.join(workdir, "checkpoints", "4"))
    outcome = run_cli(capsys, pretrain_argv(shared_dirs, workdir, total_steps=8))
    assert_user_error(
        outcome,
        "no space left on device saving checkpoint step 8",
        "_METADATA",
        "the previous checkpoint, step 4, is intact",
        only_line=False,
    )
    assert "Traceback" not in outcome.err and len(outcome.err.splitlines()) < 10, outcome.err
    assert tree_digest(os.path.join(workdir, "checkpoints", "4")) == before
    assert not os.path.exists(os.path.join(workdir, workdir_lib.LOCK_NAME))


# A process whose TensorStore writes of step 6's train state fail as on a full disk: each is
# written, then fails with ENOSPC, one after the other within half a second (a real disk fails
# the OCDBT batch's writes together; their callbacks race the first failure).
FULL_DISK_DURING_STEP_6 = """
import errno, itertools, sys, threading
import tensorstore as ts
from bert_jax import cli

write, order = ts.TensorStore.write, itertools.count()

def full_disk(self, *args, **kwargs):
    pending = write(self, *args, **kwargs)
    if "/6.orbax-checkpoint-tmp/state" not in str(self.kvstore):
        return pending
    promise, failing = ts.Promise.new()
    def fail():
        pending.exception()
        promise.set_exception(OSError(errno.ENOSPC, "No space left on device"))
    threading.Timer(0.2 + 0.005 * next(order), fail).start()
    return failing

ts.TensorStore.write = full_disk
sys.exit(cli.main(sys.argv[1:]))
"""


def test_disk_full_run_prints_only_its_line_and_resumes_exactly(run, shared_dirs, tmp_path, capsys):
    """Issue 36 item 4. A save's writes still in flight when one fails used to end on the event
    loop Orbax had closed meanwhile: one `RuntimeError: Event loop is closed` traceback each
    on the run's stderr. Step 6's asynchronous save fails while steps 7 and 8 train; the save
    of step 8 reports it, naming step 6 (not 8) and step 4 as the intact one. Run as a user runs
    it (its own process, stderr as it is), then again on the freed disk: it resumes from step 4
    and trains the shared run's steps exactly."""
    workdir = copy_run(run, tmp_path)
    shutil.rmtree(os.path.join(workdir, "checkpoints", "8"))
    before = tree_digest(os.path.join(workdir, "checkpoints", "4"))
    argv = pretrain_argv(shared_dirs, workdir, total_steps=8, **{"checkpoint.every_steps": 2})
    env = {**os.environ, "PYTHONPATH": REPO}
    failed = subprocess.run(
        [sys.executable, "-c", FULL_DISK_DURING_STEP_6, *argv],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert failed.returncode == 2, failed.stderr[-3000:]
    assert "Traceback" not in failed.stderr, failed.stderr[-3000:]
    assert "Event loop is closed" not in failed.stderr, failed.stderr[-3000:]
    # Aside from the C++ runtimes' start-up lines (absl: "I0000 ...", "WARNING: All log messages
    # before absl::InitializeLog() ..."), the one line: no Orbax warning on the restore either.
    noise = r"[IWEF]\d{4} |WARNING: All log messages before absl"
    ours = [line for line in failed.stderr.splitlines() if not re.match(noise, line)]
    assert len(ours) == 1, failed.stderr[-3000:]
    assert ours[0].startswith("bert-jax pretrain: error: no space left on device saving "), ours
    assert "checkpoint step 6 " in ours[0], ours
    assert "the previous checkpoint, step 4, is intact" in ours[0], ours
    assert tree_digest(os.path.join(workdir, "checkpoints", "4")) == before

    capsys.readouterr()
    assert cli.main(argv) == 0
    assert "starting at step 4 from checkpoint" in capsys.readouterr().out
    assert losses_by_step(workdir) == run[1]


# --- Damaged model directories: encode, convert, finetune ---


@pytest.fixture
def texts(tmp_path):
    path = tmp_path / "texts.txt"
    path.write_text("a sentence\nanother one\n", encoding="utf-8")
    return str(path)


def test_encode_with_a_truncated_params_file(run, tmp_path, capsys, texts):
    model = str(tmp_path / "model")
    shutil.copytree(os.path.join(run[0], "model"), model)
    truncate(largest_file(os.path.join(model, "params", "**", "d", "*")))
    before = tree_digest(tmp_path)
    out = str(tmp_path / "out.npy")
    outcome = run_cli(capsys, ["encode", "--model", model, "--input", texts, "--output", out])
    assert_user_error(outcome, f"cannot read the saved params in {model}/params", "Error reading")
    assert tree_digest(tmp_path) == before


def test_convert_with_missing_params_metadata(run, tmp_path, capsys):
    model = str(tmp_path / "model")
    shutil.copytree(os.path.join(run[0], "model"), model)
    os.remove(os.path.join(model, "params", "_METADATA"))
    before = tree_digest(tmp_path)
    argv = ["convert", "--from", "bert-jax", model, "--to", "hf", str(tmp_path / "hf")]
    outcome = run_cli(capsys, argv)
    assert_user_error(outcome, f"{model}/params")
    assert tree_digest(tmp_path) == before


def test_finetune_with_a_truncated_config_json(run, tmp_path, capsys):
    model = str(tmp_path / "model")
    shutil.copytree(os.path.join(run[0], "model"), model)
    truncate(os.path.join(model, "config.json"))
    before = tree_digest(tmp_path)
    data = os.path.join(REPO, "tests", "glue_fixtures")
    argv = ["finetune", "--task", "glue/RTE", "--model", model, "--data", data]
    outcome = run_cli(capsys, [*argv, "--workdir", str(tmp_path / "ft")])
    assert_user_error(outcome, f"{model}/config.json is damaged", only_line=False)
    assert tree_digest(tmp_path) == before


def test_finetune_with_a_truncated_params_file(run, tmp_path, capsys):
    """finetune reads the params while its first step compiles (after the data and the stored
    tree's check): a damaged array file is still one line naming the params, and the run's
    workdir keeps nothing of the run."""
    model = str(tmp_path / "model")
    shutil.copytree(os.path.join(run[0], "model"), model)
    truncate(largest_file(os.path.join(model, "params", "**", "d", "*")))
    before = tree_digest(tmp_path)
    data = os.path.join(REPO, "tests", "glue_fixtures")
    argv = ["finetune", "--task", "glue/RTE", "--model", model, "--data", data]
    outcome = run_cli(capsys, [*argv, "--workdir", str(tmp_path / "ft"), "--max-seq-length", "32"])
    assert_user_error(outcome, f"cannot read the saved params in {model}/params", "Error reading")
    assert tree_digest(tmp_path) == before


def test_encode_from_a_workdir_with_a_damaged_checkpoint(run, tmp_path, capsys, texts):
    workdir = copy_run(run, tmp_path)
    shutil.rmtree(os.path.join(workdir, "model"))  # unexported: the latest checkpoint is read
    for path in glob.glob(os.path.join(workdir, "checkpoints", "8", "state", "*", "d", "*")):
        truncate(path, 16)  # every array file of the process (the params among them)
    before = tree_digest(tmp_path)
    out = str(tmp_path / "out.npy")
    outcome = run_cli(capsys, ["encode", "--model", workdir, "--input", texts, "--output", out])
    assert_user_error(outcome, "checkpoint step 8", os.path.join(workdir, "checkpoints"))
    assert tree_digest(tmp_path) == before


# --- metrics.jsonl after a resume ---


def test_metrics_rows_after_the_resumed_step_are_dropped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "kind": k} for s in range(1, 7) for k in ("train", "eval")]
    writer = metric_writers.MetricWriter(str(tmp_path), tensorboard=False)
    for row in rows:
        writer.write(row["step"], {}, kind=row["kind"])
    writer.close()
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"step": 7, "kind": "tr')  # a killed run's torn last line
    assert metric_writers.drop_rows_after(str(path), 4) == 5
    assert [(r["step"], r["kind"]) for r in metric_writers.read_jsonl(str(path))] == [
        (r["step"], r["kind"]) for r in rows if r["step"] <= 4
    ]
    kept = tree_digest(path)
    assert metric_writers.drop_rows_after(str(path), 4) == 0
    assert tree_digest(path) == kept
