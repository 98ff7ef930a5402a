"""The supervisor's parts, fast and without processes: `decide` (observation -> action), the
heartbeat writer, events.jsonl and the goodput accounting, the workers' status lines, and the
remote status / kill scripts run by a real shell."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import sys
import time

import pytest

from bert_jax.launch import (
    ApiError,
    CommandFailed,
    LaunchError,
    Runner,
    events,
    queued,
    tpu,
    watcher,
    workdir_state,
)
from bert_jax.launch.supervisor import Observation, Policy, decide
from bert_jax.runtime import heartbeat
from tests import fake_gcloud

QUEUED_READY = Observation(queued=True, qr_state="ACTIVE", node_state="READY", job="running")
POLICY = Policy(max_failures=3, max_preemptions=None, stall_timeout=None, startup_timeout=600)


def _obs(**changes) -> Observation:
    return dataclasses.replace(QUEUED_READY, **changes)


@pytest.mark.parametrize(
    "changes, action, event",
    [
        ({"model_exported": True}, "finish", "finished"),
        ({"qr_state": None, "node_state": None}, "create", "queued"),
        ({"qr_state": "WAITING_FOR_RESOURCES", "node_state": None}, "wait", None),
        ({"qr_state": "PROVISIONING", "node_state": None}, "wait", None),
        # Never a forced delete while SUSPENDING: wait for SUSPENDED.
        ({"qr_state": "SUSPENDING", "node_state": None, "job": "unknown"}, "wait", None),
        ({"qr_state": "SUSPENDED", "node_state": None}, "recreate", "preempted"),
        ({"qr_state": "FAILED", "node_state": None}, "recreate", "preempted"),
        ({"node_state": "PREEMPTED"}, "recreate", "preempted"),
        ({"queued": False, "qr_state": None, "node_state": "TERMINATED"}, "recreate", "preempted"),
        ({"queued": False, "qr_state": None, "node_state": None}, "create", "queued"),
        ({"node_state": "REPAIRING"}, "wait", None),
        ({"job": "none"}, "start", "started"),
        ({"job": "unknown"}, "wait", None),
        ({"job": "exited", "exit_statuses": (0, 0)}, "finish", "finished"),
        ({"job": "exited", "exit_statuses": (1, 137)}, "restart", "failed"),
        ({"job": "running", "exit_statuses": (1,)}, "restart", "failed"),
        ({"job": "exited", "exit_statuses": (143, 143)}, "restart", "preempted"),
        ({"job": "running", "exit_statuses": (143,)}, "wait", None),
        # A user error (2) or a job that does not fit (4) is never retried.
        ({"job": "exited", "exit_statuses": (2, 2)}, "give-up", "failed"),
        ({"job": "exited", "exit_statuses": (4, 1)}, "give-up", "failed"),
        ({"job": "exited", "exit_statuses": (2,), "failures": 0}, "give-up", "failed"),
        # Failures and stalls count against --max-failures; preemptions do not.
        ({"job": "exited", "exit_statuses": (1,), "failures": 3}, "give-up", "failed"),
        ({"qr_state": "SUSPENDED", "preemptions": 99, "failures": 3}, "recreate", "preempted"),
        # Hang watchdog: start-up has its own limit, then max(30 min, 5 x the slowest step).
        ({"since_start": 500.0, "since_progress": None}, "wait", None),
        ({"since_start": 700.0, "since_progress": None}, "restart", "stalled"),
        ({"since_progress": 1799.0, "slowest_step": 2.0}, "wait", None),
        ({"since_progress": 1801.0, "slowest_step": 2.0}, "restart", "stalled"),
        ({"since_progress": 2500.0, "slowest_step": 600.0}, "wait", None),
        ({"since_progress": 3001.0, "slowest_step": 600.0}, "restart", "stalled"),
        ({"since_progress": 3001.0, "slowest_step": 600.0, "failures": 3}, "give-up", "stalled"),
    ],
)
def test_decide(changes, action, event):
    decision = decide(_obs(**changes), POLICY)
    assert (decision.action, decision.event) == (action, event), decision


def test_decide_budgets_and_exit_statuses():
    limited = dataclasses.replace(POLICY, max_preemptions=2, stall_timeout=60.0)
    assert decide(_obs(qr_state="SUSPENDED", preemptions=1), limited).action == "recreate"
    gave_up = decide(_obs(qr_state="SUSPENDED", preemptions=2), limited)
    assert (gave_up.action, gave_up.exit_status) == ("give-up", 1)
    assert "--max-preemptions 2" in gave_up.reason
    assert decide(_obs(since_progress=61.0), limited).event == "stalled"  # --stall-timeout wins
    assert decide(_obs(job="exited", exit_statuses=(2,)), POLICY).exit_status == 2
    assert decide(_obs(job="exited", exit_statuses=(4,)), POLICY).exit_status == 4
    failed = decide(_obs(job="exited", exit_statuses=(1,), failures=3), POLICY)
    assert failed.exit_status == 1 and "--max-failures 3" in failed.reason


@pytest.mark.parametrize(
    "output, expected",
    [
        ("bert-jax-job: running\nbert-jax-job: running\n", ("running", ())),
        ("bert-jax-job: exited 1\nbert-jax-job: running\n", ("running", (1,))),
        ("bert-jax-job: exited 0\nSSH: noise\nbert-jax-job: exited 143\n", ("exited", (0, 143))),
        ("bert-jax-job: none\nbert-jax-job: none\n", ("none", ())),
        ("bert-jax-job: starting\n", ("running", ())),
        ("ssh: connect to host: timed out\n", ("unknown", ())),
    ],
)
def test_job_status_lines(output, expected):
    assert watcher.parse_job_status(output) == expected


def test_remote_status_and_kill_scripts_in_a_real_shell(tmp_path):
    """start -> running; the exit status is recorded (here 3); a SIGSTOPped run is killed."""
    home = tmp_path / "home"
    (home / "bert-jax" / "src").mkdir(parents=True)
    venv_bin = home / "bert-jax" / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    program = venv_bin / "bert-jax"
    program.write_text(f"#!{sys.executable}\nimport sys, time\ntime.sleep(float(sys.argv[2]))\n"
                       "sys.exit(int(sys.argv[3]))\n")  # fmt: skip
    program.chmod(0o755)
    vm = tpu.TpuVm("bert-base", "z")
    env = dict(os.environ, HOME=str(home))

    def remote(command):
        return subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True)

    def status():
        return watcher.parse_job_status(remote(vm.status_script()).stdout)

    assert status() == ("none", ())
    assert remote(vm.start_script(["0.3", "3"], {})).returncode == 0
    assert status()[0] == "running"
    deadline = time.monotonic() + 10
    while status()[0] == "running" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert status() == ("exited", (3,))
    assert remote(vm.start_script(["60", "0"], {})).returncode == 0
    while not (home / "bert-jax" / "run.pid").exists():
        time.sleep(0.02)
    pid = int((home / "bert-jax" / "run.pid").read_text())
    os.kill(pid, 19)  # SIGSTOP: SIGTERM stays pending, SIGKILL ends it
    remote(vm.kill_script())
    deadline = time.monotonic() + 10
    while status()[0] == "running" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert status() == ("exited", (137,))


def test_heartbeat_is_written_at_once_then_at_most_once_per_interval(tmp_path):
    writes = []
    real_write = heartbeat.fs.write_text

    def counting(path, text):
        writes.append(json.loads(text))
        real_write(path, text)

    clock_now = [1000.0]
    log_file = tmp_path / "run.log"
    log_file.write_text("line 1\nline 2\n")
    hb = heartbeat.Heartbeat(
        str(tmp_path / "work"), 1, 10, 100, interval=0.3, log_interval=0.1,
        log_file=str(log_file), attempt=2, clock=lambda: clock_now[0],
    )  # fmt: skip
    heartbeat.fs.write_text = counting
    try:
        for step in range(11, 60):
            clock_now[0] += 1.0
            hb.beat(step)  # never waits for the write
        time.sleep(0.05)
        first = len(writes)
        time.sleep(0.2)
        hb.close("done")
    finally:
        heartbeat.fs.write_text = real_write
    assert first <= 2, "written at most once per interval"
    (record,) = heartbeat.read_all(str(tmp_path / "work"))
    assert record["step"] == 59 and record["state"] == "done" and record["attempt"] == 2
    assert record["start_step"] == 10 and record["total_steps"] == 100
    assert record["first_step_time"] == 1001.0
    assert record["slowest_step_seconds"] == pytest.approx(1.0)
    copied = tmp_path / "work" / "launch" / "logs" / "attempt-2-process-1.log"
    assert copied.read_text() == "line 1\nline 2\n"


def test_heartbeat_failure_never_stops_the_run(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    hb = heartbeat.Heartbeat(str(blocker), 0, 0, 10, interval=0.01)  # a file in the way
    hb.beat(1)
    hb.close()
    assert "failed (the run goes on)" in caplog.text
    assert not hb._thread.is_alive()


def _row(t, event, **fields):
    return {"time": float(t), "event": event, **fields}


# A run of 100 steps at 1 s/step, checkpoints every 10: queued 100 s, a preemption at step 35
# (checkpoint 30), a stall at step 62 (checkpoint 60, killed 50 s after the last step), a
# failure at step 81 (checkpoint 80), then to the end.
DONE_WHEN_ROWS = [
    _row(0, "queued"),
    _row(100, "active"),
    _row(100, "started", attempt=1),
    _row(160, "running", attempt=1, step=1, step_time=130.0, start_step=0),
    _row(170, "preempted", attempt=1, step=35, step_time=164.0, checkpoint=30),
    _row(170, "queued"),
    _row(200, "active"),
    _row(200, "started", attempt=2),
    _row(230, "running", attempt=2, step=31, step_time=220.0, start_step=30),
    _row(301, "stalled", attempt=2, step=62, step_time=251.0, checkpoint=60),
    _row(310, "restarted", attempt=3),
    _row(330, "running", attempt=3, step=61, step_time=320.0, start_step=60),
    _row(345, "failed", attempt=3, step=81, step_time=340.0, checkpoint=80),
    _row(350, "restarted", attempt=4),
    _row(370, "running", attempt=4, step=81, step_time=360.0, start_step=80),
    _row(385, "finished", attempt=4, step=100, step_time=379.0, checkpoint=100),
    _row(390, "deleted"),
]


def test_goodput_and_badput_by_cause():
    result = events.account(DONE_WHEN_ROWS)
    assert result.wall == 385.0
    # Productive: steps 1-30, 31-60, 61-80, 81-100 after each first step: 29+29+19+19 s.
    assert result.productive == pytest.approx(96.0)
    assert result.redone_steps == 5 + 2 + 1
    assert result.badput["capacity"] == pytest.approx(100 + 30)
    # Start-ups: to each attempt's first step (130-100, 220-200, 320-301, 360-345).
    assert result.badput["startup"] == pytest.approx(30 + 20 + 19 + 15)
    assert result.badput["stall"] == pytest.approx(301 - 251)
    # Lost: the steps after each last checkpoint, and the time from the last step to the end.
    assert result.badput["lost"] == pytest.approx((5 + 6) + 2 + (1 + 5))
    total = result.productive + sum(result.badput.values())
    assert total == pytest.approx(result.wall)
    text = events.status_report(DONE_WHEN_ROWS, [], checkpoint=100, model_exported=True, now=400.0)
    assert "restarts by cause: preempted 1, stalled 1, failed 1" in text
    assert "goodput: 24.9%" in text
    assert "waiting for capacity: 33.8%" in text
    assert "steps redone after restarts: 8" in text


def test_a_watcher_coming_and_going_changes_no_figure():
    busy = sorted(
        [*DONE_WHEN_ROWS, _row(50, "watching"), _row(180, "stopped-watching"),
         _row(185, "watching"), _row(240, "watching")],
        key=lambda r: r["time"],
    )  # fmt: skip
    assert events.account(busy) == events.account(DONE_WHEN_ROWS)


def test_status_of_a_run_in_progress_has_an_eta(tmp_path):
    log = events.EventLog(str(tmp_path), clock=iter([0.0, 10.0, 10.0]).__next__)
    log.append("queued")
    log.append("active")
    log.append("started", attempt=1)
    assert events.read(str(tmp_path)) == log.rows and log.attempt == 1
    beats = [{"step": 40, "total_steps": 100, "step_time": 95.0, "seconds_per_step": 2.0,
              "attempt": 1}]  # fmt: skip
    text = events.status_report(log.rows, beats, slice_state="ACTIVE", checkpoint=30, now=100.0)
    assert "slice: ACTIVE" in text
    assert "step: 40 of 100 (reported 0m05s ago), 2 s/step, ETA 2m00s" in text
    assert "latest checkpoint: step 30" in text


def test_names_shared_with_the_pretraining_workdir():
    from bert_jax.training import checkpointing
    from bert_jax.training import workdir as workdir_lib

    assert workdir_state.COMMIT_MARKER == checkpointing.COMMIT_MARKER
    assert workdir_state.LOCK_NAME == workdir_lib.LOCK_NAME


def test_latest_checkpoint_and_export_in_a_local_workdir(tmp_path):
    assert workdir_state.latest_checkpoint(str(tmp_path)) is None
    for name in ("4", "8", "12.orbax-checkpoint-tmp-1"):
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
    assert workdir_state.latest_checkpoint(str(tmp_path)) == 8
    assert not workdir_state.model_exported(str(tmp_path))
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    assert workdir_state.model_exported(str(tmp_path))


def _watchable_workdir(tmp_path) -> tuple[str, dict]:
    """A workdir with launch/job.json (as `launch tpu up` leaves it) and a stand-in gcloud whose
    queued resources wait for capacity for ever: the supervisor only polls."""
    workdir = tmp_path / "run"
    job = workdir_state.Job(
        vm=tpu.TpuVm("bert-sim", "fake-zone-a", accelerator_type="v4-16"),
        workdir=str(workdir),
        pretrain_args=("--config", "c", "--workdir", str(workdir)),
        capacity="spot",
    )
    (workdir / "launch").mkdir(parents=True)
    (workdir / "launch" / "job.json").write_text(job.to_json())
    assert workdir_state.load_job(str(workdir)) == job
    state = str(tmp_path / "state.json")
    fake_gcloud.new_state(state, str(tmp_path / "nodes"), queue_polls=10**6)
    env = {**os.environ, **fake_gcloud.install(str(tmp_path / "bin"), state)}
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return str(workdir), env


def test_ctrl_c_stops_the_watching_not_the_job_and_detach_leaves_a_pid_file(tmp_path):
    import signal

    workdir, env = _watchable_workdir(tmp_path)
    argv = [sys.executable, "-m", "bert_jax.cli", "launch", "tpu", "watch", "--workdir", workdir]
    foreground = subprocess.Popen(
        [*argv, "--poll", "0.2", "--no-stream"], env=env, stdout=subprocess.PIPE, text=True
    )
    assert "Ctrl-C stops the watching, not the job" in foreground.stdout.readline()
    first = foreground.stdout.readline()  # the first action: ask for capacity
    assert "create: no queued resource" in first, first
    foreground.send_signal(signal.SIGINT)
    rest = foreground.communicate(timeout=30)[0]
    assert foreground.returncode == 130
    assert "stopped watching; the job goes on" in rest and "launch tpu watch" in rest
    assert [r["event"] for r in events.read(workdir)] == ["watching", "queued", "stopped-watching"]

    pid_file, log_file = tmp_path / "watch.pid", tmp_path / "watch.log"
    detached = subprocess.run(
        [*argv, "--poll", "0.2", "--detach", "--pid-file", str(pid_file), "--log", str(log_file)],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert detached.returncode == 0, detached.stderr
    pid = int(pid_file.read_text())
    assert f"pid {pid}" in detached.stdout
    try:
        deadline = time.monotonic() + 30
        while len(events.read(workdir)) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        second = subprocess.run([*argv, "--no-stream"], env=env, capture_output=True, text=True)
        assert second.returncode == 2 and f"another supervisor watches this run (pid {pid}" in (
            second.stderr
        )
        deadline = time.monotonic() + 30
        while "[watch" not in log_file.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "[watch" in log_file.read_text()  # a second watcher picked up the same run
        assert [r["event"] for r in events.read(workdir)][3] == "watching"
    finally:
        os.kill(pid, signal.SIGINT)
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "stopped watching" in log_file.read_text()


# --- A flaky gcloud: only NOT_FOUND is "absent" ----------------------------------------------


class ScriptedGcloud:
    """gcloud for a Runner, in-process: a slice whose queued resource is `qr` and TPU VM `node`
    (None: NOT_FOUND), a job `running` on it; describes fail as `failures` says, one entry per
    describe in order (an API_ERRORS kind of the stand-in gcloud, or None: answer). Errors are
    worded as tests/fake_gcloud.py (and the real CLI) word them."""

    def __init__(self, failures=(), qr="ACTIVE", node="READY"):
        self.failures, self.qr, self.node = list(failures), qr, node
        self.calls: list[list[str]] = []

    def __call__(self, argv, check=False, **kwargs):
        self.calls.append(argv)
        command = argv[1 : argv.index("tpus") + 3]  # [alpha] compute tpus GROUP VERB
        done = subprocess.CompletedProcess
        if command[-1] == "describe":
            kind = self.failures.pop(0) if self.failures else None
            if kind is not None:
                return done(
                    argv, 1, "", fake_gcloud.error_line(command, fake_gcloud.API_ERRORS[kind])
                )
            current = self.qr if "queued-resources" in argv else self.node
            if current is None:
                kind = "queuedResources" if "queued-resources" in argv else "nodes"
                refused = fake_gcloud.not_found({"zone": "fake-zone-a"}, kind, argv[5])
                return done(argv, 1, "", fake_gcloud.error_line(command, str(refused)))
            return done(argv, 0, current + "\n", "")
        if command[-1] == "ssh":
            return done(argv, 0, "bert-jax-job: running\nbert-jax-job: running\n", "")
        return done(argv, 0, "", "")

    def verbs(self) -> list[str]:
        return [argv[argv.index("tpus") + 2] for argv in self.calls]


def _started_job(tmp_path, capacity: str | None = "spot") -> workdir_state.Job:
    """A job that the supervisor started a moment ago (queued, active, started)."""
    job = workdir_state.Job(
        vm=tpu.TpuVm("bert-sim", "fake-zone-a", accelerator_type="v4-16"),
        workdir=str(tmp_path / "run"),
        pretrain_args=("--config", "c", "--workdir", str(tmp_path / "run")),
        capacity=capacity,
    )
    log = events.EventLog(job.workdir, clock=lambda: 1000.0)
    for event in ("queued", "active", "started"):
        log.append(event, attempt=1 if event == "started" else 0)
    return job


def _watch(job, gcloud, polls: int, **policy) -> tuple[watcher.Watcher, list[float], str]:
    """Runs the supervisor (poll 1 s; `policy` changes it) for `polls` pauses on an injected
    clock; (the watcher, the pauses it took, what it said)."""
    out, pauses = io.StringIO(), []
    policy = dataclasses.replace(POLICY, **{"poll_seconds": 1.0, **policy})
    supervisor = watcher.Watcher(
        job, policy, Runner(out=out, run=gcloud), stream=False, out=out,
        clock=lambda: 1000.0 + sum(pauses), sleep=pauses.append,
    )  # fmt: skip
    real_pause = supervisor._pause

    def pause(seconds):
        real_pause(seconds)
        if len(pauses) >= polls:
            supervisor._interrupted.set()

    supervisor._pause = pause
    status = supervisor.run()
    assert status == 130, out.getvalue()
    return supervisor, pauses, out.getvalue()


@pytest.mark.parametrize("capacity", ["spot", None])
def test_describes_that_fail_never_make_the_supervisor_act_on_a_healthy_slice(tmp_path, capacity):
    """The issue's case: describes that fail with an auth-token refresh error (then 429, 503, a
    dropped connection) while the slice is ACTIVE and the job runs. Nothing is created, deleted
    or restarted; each failed poll is a line, backoff doubles the pause, the third in a row is a
    `cloud-errors` row, and the first answer after them resets the count."""
    job = _started_job(tmp_path, capacity)
    failures = ["auth", "auth", None, "unavailable", "quota", "connection"]
    if capacity is None:  # --no-queued: only the TPU VM is described
        failures = ["auth", "auth", "unavailable", "quota", "connection"]
    gcloud = ScriptedGcloud(failures)
    supervisor, pauses, said = _watch(job, gcloud, polls=7)
    assert set(gcloud.verbs()) == {"describe", "ssh"}, gcloud.verbs()  # no create, no delete
    # Over ssh only the workers' status: no start, stop or kill.
    ssh = [argv for argv in gcloud.calls if "ssh" in argv]
    assert ssh and all(f"--command={job.vm.status_script()}" in argv for argv in ssh)
    assert pauses == [1.0, 2.0, 4.0, 8.0, 16.0, 1.0, 1.0]
    rows = events.read(job.workdir)
    assert [r["event"] for r in rows] == ["queued", "active", "started", "watching",
                                          "cloud-errors", "stopped-watching"]  # fmt: skip
    assert rows[4]["count"] == 3 and "its state is unknown, not absent" in rows[4]["error"]
    assert "There was a problem refreshing your current auth tokens" in said
    assert said.count("nothing done on it") == 5
    assert "cloud commands work again after 5 failed poll(s)" in said
    assert "create" not in said and "absent" not in said.replace("not absent", "")


def test_a_gcloud_that_keeps_failing_stops_the_watch_not_the_job(tmp_path):
    job = _started_job(tmp_path)
    gcloud = ScriptedGcloud(["unavailable"] * watcher.MAX_COMMAND_FAILURES)
    with pytest.raises(CommandFailed, match="UNAVAILABLE"):
        _watch(job, gcloud, polls=100)
    assert set(gcloud.verbs()) == {"describe"}
    rows = events.read(job.workdir)
    assert (
        rows[-1]["event"] == "stopped-watching"
        and "10 failed polls in a row" in (rows[-1]["reason"])
    )


def test_only_not_found_is_absent_and_the_supervisor_creates_then(tmp_path):
    """The control: the service's NOT_FOUND (as gcloud prints it) is an absent queued resource,
    which the supervisor asks for again."""
    job = _started_job(tmp_path)
    gcloud = ScriptedGcloud(qr=None)
    _watch(job, gcloud, polls=1)
    assert gcloud.verbs()[:2] == ["describe", "create"]


@pytest.mark.parametrize("kind", ["auth", "quota", "unavailable", "connection", "empty"])
def test_describe_tells_an_api_error_from_not_found(kind):
    qr = queued.QueuedResource(tpu.TpuVm("bert-sim", "fake-zone-a"), "spot")
    command = ["compute", "tpus", "queued-resources", "describe"]

    def answering(code, stderr):
        run = lambda argv, **kw: subprocess.CompletedProcess(argv, code, "", stderr)  # noqa: E731
        return Runner(run=run)

    refused = str(fake_gcloud.not_found({"zone": "fake-zone-a"}, "queuedResources", "bert-sim"))
    assert queued.state(qr, answering(1, fake_gcloud.error_line(command, refused))) is None
    if kind == "empty":  # exit 0 and no state: not an answer either
        runner = answering(0, "")
    else:
        runner = answering(1, fake_gcloud.error_line(command, fake_gcloud.API_ERRORS[kind]))
    with pytest.raises(ApiError, match="queued resource bert-sim .*its state is unknown"):
        queued.state(qr, runner)
    with pytest.raises(ApiError):
        queued.node_state(qr.vm, runner)


def test_status_says_unknown_for_an_api_error_never_absent(tmp_path):
    job = _started_job(tmp_path)
    (tmp_path / "run" / "launch" / "job.json").write_text(job.to_json())
    text = workdir_state.status_text(job.workdir, Runner(run=ScriptedGcloud(["auth"])))
    line = next(x for x in text.splitlines() if x.startswith("slice:"))
    assert line.startswith(
        "slice: queued resource unknown (API error), TPU VM bert-sim READY; gcloud could not "
        "describe queued resource bert-sim (exit status 1: ERROR: "
        "(gcloud.compute.tpus.queued-resources.describe) There was a problem refreshing"
    ), line
    text = workdir_state.status_text(job.workdir, Runner(run=ScriptedGcloud(qr=None, node=None)))
    assert "slice: queued resource absent, TPU VM bert-sim absent\n" in text


def test_up_waits_through_api_errors_and_creates_nothing_on_one(tmp_path):
    """`launch tpu up` (no --watch): an API error at the first describe stops it (exit status 1)
    before any create; one while waiting for ACTIVE is retried."""
    qr = queued.QueuedResource(tpu.TpuVm("bert-sim", "fake-zone-a"), "spot")
    gcloud = ScriptedGcloud(["auth"], qr=None)
    with pytest.raises(CommandFailed, match="There was a problem refreshing"):
        queued.bring_up(qr, Runner(out=io.StringIO(), run=gcloud), poll_seconds=0)
    assert gcloud.verbs() == ["describe"]
    gcloud = ScriptedGcloud(["unavailable", "unavailable"])
    out = io.StringIO()
    assert queued.wait_until_active(qr, Runner(out=out, run=gcloud), poll_seconds=0) >= 0
    assert gcloud.verbs() == ["describe"] * 3 and "2 in a row; retrying" in out.getvalue()
    vm = tpu.TpuVm("bert-sim", "fake-zone-a")
    gcloud = ScriptedGcloud(["auth"])
    with pytest.raises(CommandFailed):
        tpu.create(vm, Runner(out=io.StringIO(), run=gcloud))  # --no-queued
    assert gcloud.verbs() == ["describe"]


# --- The re-create delay: from deleting a lost slice to asking for it again -----------------


def test_decide_waits_the_recreate_delay_not_the_poll():
    """The delay is its own setting: shorter or longer than the poll, the decision names the
    pause; by default it is the poll interval."""
    assert POLICY.recreate_delay == POLICY.poll_seconds == 60.0
    lost = {"qr_state": None, "node_state": None}
    short = dataclasses.replace(POLICY, poll_seconds=60.0, recreate_delay_seconds=10.0)
    long = dataclasses.replace(POLICY, poll_seconds=60.0, recreate_delay_seconds=300.0)
    for obs_changes in [lost, {"queued": False, **lost}]:  # a queued resource; --no-queued
        recreate = decide(_obs(qr_state="SUSPENDED", node_state=None), short)
        assert (recreate.action, recreate.pause) == ("recreate", 10.0)
        waiting = decide(_obs(**obs_changes, since_lost=4.0), short)
        assert (waiting.action, waiting.pause) == ("wait", 6.0)
        assert "--recreate-delay" in waiting.reason
        assert decide(_obs(**obs_changes, since_lost=10.0), short).action == "create"
        assert decide(_obs(qr_state="FAILED", node_state=None), long).pause == 60.0
        assert decide(_obs(**obs_changes, since_lost=100.0), long).pause == 60.0
        assert decide(_obs(**obs_changes, since_lost=280.0), long).pause == 20.0
        assert decide(_obs(**obs_changes, since_lost=300.0), long).action == "create"
        # Not after a lost slice (the first create): at once, whatever the delay.
        assert decide(_obs(**obs_changes), long).action == "create"
        at_once = dataclasses.replace(POLICY, recreate_delay_seconds=0.0)
        assert decide(_obs(**obs_changes, since_lost=0.0), at_once).action == "create"
    # A restart on the same slice (SIGTERM, 143) is not a re-create: the poll as before.
    restart = decide(_obs(job="exited", exit_statuses=(143,)), short)
    assert (restart.action, restart.pause) == ("restart", None)


@pytest.mark.parametrize("delay", [-1.0, float("inf"), float("nan")])
def test_a_bad_recreate_delay_is_refused_naming_the_flag(delay):
    with pytest.raises(LaunchError, match=r"^--recreate-delay \S+ must be in \[0, inf\)$"):
        Policy(recreate_delay_seconds=delay)


def test_lost_at_is_the_deletion_of_a_slice_not_asked_for_again():
    rows = [{"time": t, "event": e} for t, e in [(1, "queued"), (2, "active"), (3, "started")]]
    assert events.lost_at(rows) is None
    rows.append({"time": 9.5, "event": "preempted"})
    assert events.lost_at(rows) == 9.5
    assert events.lost_at([*rows, {"time": 10, "event": "watching"}]) == 9.5
    assert events.lost_at([*rows, {"time": 12, "event": "queued"}]) is None
    # A job stopped by SIGTERM and restarted on its slice: nothing was lost.
    assert events.lost_at([*rows, {"time": 9.6, "event": "restarted"}]) is None


class LosingGcloud(ScriptedGcloud):
    """A slice that is SUSPENDED: a delete takes it away, a create asks for it (ACCEPTED)."""

    def __call__(self, argv, check=False, **kwargs):
        verb = argv[argv.index("tpus") + 2]
        if verb == "delete":
            self.qr = self.node = None
        elif verb == "create":
            self.qr = "ACCEPTED"
        return super().__call__(argv, check, **kwargs)


@pytest.mark.parametrize(
    "delay, pauses, waited",
    [
        (2.5, [1.0, 1.0, 0.5, 1.0], 2.5),  # longer than the poll: polls go on, then the rest
        (0.25, [0.25, 1.0, 1.0, 1.0], 0.25),  # shorter: the next poll comes when it is over
        (None, [1.0, 1.0, 1.0, 1.0], 1.0),  # not set: the poll interval
    ],
)
def test_the_watcher_asks_again_after_the_recreate_delay(tmp_path, delay, pauses, waited):
    job = _started_job(tmp_path)
    gcloud = LosingGcloud(qr="SUSPENDED", node=None)
    supervisor, taken, said = _watch(job, gcloud, polls=4, recreate_delay_seconds=delay)
    assert taken == pauses
    assert gcloud.verbs().count("delete") == 1 and gcloud.verbs().count("create") == 1
    rows = events.read(job.workdir)
    assert [r["event"] for r in rows][3:6] == ["watching", "preempted", "queued"]
    assert rows[5]["time"] - rows[4]["time"] == waited  # deleted -> asked for again
    if delay == 2.5:
        assert said.count("the slice was lost: asking again 2.5 s after (--recreate-delay)") == 1


def test_a_watcher_started_afresh_keeps_the_recreate_delay(tmp_path):
    """The delay counts from the `preempted` row in events.jsonl, not from this process."""
    job = _started_job(tmp_path)
    events.EventLog(job.workdir, clock=lambda: 999.0).append("preempted", reason="gone")
    gcloud = ScriptedGcloud(qr=None, node=None)
    _, taken, _ = _watch(job, gcloud, polls=3, recreate_delay_seconds=2.5)
    assert taken == [1.0, 0.5, 1.0]  # 1 s had passed at the first look: 1.5 s were left
    assert gcloud.verbs().count("create") == 1


def test_the_recreate_delay_flag_reaches_the_policy_and_the_detached_watch():
    from bert_jax import cli
    from bert_jax.cli import launch as launch_cli

    watch = ["launch", "tpu", "watch", "--workdir", "gs://b/run"]
    args = cli.build_parser().parse_args([*watch, "--poll", "30s", "--recreate-delay", "5m"])
    policy = launch_cli._policy(args)
    assert (policy.poll_seconds, policy.recreate_delay) == (30.0, 300.0)
    assert launch_cli._watch_argv(args, "gs://b/run")[-1] == "--recreate-delay=300.0"
    up = ["launch", "tpu", "up", "--name", "n", "--zone", "z", "--watch", "--recreate-delay", "0"]
    args = cli.build_parser().parse_args([*up, "--", "--workdir", "gs://b/run"])
    assert launch_cli._policy(args).recreate_delay == 0.0
    args = cli.build_parser().parse_args(watch)
    assert launch_cli._policy(args).recreate_delay == 60.0  # not set: the poll interval
    assert "--recreate-delay" not in launch_cli._watch_argv(args, "gs://b/run")


def test_the_watching_row_records_the_policy_that_supervises(tmp_path):
    job = _started_job(tmp_path)
    supervisor, _, _ = _watch(job, ScriptedGcloud(qr="ACTIVE", node="READY"), polls=1)
    watching = [r for r in events.read(job.workdir) if r["event"] == "watching"]
    assert [Policy.from_dict(r["policy"]) for r in watching] == [supervisor.policy]
