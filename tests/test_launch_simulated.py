"""`launch tpu up --watch` against the stand-in gcloud (tests/fake_gcloud.py), end to end
(marker `launch`: `make test-launch`, run by .ci/run).

The stand-in's TPU VM has 2 workers, each a local process with 4 CPU devices joined through
jax.distributed over localhost; the workdir is in the local Cloud Storage emulator. The
supervisor runs as `bert-jax launch tpu up --watch` in a child process, while the test plays
the cloud: it preempts the slice, stops a worker with SIGSTOP (a hang) or kills one (a crash)
when the heartbeats say a chosen step was reached. Shown: a run with two preemptions, a hang
and a failure ends with the same model as an uninterrupted run, only the steps after each last
checkpoint redone, each event in events.jsonl and `launch tpu status` printing goodput and
badput by cause; failures past --max-failures stop with the log's last lines; exit status 2 is
not retried. The uninterrupted run has a flaky gcloud (every third describe fails with an
auth-token refresh error): nothing is created, deleted or restarted because of it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from bert_jax.launch import events, workdir_state
from bert_jax.runtime import fs, heartbeat
from tests import fake_gcloud, gcs_emulator
from tests.helpers import TINY_PRETRAIN_FLAGS

pytestmark = pytest.mark.launch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUCKET = "gs://bert-jax-launch-test"
NAME = "bert-sim"
TOTAL_STEPS = 40
EVERY = 4  # checkpoint every 4 steps
RUN_TIMEOUT = 600
STALL_TIMEOUT = 15  # the chaos run's --stall-timeout
# A wedged worker (SIGSTOP) makes JAX's coordination service abort the others (exit 134) as soon
# as half the heartbeat timeout later (bert_jax/runtime/distributed.py). The supervisor must see
# the hang first, as a stall: past STALL_TIMEOUT plus a poll that takes seconds under load.
HEARTBEAT_TIMEOUT = 6 * STALL_TIMEOUT


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    with gcs_emulator.running(tmp_path_factory.mktemp("gcs")) as running:
        running.create_bucket(BUCKET[len("gs://") :])
        yield running


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    from bert_jax.data.sources import embedded as sources
    from bert_jax.data.tokenizers.sentencepiece import train_sentencepiece

    root = tmp_path_factory.mktemp("launch_tokenizer")
    text = root / "corpus.txt"
    with open(text, "w", encoding="utf-8") as f:
        for document in sources.embedded_documents("train"):
            f.write("\n".join(document) + "\n\n")
    train_sentencepiece([str(text)], 1000, str(root / "tokenizer"), lowercase=True)
    return str(root / "tokenizer")


@pytest.fixture(scope="module")
def cloud(emulator, tokenizer_dir, tmp_path_factory):
    """The stand-in gcloud first on PATH (for the supervisor's process), its state file, and
    what every worker gets: the emulator's settings and a shared JAX compilation cache."""
    root = tmp_path_factory.mktemp("fake_cloud")
    state = str(root / "state.json")
    cache = os.path.join(os.environ.get("TMPDIR", "/tmp"), "bert_jax_test_jax_cache")
    worker_env = {
        **emulator.env(),
        "JAX_COMPILATION_CACHE_DIR": cache,
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    fake_gcloud.new_state(state, str(root / "nodes"), worker_env=worker_env, queue_polls=2)
    env = {**os.environ, **fake_gcloud.install(str(root / "bin"), state), "PYTHONPATH": REPO}
    yield {"state": state, "env": env, "root": str(root), "tokenizer": tokenizer_dir}
    fake_gcloud.kill_everything(str(root / "nodes"))


def pretrain_args(cloud, workdir: str, **overrides) -> list[str]:
    values = {
        **TINY_PRETRAIN_FLAGS,
        "total_steps": TOTAL_STEPS,
        "checkpoint.every_steps": EVERY,
        # Saves in the loop, so that the test can land a fault while none is in flight (below).
        "checkpoint.async_save": False,
        "log_every_steps": 1,
        "data.tokenizer": cloud["tokenizer"],
        "data.cache_dir": os.path.join(cloud["root"], "data_cache"),
        **overrides,
    }
    flags = [f"--config.{key}={value}" for key, value in values.items()]
    return ["--config", "configs/bert.py:tiny", "--workdir", workdir, "--heartbeat-timeout",
            str(HEARTBEAT_TIMEOUT), *flags]  # fmt: skip


def start_supervisor(cloud, workdir: str, *watch_flags, **overrides) -> subprocess.Popen:
    argv = [
        *(sys.executable, "-m", "bert_jax.cli", "launch", "tpu", "up", "--watch"),
        *("--name", NAME, "--zone", "fake-zone-a", "--accelerator-type", "v4-16", "--spot"),
        *("--source", REPO, "--jax-spec", "jax[tpu]", "--skip-preflight", "--no-stream"),
        *("--poll", "0.5", "--stop-grace", "3", "--startup-timeout", "180"),
        *("--env", "BERT_JAX_HEARTBEAT_SECONDS=0.5", "--env", "BERT_JAX_LOG_COPY_SECONDS=2"),
        *watch_flags,
        "--",
        *pretrain_args(cloud, workdir, **overrides),
    ]
    return subprocess.Popen(
        argv,
        cwd=REPO,
        env=cloud["env"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(process: subprocess.Popen) -> tuple[int, str]:
    try:
        output, _ = process.communicate(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        raise AssertionError(f"the supervisor did not finish:\n{output[-6000:]}") from None
    return process.returncode, output


class Chaos:
    """Plays the cloud: the plan's faults in order, each on a later attempt than the one before,
    once its step is reached. A fault lands only while no checkpoint save is in flight (the
    newest checkpoint is the last multiple of EVERY): the test is about the supervisor. (Cut
    short in the emulator, a first save of a 2-process run left a step that the next attempt's
    save of that step tripped over in Orbax's rmtree; that is the checkpoint layer's.)"""

    def __init__(self, cloud, workdir: str, plan: list[tuple[int, str]]):
        self.cloud, self.workdir, self.plan = cloud, workdir, list(plan)
        self.done: list[tuple[int, int, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        state = self.cloud["state"]
        last_attempt = 0
        while self.plan and not self._stop.is_set():
            time.sleep(0.1)
            at_step, what = self.plan[0]
            beats = heartbeat.read_all(self.workdir)
            attempt = max((h.get("attempt", 0) for h in beats), default=0)
            beats = [h for h in beats if h.get("attempt") == attempt]
            step = max((h["step"] for h in beats), default=-1)
            if attempt <= last_attempt or len(beats) != 2 or step < at_step:
                continue
            if any(h["state"] != "running" for h in beats):
                continue
            if (workdir_state.latest_checkpoint(self.workdir) or 0) != step // EVERY * EVERY:
                continue  # a save in flight
            try:
                if what == "preempt":
                    fake_gcloud.preempt(state, NAME)
                elif what == "hang":
                    fake_gcloud.hang(state, NAME, worker=1)
                elif what == "crash":
                    fake_gcloud.kill_worker(state, NAME, worker=1)
            except (OSError, KeyError) as err:  # the worker is between runs: next look
                print(f"chaos: {what} at attempt {attempt} not yet possible: {err}")
                continue
            self.done.append((attempt, step, what))
            self.plan.pop(0)
            last_attempt = attempt

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def exported_params(workdir: str) -> list[np.ndarray]:
    import jax

    from bert_jax.training import load_model

    return [
        np.asarray(x) for x in jax.tree.leaves(load_model.load_model_dir(f"{workdir}/model").params)
    ]


def status(cloud, workdir: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "bert_jax.cli", "launch", "tpu", "status", "--workdir", workdir],
        cwd=REPO,
        env=cloud["env"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def kinds(rows) -> list[str]:
    return [r["event"] for r in without_watching(rows)]


def without_watching(rows) -> list[dict]:
    return [r for r in rows if r["event"] not in ("watching", "stopped-watching")]


@pytest.fixture(scope="module")
def uninterrupted(cloud):
    """The run with nothing in its way but a flaky gcloud (every third describe, of the queued
    resource or the TPU VM, fails with an auth-token refresh error, exit status 1): its model is
    what every interrupted run must equal."""
    workdir = f"{BUCKET}/uninterrupted"
    started = time.monotonic()
    before = fake_gcloud.read(cloud["state"])
    fake_gcloud.flaky(cloud["state"], "describe", every=3, error="auth")
    try:
        code, output = finish(start_supervisor(cloud, workdir))
    finally:
        fake_gcloud.flaky(cloud["state"], "describe", every=0)
    took = time.monotonic() - started
    assert code == 0, output[-6000:]
    print(f"uninterrupted run under the supervisor: {took:.0f} s")
    state = fake_gcloud.read(cloud["state"])
    return {"workdir": workdir, "params": exported_params(workdir), "seconds": took,
            "output": output, "calls": state["calls"][len(before["calls"]) :],
            "injected": state["injected"] - before["injected"]}  # fmt: skip


def test_an_uninterrupted_run_under_the_supervisor(cloud, uninterrupted):
    print(uninterrupted["output"])
    rows = events.read(uninterrupted["workdir"])
    print("\n".join(json.dumps(r) for r in rows))
    assert kinds(rows) == ["queued", "active", "started", "running", "finished", "deleted"]
    # The flaky describes were met and said, and changed nothing: one create, one start.
    assert uninterrupted["injected"] >= 3, uninterrupted["injected"]
    assert "its state is unknown, not absent" in uninterrupted["output"]
    verbs = [c[2:4] for c in uninterrupted["calls"] if c[:2] == ["compute", "tpus"]]
    assert verbs.count(["queued-resources", "create"]) == 1
    assert verbs.count(["queued-resources", "delete"]) == 1
    rows = without_watching(rows)
    assert rows[3]["start_step"] == 0 and rows[4]["step"] == TOTAL_STEPS
    state = fake_gcloud.read(cloud["state"])
    assert NAME not in state["nodes"] and state["violations"] == []
    text = status(cloud, uninterrupted["workdir"])
    print(text)
    assert "restarts by cause: preempted 0, stalled 0, failed 0" in text
    assert "goodput:" in text and "waiting for capacity" in text
    logs = fs.listdir(f"{uninterrupted['workdir']}/launch/logs")
    assert logs == ["attempt-1-process-0.log", "attempt-1-process-1.log"]
    # A bucket prefix with nothing under it is a typo, not a run without checkpoints.
    typo = subprocess.run(
        [sys.executable, "-m", "bert_jax.cli", "launch", "tpu", "status", "--workdir",
         f"{BUCKET}/uninterupted"], cwd=REPO, env=cloud["env"], capture_output=True, text=True,
    )  # fmt: skip
    assert typo.returncode == 2 and "does not exist (no object in the bucket under it)" in (
        typo.stderr
    ), typo.stderr


def test_two_preemptions_a_hang_and_a_failure_end_with_the_same_model(cloud, uninterrupted):
    """The issue's "done when": the same model as the uninterrupted run, only the steps after
    each last checkpoint redone, every event recorded, status with goodput and badput."""
    workdir = f"{BUCKET}/chaos"
    plan = [(6, "preempt"), (14, "hang"), (22, "crash"), (30, "preempt")]
    started = time.monotonic()
    supervisor = start_supervisor(cloud, workdir, "--stall-timeout", str(STALL_TIMEOUT))
    chaos = Chaos(cloud, workdir, plan)
    try:
        code, output = finish(supervisor)
    finally:
        chaos.stop()
    took = time.monotonic() - started
    rows = events.read(workdir)
    print(output)
    print("\n".join(json.dumps(r) for r in rows))
    assert code == 0, output[-6000:]
    assert [what for _, _, what in chaos.done] == ["preempt", "hang", "crash", "preempt"], (
        chaos.done,
        output[-4000:],
    )
    rows = events.read(workdir)
    print("\n".join(json.dumps(r) for r in rows))
    expected = ["queued", "active", "started", "running", "preempted", "queued", "active",
                "started", "running", "stalled", "restarted", "running", "failed", "restarted",
                "running", "preempted", "queued", "active", "started", "running", "finished",
                "deleted"]  # fmt: skip
    assert kinds(rows) == expected, output[-4000:]
    # Nothing redone but the steps after each last checkpoint: every attempt resumed from the
    # checkpoint that was the latest when the one before it ended.
    ends = [r for r in rows if r["event"] in ("preempted", "stalled", "failed")]
    runs = [r for r in rows if r["event"] == "running"]
    assert [r["start_step"] for r in runs] == [0] + [r["checkpoint"] or 0 for r in ends]
    assert all((r["checkpoint"] or 0) % EVERY == 0 and r["step"] >= (r["checkpoint"] or 0)
               for r in ends)  # fmt: skip
    failed = next(r for r in rows if r["event"] == "failed")
    assert failed["last_lines"], "the failure's log lines are kept"
    stalled = next(r for r in rows if r["event"] == "stalled")
    assert "no new step" in stalled["reason"]
    # Caught within the stall timeout of the last step, plus a heartbeat and a poll.
    assert stalled["time"] - stalled["step_time"] < STALL_TIMEOUT + 5
    # The same model, to the last bit.
    params = exported_params(workdir)
    gap = max(float(np.max(np.abs(a - b))) for a, b in zip(params, uninterrupted["params"]))
    assert gap == 0.0, gap
    state = fake_gcloud.read(cloud["state"])
    assert state["violations"] == [] and NAME not in state["nodes"]
    text = status(cloud, workdir)
    print(text)
    print(f"simulated run with 2 preemptions, a hang and a failure: {took:.0f} s "
          f"(uninterrupted: {uninterrupted['seconds']:.0f} s)")  # fmt: skip
    assert "restarts by cause: preempted 2, stalled 1, failed 1" in text
    accounting = events.account(rows)
    for cause in ("capacity", "startup", "lost", "stall"):
        assert accounting.badput[cause] > 0, cause
    assert accounting.redone_steps == sum(r["step"] - (r["checkpoint"] or 0) for r in ends)
    assert accounting.productive + sum(accounting.badput.values()) == pytest.approx(accounting.wall)
    for name in events.CAUSES.values():
        assert name in text
    logs = fs.listdir(f"{workdir}/launch/logs")
    assert {f"attempt-{a}-process-{p}.log" for a in range(1, 6) for p in (0, 1)} <= set(logs)


def test_failures_past_the_limit_stop_with_the_log_and_exit_2_is_not_retried(cloud):
    """A job that fails every time (a worker crashes at its first steps) is restarted
    --max-failures times, then the supervisor stops (exit 1) with the log's last lines; a
    job that exits 2 (a user error) is never restarted."""
    workdir = f"{BUCKET}/failing"
    plan = [(1, "crash"), (1, "crash")]
    supervisor = start_supervisor(cloud, workdir, "--max-failures", "1", "--keep")
    chaos = Chaos(cloud, workdir, plan)
    try:
        code, output = finish(supervisor)
    finally:
        chaos.stop()
    assert code == 1, output[-4000:]
    assert "gave up" in output and "--max-failures 1 spent" in output
    assert "the log's last lines" in output
    rows = events.read(workdir)
    assert kinds(rows)[-1] == "gave-up", kinds(rows)
    assert kinds(rows).count("failed") == 2 and kinds(rows).count("restarted") == 1
    assert NAME in fake_gcloud.read(cloud["state"])["nodes"]  # --keep
    assert "restarts by cause: preempted 0, stalled 0, failed 2" in status(cloud, workdir)

    # On the slice kept above: a user error (a config key that does not exist) -> exit 2, once.
    workdir = f"{BUCKET}/user-error"
    code, output = finish(start_supervisor(cloud, workdir, **{"optimizer.learning_rat": "0.1"}))
    assert code == 2, output[-4000:]
    rows = without_watching(events.read(workdir))
    assert kinds(rows) == ["started", "failed", "gave-up", "deleted"], kinds(rows)
    assert "not retried" in rows[1]["reason"]
    assert any("learning_rat" in line for line in rows[1]["last_lines"])

    # The same through a TPU VM created directly (--no-queued): created, started once, deleted.
    workdir = f"{BUCKET}/user-error-vm"
    flags = ("--name", "bert-sim-vm", "--no-queued")
    code, output = finish(
        start_supervisor(cloud, workdir, *flags, **{"optimizer.learning_rat": "0"})
    )
    assert code == 2, output[-4000:]
    assert kinds(events.read(workdir)) == ["queued", "active", "started", "failed", "gave-up",
                                           "deleted"]  # fmt: skip
    state = fake_gcloud.read(cloud["state"])
    assert "bert-sim-vm" not in state["nodes"] and "bert-sim-vm" not in state["resources"]
    assert ["compute", "tpus", "tpu-vm", "create", "bert-sim-vm"] in [c[:5] for c in state["calls"]]
