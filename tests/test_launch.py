"""`bert-jax launch tpu|slurm`: exact dry-run commands, and hostile values that stay one argument
when the remote shell (or sbatch's bash) actually runs what we generate."""

from __future__ import annotations

import io
import json
import os
import shlex
import stat
import subprocess
import sys
import tarfile
import time

import pytest

from bert_jax import cli
from bert_jax.launch import LaunchError, Runner, slurm, tpu, watcher, workdir_state
from bert_jax.runtime import distributed

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOSTILE = "a b; rm -rf /"
TPU = ["--name", "bert-base", "--zone", "us-central2-b", "--project", "my-proj", "--dry-run"]
WHERE = "--zone=us-central2-b --project=my-proj"
PRETRAIN = [
    "--config",
    "configs/bert.py:base",
    "--workdir",
    "/gcs/bucket/runs/base",
    f"--config.data.source={HOSTILE}",
]

DESCRIBE = f"gcloud compute tpus tpu-vm describe bert-base {WHERE} '--format=value(state)'"
CREATE = (
    f"gcloud compute tpus tpu-vm create bert-base {WHERE} --accelerator-type=v4-32 "
    "--version=tpu-ubuntu2204-base"
)
SSH = f"gcloud compute tpus tpu-vm ssh bert-base {WHERE}"
MKDIR = f"""{SSH} --worker=all '--command=mkdir -p "$HOME"/bert-jax'"""
SCP = (
    f"gcloud compute tpus tpu-vm scp /tmp/src.tar.gz bert-base:bert-jax/src.tar.gz {WHERE} "
    "--worker=all"
)
INSTALL = (
    f"{SSH} --worker=all '--command=set -e; "
    'rm -rf "$HOME"/bert-jax/src && mkdir -p "$HOME"/bert-jax/src; '
    'tar -xzf "$HOME"/bert-jax/src.tar.gz -C "$HOME"/bert-jax/src; '
    'test -x "$HOME"/bert-jax/venv/bin/python || python3 -m venv "$HOME"/bert-jax/venv || '
    "{ sudo apt-get update -qq && sudo apt-get install -y -qq python3-venv && "
    'python3 -m venv "$HOME"/bert-jax/venv; }; '
    '"$HOME"/bert-jax/venv/bin/pip install -q --upgrade pip; '
    """"$HOME"/bert-jax/venv/bin/pip install -q '"'"'jax[tpu]==0.10.2'"'"' """
    """-e "$HOME"/bert-jax/src'"""
)
START = (
    f"""{SSH} --worker=all '--command=cd "$HOME"/bert-jax/src && """
    """if [ -f "$HOME"/bert-jax/run.pid ] && kill -0 "$(cat "$HOME"/bert-jax/run.pid)" """
    """2>/dev/null; then echo '"'"'bert-jax: a run is still going on this worker; stop it """
    """first'"'"' >&2; exit 1; fi; rm -f "$HOME"/bert-jax/run.pid "$HOME"/bert-jax/run.exit; """
    """date +%s > "$HOME"/bert-jax/run.started; nohup bash -c '"'"'export """
    """BERT_JAX_LOG_FILE="$HOME"/bert-jax/run.log; "$@" & echo $! > "$HOME"/bert-jax/run.pid; """
    """wait $!; echo $? > "$HOME"/bert-jax/run.exit'"'"' bert-jax env BERT_JAX_DISTRIBUTED=on """
    "TF_CPP_MIN_LOG_LEVEL=2 ../venv/bin/bert-jax pretrain --config configs/bert.py:base "
    """--workdir /gcs/bucket/runs/base '"'"'--config.data.source=a b; rm -rf /'"'"' > """
    """"$HOME"/bert-jax/run.log 2>&1 < /dev/null &'"""
)
LOGS = f"""{SSH} --worker=0 '--command=tail -n +1 -F "$HOME"/bert-jax/run.log'"""
STOP = (
    f"""{SSH} --worker=all '--command=if [ -f "$HOME"/bert-jax/run.pid ] && """
    """kill -TERM "$(cat "$HOME"/bert-jax/run.pid)" 2>/dev/null; then echo "sent SIGTERM to """
    """bert-jax on $(hostname)"; else echo "no bert-jax run on $(hostname)"; fi'"""
)
DELETE = f"gcloud compute tpus tpu-vm delete bert-base {WHERE} --quiet"
QR = "gcloud compute tpus queued-resources"
QR_DESCRIBE = f"{QR} describe bert-base {WHERE} '--format=value(state.state)'"
QR_CREATE = (
    f"{QR} create bert-base {WHERE} --node-id=bert-base --accelerator-type=v4-32 "
    "--runtime-version=tpu-ubuntu2204-base"
)
QR_UP = [
    QR_DESCRIBE,
    "# only when the describe above finds none (SUSPENDED or FAILED: delete first):",
    QR_CREATE,
    "# then every 60 s until the state is ACTIVE:",
    QR_DESCRIBE,
]
PREFLIGHT = [
    f"# preflight (in {REPO}): compile the step for v4-32 before creating anything; "
    "--skip-preflight skips it",
    shlex.join(
        [sys.executable, "-m", "bert_jax.cli", "pretrain", *PRETRAIN]
        + ["--compile-only", "--topology", "v4-32"]
    ),
]
PACK = f"# pack pyproject.toml README.md bert_jax configs launch of {REPO} into /tmp/src.tar.gz"
SETUP_FLAGS = ["--source", REPO, "--archive", "/tmp/src.tar.gz", "--jax-spec", "jax[tpu]==0.10.2"]


# What gcloud prints when the service answers that the thing does not exist.
NOT_FOUND = (
    "ERROR: (gcloud.compute.tpus.tpu-vm.describe) NOT_FOUND: Resource "
    "'projects/my-proj/locations/us-central2-b/nodes/bert-base' was not found\n"
)


def _launch(capsys, *argv) -> list[str]:
    assert cli.main(["launch", *argv]) == 0
    return capsys.readouterr().out.splitlines()


@pytest.mark.parametrize(
    "action, extra, expected",
    [
        (
            "create",
            ["--no-queued"],
            [
                DESCRIBE,
                "# only when the describe above answers NOT_FOUND (no such TPU VM):",
                CREATE,
            ],
        ),
        ("create", [], QR_UP),
        ("setup", SETUP_FLAGS, [PACK, MKDIR, SCP, INSTALL]),
        ("run", ["--", *PRETRAIN], [START, LOGS]),
        ("run", ["--no-follow", "--", *PRETRAIN], [START]),
        ("logs", [], [LOGS]),
        ("logs", ["--worker", "3"], [LOGS.replace("--worker=0", "--worker=3")]),
        ("stop", [], [STOP]),
        ("delete", ["--no-queued"], [DELETE]),
        ("delete", [], [f"{QR} delete bert-base {WHERE} --force --quiet"]),
        (
            "up",
            [*SETUP_FLAGS, "--", *PRETRAIN],
            [*PREFLIGHT, *QR_UP, PACK, MKDIR, SCP, INSTALL, START, LOGS],
        ),
        (
            "up",
            [*SETUP_FLAGS, "--no-queued", "--", *PRETRAIN],
            [
                *PREFLIGHT,
                DESCRIBE,
                "# only when the describe above answers NOT_FOUND (no such TPU VM):",
                CREATE,
                PACK,
                MKDIR,
                SCP,
                INSTALL,
                START,
                LOGS,
            ],
        ),
    ],
)
def test_tpu_dry_run_prints_every_gcloud_command(capsys, action, extra, expected):
    assert _launch(capsys, "tpu", action, *TPU, *extra) == expected


def test_tpu_create_options_and_env(capsys):
    lines = _launch(
        capsys,
        *("tpu", "create", "--name", "bert-large", "--zone", "us-east5-a", "--dry-run"),
        *("--accelerator-type", "v5p-128", "--version", "v2-alpha-tpuv5", "--spot", "--no-queued"),
    )
    assert lines[-1] == (
        "gcloud compute tpus tpu-vm create bert-large --zone=us-east5-a --accelerator-type=v5p-128 "
        "--version=v2-alpha-tpuv5 --spot"
    )
    lines = _launch(
        capsys,
        *("tpu", "run", *TPU, "--no-follow", "--env", f"EXTRA={HOSTILE}", "--", "--config", "c"),
    )
    assert (
        "TF_CPP_MIN_LOG_LEVEL=2 '\"'\"'EXTRA=a b; rm -rf /'\"'\"' ../venv/bin/bert-jax" in lines[0]
    )


@pytest.mark.parametrize(
    "flags, track, tail",
    [
        (["--spot"], "", " --spot"),
        (["--spot", "--valid-until-duration", "6h"], "", " --spot --valid-until-duration=6h"),
        (["--best-effort"], " alpha", " --best-effort"),
        (["--reserved"], "", " --reserved"),
        (["--guaranteed"], "", " --guaranteed"),
        ([], "", ""),
    ],
)
def test_queued_resource_create_per_capacity(capsys, flags, track, tail):
    lines = _launch(
        capsys,
        *("tpu", "create", "--name", "bert-large", "--zone", "us-east5-a", "--dry-run"),
        *("--accelerator-type", "v5p-128", "--version", "v2-alpha-tpuv5", *flags),
    )
    assert lines[2] == (
        f"gcloud{track} compute tpus queued-resources create bert-large --zone=us-east5-a "
        "--node-id=bert-large --accelerator-type=v5p-128 --runtime-version=v2-alpha-tpuv5" + tail
    )


def test_queued_resource_waits_until_active_with_a_progress_line():
    """WAITING_FOR_RESOURCES -> PROVISIONING -> ACTIVE: one line per state with the time waited;
    a SUSPENDED resource is deleted (without --force) and asked for again; one that ends FAILED
    while waiting is a CommandFailed (exit status 1, not a user error)."""
    from bert_jax.launch import CommandFailed, queued

    def scripted(states):
        calls = []

        def fake_run(argv, check=False, **kwargs):
            calls.append(argv)
            if "describe" not in argv:
                return subprocess.CompletedProcess(argv, 0, stdout="")
            out = states.pop(0)
            if not out:
                return subprocess.CompletedProcess(argv, 1, stdout="", stderr=NOT_FOUND)
            return subprocess.CompletedProcess(argv, 0, stdout=out + "\n")

        return calls, fake_run

    calls, fake_run = scripted(["SUSPENDED", "WAITING_FOR_RESOURCES", "WAITING_FOR_RESOURCES",
                                "PROVISIONING", "ACTIVE"])  # fmt: skip
    out = io.StringIO()
    qr = queued.QueuedResource(tpu.TpuVm("bert-base", "us-central2-b"), "spot")
    queued.bring_up(qr, Runner(out=out, run=fake_run), poll_seconds=0)
    shown = out.getvalue()
    assert "queued resource bert-base: WAITING_FOR_RESOURCES, waited 0m00s" in shown
    assert "queued resource bert-base: PROVISIONING" in shown
    assert "is ACTIVE after" in shown
    verbs = [argv[4] for argv in calls]
    assert verbs == ["describe", "delete", "create", "describe", "describe", "describe", "describe"]
    assert "--force" not in calls[1]

    calls, fake_run = scripted(["WAITING_FOR_RESOURCES", "FAILED"])
    with pytest.raises(CommandFailed, match="FAILED"):
        queued.wait_until_active(qr, Runner(out=io.StringIO(), run=fake_run), poll_seconds=0)
    with pytest.raises(LaunchError, match="duration"):
        queued.QueuedResource(qr.vm, "spot", "six hours")
    # The kinds are Capacity's declared choices (the switches and on-demand).
    with pytest.raises(LaunchError, match="^capacity 'cheap' is not one of on-demand, spot, "):
        queued.QueuedResource(qr.vm, "cheap")


@pytest.mark.parametrize(
    "state, deletes, force",
    [("ACTIVE", True, True), ("SUSPENDING", False, None), ("SUSPENDED", True, False),
     ("FAILED", True, False), ("WAITING_FOR_RESOURCES", True, True), (None, False, None)],
)  # fmt: skip
def test_queued_resource_is_never_forced_while_suspending(state, deletes, force):
    from bert_jax.launch import queued

    calls = []
    runner = Runner(out=open(os.devnull, "w"), run=lambda argv, **kw: calls.append(argv))  # noqa: SIM115
    runner._run = lambda argv, **kw: calls.append(argv) or subprocess.CompletedProcess(argv, 0)
    qr = queued.QueuedResource(tpu.TpuVm("bert-base", "us-central2-b"))
    queued.delete(qr, runner, state)
    assert bool(calls) == deletes
    if deletes:
        assert ("--force" in calls[0]) == force


@pytest.mark.parametrize(
    "argv, message",
    [
        (["tpu", "run", "--name", HOSTILE, "--zone", "z", "--", "--config", "c"], "not valid"),
        (["tpu", "up", "--name", "ok", "--zone", "z", "--dry-run"], "nothing to run"),
        (["tpu", "run", "--name", "ok", "--zone", "z", "--env", "A B=1", "--", "x"], "--env"),
        (["tpu", "logs", "--name", "ok", "--zone", "z", "--remote-dir", "/etc"], "relative path"),
        (["slurm", "--nodes", "2", "--job-name", HOSTILE, "--dry-run", "--", "x"], "#SBATCH"),
        (["slurm", "--nodes", "2", "--partition", "gpu\nrm", "--dry-run", "--", "x"], "#SBATCH"),
        (["slurm", "--nodes", "2", "--env", "1A=x", "--dry-run", "--", "x"], "variable name"),
        (["slurm", "--nodes", "2", "--dry-run"], "nothing to run"),
        (["slurm", "--dry-run", "--", "x"], "--nodes is required"),
        (["slurm", "--nodes", "0", "--dry-run", "--", "x"], "--nodes 0 must be >= 1"),
        (["slurm", "--nodes", "1", "--port", "0", "--dry-run", "--", "x"], "--port 0 must be in"),
        (["slurm", "--nodes", "1", "--gpus-per-node", "0", "--dry-run", "--", "x"], "must be >= 1"),
        (
            [
                "tpu",
                "up",
                "--name",
                "ok",
                "--zone",
                "z",
                "--valid-until-duration",
                "6 h",
                "--dry-run",
                "--",
                "x",
            ],
            "--valid-until-duration",
        ),
        (["tpu", "up", "--name", "ok", "--zone", "z", "--watch", "--", "x"], "--workdir"),
        (["tpu", "watch", "--workdir", "/nonexistent/run"], "job.json does not exist"),
    ],
)
def test_bad_values_are_refused_with_one_line(capsys, argv, message):
    assert cli.main(["launch", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


@pytest.mark.parametrize(
    "flag, value",
    [("--stall-timeout", "-5"), ("--stall-timeout", "0"), ("--stall-timeout", "inf"),
     ("--poll", "0"), ("--startup-timeout", "-1h"), ("--stop-grace", "nan"), ("--poll", "-5"),
     ("--max-failures", "-1"), ("--max-preemptions", "-2")],
)  # fmt: skip
def test_supervisor_settings_are_checked_before_anything_runs(
    capsys, monkeypatch, tmp_path, flag, value
):
    """`up --watch --stall-timeout -5` would rent a slice, then restart a healthy job at every
    poll: every duration and count of the supervisor is refused in one line naming its flag,
    before a preflight, a gcloud command or launch/job.json; `watch --detach` too, before the
    background supervisor starts."""

    def refuse(*args, **kwargs):
        raise AssertionError("something ran before the supervisor's settings were checked")

    for target, name in (
        (tpu, "preflight"),
        (workdir_state, "save_job"),
        (watcher, "detach"),
        (watcher.Watcher, "run"),
        (Runner, "__call__"),
        (Runner, "capture_all"),
    ):
        monkeypatch.setattr(target, name, refuse)  # fmt: skip
    workdir = tmp_path / "run"
    # As a user writes them: `--stall-timeout -5`, but `--startup-timeout=-1h` (argparse reads
    # a lone -1h as a flag).
    given = [f"{flag}={value}"] if value == "-1h" else [flag, value]
    up = ["tpu", "up", "--name", "ok", "--zone", "z", "--watch", *given, "--"]
    assert cli.main(["launch", *up, "--config", "c", "--workdir", str(workdir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"bert-jax launch tpu up: error: {flag} ") and err.count("\n") == 1, err
    assert not workdir.exists()

    job = workdir_state.Job(tpu.TpuVm("ok", "z"), str(workdir), ("--workdir", str(workdir)))
    (workdir / "launch").mkdir(parents=True)
    (workdir / "launch" / "job.json").write_text(job.to_json())
    pid_file = tmp_path / "watch.pid"
    watch = ["tpu", "watch", "--workdir", str(workdir), *given, "--detach"]
    assert cli.main(["launch", *watch, "--pid-file", str(pid_file)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"bert-jax launch tpu watch: error: {flag} "), err
    assert not pid_file.exists()


@pytest.mark.parametrize("action", [["tpu", "status", "--no-gcloud"], ["slurm", "status"]])
def test_status_names_a_workdir_that_is_a_file_or_does_not_exist(
    capsys, monkeypatch, tmp_path, action
):
    """A typo must not read as a run without checkpoints: a file, or a path that does not
    exist, is one line naming it (exit 2); an existing workdir without checkpoints says so."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus.txt").write_text("some text\n")
    for workdir, said in (
        ("corpus.txt", "--workdir corpus.txt is a file, not a run's workdir"),
        ("runs/bse", "--workdir runs/bse does not exist: check the path"),
        ("corpus.txt/run", "--workdir corpus.txt/run does not exist"),
    ):
        assert cli.main(["launch", *action, "--workdir", workdir]) == 2
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1, err
    (tmp_path / "runs" / "base").mkdir(parents=True)
    assert cli.main(["launch", *action, "--workdir", "runs/base"]) == 0
    assert "latest checkpoint: none" in capsys.readouterr().out


def _executable(path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)


ARGV_RECORDER = """#!{python}
import json, os, sys, time
names = ("BERT_JAX_DISTRIBUTED", "BERT_JAX_COORDINATOR", "BERT_JAX_NUM_PROCESSES",
         "BERT_JAX_LOCAL_DEVICE_IDS", "TF_CPP_MIN_LOG_LEVEL", "EXTRA")
with open({out!r}, "w") as f:
    json.dump({{"argv": sys.argv[1:], "cwd": os.getcwd(),
               "env": {{n: os.environ.get(n) for n in names}}}}, f)
time.sleep(float(os.environ.get("FAKE_SECONDS", "0")))
"""


def _wait_for(path, seconds=20.0):
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    time.sleep(0.05)
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def test_tpu_remote_commands_run_in_a_real_shell(tmp_path):
    """The start/stop command lines, run by bash as sshd would, pass hostile values as single
    arguments, refuse a second start while a run is alive, and SIGTERM it on stop."""
    home = tmp_path / "home"
    (home / "bert-jax" / "src").mkdir(parents=True)
    (home / "bert-jax" / "venv" / "bin").mkdir(parents=True)
    out = tmp_path / "argv.json"
    _executable(
        home / "bert-jax" / "venv" / "bin" / "bert-jax",
        ARGV_RECORDER.format(python=sys.executable, out=str(out)),
    )
    canary = tmp_path / "canary"
    hostile = [f"--config.data.source=x; touch {canary}", f"--workdir=$(touch {canary})", "a'b"]
    vm = tpu.TpuVm("bert-base", "us-central2-b")
    start = vm.start_script(
        ["--config", "configs/bert.py:base", *hostile],
        tpu.run_environment({"EXTRA": f"`touch {canary}`"}),
    )
    env = dict(os.environ, HOME=str(home), FAKE_SECONDS="30")

    def remote(command):
        return subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True)

    assert remote(start).returncode == 0
    seen = _wait_for(out)
    assert seen["argv"] == ["pretrain", "--config", "configs/bert.py:base", *hostile]
    assert seen["cwd"] == str(home / "bert-jax" / "src")
    assert seen["env"]["BERT_JAX_DISTRIBUTED"] == "on"
    assert seen["env"]["EXTRA"] == f"`touch {canary}`"
    assert not canary.exists()

    again = remote(start)
    assert again.returncode == 1 and "still going" in again.stderr
    stopped = remote(vm.stop_script())
    assert stopped.returncode == 0 and "sent SIGTERM" in stopped.stdout
    pid = int((home / "bert-jax" / "run.pid").read_text())
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{pid}") or "zombie" in open(f"/proc/{pid}/status").read()
    assert "no bert-jax run" in remote(vm.stop_script()).stdout


def test_tpu_up_reuses_an_existing_vm_and_packs_the_source(tmp_path):
    calls = []

    def fake_run(argv, check=False, **kwargs):
        calls.append(argv)
        if argv[4] != "describe":
            return subprocess.CompletedProcess(argv, 0)
        if fake_run.exists:
            return subprocess.CompletedProcess(argv, 0, stdout="READY\n")
        return subprocess.CompletedProcess(argv, 1, stdout="", stderr=NOT_FOUND)

    archive = str(tmp_path / "src.tar.gz")
    for exists in (False, True):
        fake_run.exists = exists
        calls.clear()
        vm = tpu.TpuVm("bert-base", "us-central2-b")
        runner = Runner(out=open(os.devnull, "w"), run=fake_run)  # noqa: SIM115
        tpu.perform("up", vm, runner, pretrain_args=["--config", "c"], archive=archive)
        assert calls[0][-6:] == [
            "pretrain",
            "--config",
            "c",
            "--compile-only",
            "--topology",
            "v4-32",
        ]
        verbs = [argv[4] for argv in calls[1:]]
        expected = ["describe"] + ([] if exists else ["create"]) + ["ssh", "scp", "ssh", "ssh"]
        assert verbs == expected + ["ssh"], verbs  # the last ssh streams worker 0's log
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert {
        "pyproject.toml",
        "bert_jax/cli/__init__.py",
        "configs/bert.py",
        "launch/mount_gcs.sh",
    } <= set(names)
    assert not [n for n in names if "__pycache__" in n or n.startswith((".venv", "tests"))]


@pytest.mark.parametrize("status, said", [(4, "does not fit v5p-16"), (2, "exit status 2")])
def test_tpu_up_creates_nothing_when_the_preflight_fails(status, said, tmp_path):
    """`up` compiles the job for the accelerator type first (a local subprocess: no TPU needed);
    a job that does not fit (exit 4) or a bad config stops the launch before any gcloud call,
    and --skip-preflight goes straight on."""
    calls = []

    def fake_run(argv, check=False, **kwargs):
        calls.append((argv, kwargs.get("cwd")))
        if "describe" in argv:  # no such TPU VM yet
            return subprocess.CompletedProcess(argv, 1, stdout="", stderr=NOT_FOUND)
        return subprocess.CompletedProcess(argv, status if "--compile-only" in argv else 0)

    vm = tpu.TpuVm("bert-base", "us-central2-b", accelerator_type="v5p-16")
    runner = Runner(out=open(os.devnull, "w"), run=fake_run)  # noqa: SIM115
    with pytest.raises(LaunchError, match=said):
        tpu.perform("up", vm, runner, pretrain_args=["--config", "c"], source_dir=REPO)
    assert len(calls) == 1 and calls[0][1] == REPO  # where the config paths lead
    assert calls[0][0][-2:] == ["--topology", "v5p-16"]
    calls.clear()
    tpu.perform(
        "up",
        vm,
        runner,
        pretrain_args=["--config", "c"],
        check_fit=False,
        archive=str(tmp_path / "src.tgz"),
    )
    assert calls and not any("--compile-only" in argv for argv, _ in calls)


SLURM_SCRIPT = """#!/bin/bash
#SBATCH --job-name=bert-base
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=12
#SBATCH --time=2-00:00:00
#SBATCH --partition=gpu
#SBATCH --account=lab
#SBATCH --output=/gcs/bucket/runs/base/bert-base-%j.out
#SBATCH --requeue
#SBATCH --signal=TERM@300
#SBATCH --exclusive
#SBATCH --mem=0
# Written by `bert-jax launch slurm`: 2 node(s) x 8 GPU(s), one process per GPU (16 processes).
source ~/venv/bin/activate
set -eu
# Process 0 (first task, first node) hosts the coordinator; each task reads its process id from \
SLURM_PROCID.
coordinator_host="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"
export BERT_JAX_COORDINATOR="$coordinator_host:$((SLURM_JOB_ID % 4096 + 61440))"
export BERT_JAX_NUM_PROCESSES="$SLURM_NTASKS"
export BERT_JAX_LOCAL_DEVICE_IDS=local-rank
export TF_CPP_MIN_LOG_LEVEL=2
export EXTRA='a b; rm -rf /'
# The n-th start of this job (requeues included); heartbeats carry it.
export BERT_JAX_LAUNCH_ATTEMPT="$((${SLURM_RESTART_COUNT:-0} + 1))"
bert-jax launch slurm record started --workdir /gcs/bucket/runs/base --note \
"job $SLURM_JOB_ID" || true
set +e
srun --kill-on-bad-exit=1 bert-jax pretrain --config configs/bert.py:base --workdir \
/gcs/bucket/runs/base '--config.data.source=a b; rm -rf /'
status=$?
set -e
# 143: stopped by SIGTERM after saving (time limit near, or preempted): requeue, resume from the \
workdir.
if [ "$status" -eq 143 ]; then
  bert-jax launch slurm record preempted --workdir /gcs/bucket/runs/base --note \
"job $SLURM_JOB_ID" --exit-status "$status" || true
  scontrol requeue "$SLURM_JOB_ID"
elif [ "$status" -eq 0 ]; then
  bert-jax launch slurm record finished --workdir /gcs/bucket/runs/base --note \
"job $SLURM_JOB_ID" --exit-status "$status" || true
else
  bert-jax launch slurm record failed --workdir /gcs/bucket/runs/base --note \
"job $SLURM_JOB_ID" --exit-status "$status" || true
fi
exit "$status"
"""
SLURM_FLAGS = [
    *("--nodes", "2", "--job-name", "bert-base", "--partition", "gpu", "--account", "lab"),
    *("--time", "2-00:00:00", "--cpus-per-task", "12", "--sbatch-option=--exclusive"),
    *("--sbatch-option", "mem=0"),
    *("--setup", "source ~/venv/bin/activate", "--env", f"EXTRA={HOSTILE}"),
]


def test_slurm_dry_run_prints_the_script(capsys):
    out = "\n".join(_launch(capsys, "slurm", *SLURM_FLAGS, "--dry-run", "--", *PRETRAIN))
    assert out + "\n" == SLURM_SCRIPT
    out = _launch(capsys, "slurm", *SLURM_FLAGS, "--submit", "--dry-run", "--", *PRETRAIN)
    assert out[-1] == "# then: sbatch /gcs/bucket/runs/base/bert-base.sbatch"
    per_node = "\n".join(
        _launch(
            capsys,
            *("slurm", "--nodes", "4", "--per", "node", "--port", "7777", "--dry-run"),
            *("--", "--config", "c"),
        )
    )
    assert "#SBATCH --ntasks-per-node=1\n#SBATCH --gpus-per-node=8" in per_node
    assert 'BERT_JAX_COORDINATOR="$coordinator_host:7777"' in per_node
    assert "export BERT_JAX_LOCAL_DEVICE_IDS=all" in per_node
    assert "one process per node (4 processes)" in per_node


def test_slurm_script_runs_under_bash_and_feeds_distributed(tmp_path):
    """The script, run by bash with fake scontrol/srun, hands srun the arguments intact and
    exports what `distributed.choose_startup` turns into the right coordinator, count, id and
    devices."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    out = tmp_path / "srun.json"
    _executable(bin_dir / "scontrol", "#!/bin/sh\nprintf 'gpu017\\ngpu018\\n'\n")
    _executable(bin_dir / "srun", ARGV_RECORDER.format(python=sys.executable, out=str(out)))
    canary = tmp_path / "canary"
    args = ["--config", "c.py", f"--config.data.source=$(touch {canary})", f"x; touch {canary}"]
    job = slurm.SlurmJob(nodes=2, env=(("EXTRA", f"`touch {canary}`"),))
    script = tmp_path / "job.sbatch"
    slurm.write_and_submit(job, args, str(script), Runner(out=open(os.devnull, "w")), False)  # noqa: SIM115
    env = dict(
        os.environ,
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        SLURM_JOB_NODELIST="gpu[017-018]",
        SLURM_NTASKS="16",
        SLURM_JOB_ID="123456",
    )
    assert subprocess.run(["bash", str(script)], env=env, capture_output=True).returncode == 0
    seen = json.loads(out.read_text())
    assert seen["argv"] == ["--kill-on-bad-exit=1", "bert-jax", "pretrain", *args]
    assert seen["env"]["EXTRA"] == f"`touch {canary}`" and not canary.exists()
    port = 123456 % 4096 + 61440
    assert seen["env"]["BERT_JAX_COORDINATOR"] == f"gpu017:{port}"

    # What one srun task (global rank 11 = node 1, local rank 3) makes of that environment.
    task_env = {
        **{k: v for k, v in seen["env"].items() if v is not None},
        "SLURM_JOB_ID": "123456",
        "SLURM_STEP_NODELIST": "gpu[017-018]",
        "SLURM_NTASKS": "16",
        "SLURM_PROCID": "11",
        "SLURM_LOCALID": "3",
    }
    assert distributed.choose_startup(env=task_env) == distributed.Startup(
        "explicit", f"gpu017:{port}", 16, 11, (3,), "deactivate"
    )


@pytest.mark.parametrize("status, requeued, event", [(143, True, "preempted"), (0, False,
                         "finished"), (1, False, "failed")])  # fmt: skip
def test_slurm_script_requeues_a_run_stopped_before_the_time_limit(
    tmp_path, status, requeued, event
):
    """srun ends 143 (SIGTERM before the time limit: saved) -> `scontrol requeue`; every start
    and end is an events.jsonl row that `launch slurm status` reads."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    _executable(bin_dir / "scontrol", f"#!/bin/sh\necho \"scontrol $*\" >> {calls}\n"
                "printf 'gpu017\\n'\n")  # fmt: skip
    _executable(bin_dir / "srun", f"#!/bin/sh\nexit {status}\n")
    _executable(
        bin_dir / "bert-jax",
        f'#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} -m bert_jax.cli "$@"\n',
    )
    workdir = tmp_path / "run"
    script = tmp_path / "job.sbatch"
    job = slurm.SlurmJob(nodes=1, time="1:00:00")
    slurm.write_and_submit(
        job, ["--workdir", str(workdir)], str(script), Runner(out=io.StringIO()), False
    )
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_JOB_NODELIST="gpu017",
               SLURM_NTASKS="8", SLURM_JOB_ID="77", SLURM_RESTART_COUNT="1")  # fmt: skip
    result = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert result.returncode == status, result.stderr
    assert ("scontrol requeue 77" in calls.read_text()) == requeued
    rows = [json.loads(line) for line in (workdir / "launch" / "events.jsonl").open()]
    assert [(r["event"], r["attempt"]) for r in rows] == [("started", 2), (event, 2)]
    assert rows[1]["note"] == "job 77" and rows[1]["exit_status"] == status
    shown = subprocess.run(
        [sys.executable, "-m", "bert_jax.cli", "launch", "slurm", "status", "--workdir",
         str(workdir)], capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip
    assert f"restarts by cause: preempted {int(requeued)}" in shown.stdout, shown.stderr


def test_gcs_mount_script_is_valid_bash():
    assert (
        subprocess.run(["bash", "-n", os.path.join(REPO, "launch", "mount_gcs.sh")]).returncode == 0
    )


def test_slurm_submit_writes_the_script_and_calls_sbatch(tmp_path):
    calls = []
    runner = Runner(
        out=open(os.devnull, "w"),  # noqa: SIM115
        run=lambda argv, check=False, **kw: (
            calls.append(argv) or subprocess.CompletedProcess(argv, 0)
        ),
    )
    path = str(tmp_path / "job.sbatch")
    job = slurm.SlurmJob(nodes=1, requeue=False)
    slurm.write_and_submit(job, ["--config", "c"], path, runner, submit=True)
    assert calls == [["sbatch", path]]
    assert open(path, encoding="utf-8").read().endswith("bert-jax pretrain --config c\n")
    assert shlex.split(open(path).read().splitlines()[-1])[0] == "srun"


def _plan_file(tmp_path, accelerator_type="v4-32") -> str:
    """What `bert-jax plan --json` writes, reduced to what the launcher reads."""
    chosen = [
        "--config.mesh.shape=(1,16,1)",
        "--config.model.dtype=bfloat16",
        "--config.mesh.windowed_einsum=False",
    ]
    plan = {
        "accelerator_type": accelerator_type,
        "schedule": [{"phase": "phase1", "flags": chosen}, {"phase": "phase2", "flags": chosen}],
        "flags": chosen,
    }
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan), encoding="utf-8")
    return str(path)


def test_up_with_plan_settings_passes_them_to_the_preflight_and_every_worker(capsys, tmp_path):
    """`up --settings PLAN.json`: the plan's flags join PRETRAIN_ARGS in the preflight compile and
    the start on --worker=all; a key PRETRAIN_ARGS sets itself keeps the user's value."""
    mine = [*PRETRAIN, "--config.model.dtype=float32"]
    lines = _launch(
        capsys, "tpu", "up", *TPU, *SETUP_FLAGS, "--settings", _plan_file(tmp_path), "--", *mine
    )
    preflight = next(line for line in lines if "--compile-only" in line)
    (start,) = [line for line in lines if "--worker=all" in line and " pretrain " in line]
    for command in (preflight, start):
        assert "--config.mesh.shape=(1,16,1)" in command, command
        assert "--config.mesh.windowed_einsum=False" in command
        assert "--config.model.dtype=float32" in command
        assert "--config.model.dtype=bfloat16" not in command
    assert any(line.startswith("# settings from --settings") for line in lines)


def test_plan_settings_for_another_slice_are_refused(capsys, tmp_path):
    path = _plan_file(tmp_path, "v5p-16")
    argv = ["launch", "tpu", "up", *TPU, *SETUP_FLAGS, "--settings", path, "--", *PRETRAIN]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"--settings {path} was planned for v5p-16, not --accelerator-type v4-32" in err
    path = tmp_path / "not_a_plan.json"
    path.write_text("{}", encoding="utf-8")
    argv[argv.index("--settings") + 1] = str(path)
    assert cli.main(argv) == 2
    assert "not the output of `bert-jax plan --json`" in capsys.readouterr().err


# --- the pretrain arguments in either spelling, and dry runs that stay dry ---------------------

SPACED = ["--config", "configs/bert.py:base", "--workdir", "/runs/base", "--config.seed", "-3"]
EQUALS = ["--config=configs/bert.py:base", "--workdir=/runs/base", "--config.seed=-3"]


@pytest.mark.parametrize("given", [SPACED, EQUALS, [*SPACED[:2], *EQUALS[1:]]])
def test_pretrain_arguments_read_alike_in_either_spelling(given):
    from bert_jax.launch import pretrain_args

    assert pretrain_args.joined(given) == EQUALS
    assert pretrain_args.value_of(given, "workdir") == "/runs/base"
    assert slurm.workdir_in(given) == "/runs/base"
    assert pretrain_args.config_args(given) == [EQUALS[0], EQUALS[2]]
    assert pretrain_args.joined(["--dry-run", "--config", "c"]) == ["--dry-run", "--config=c"]
    assert pretrain_args.value_of(["--dry-run"], "workdir") is None


def _forbid_children(monkeypatch) -> None:
    """A dry run starts no process (no `plan`, no compile check, no gcloud)."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"a dry run started a process: {args[0] if args else kwargs}")

    monkeypatch.setattr(subprocess, "run", refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)


# The README's headline command, and the same with `--config=...` after `--`.
README_UP = [
    *("tpu", "up", "--name", "bert-base", "--zone", "us-east5-a", "--accelerator-type", "v5p-8"),
    *("--spot", "--watch", "--plan", "--dry-run"),
]


@pytest.mark.parametrize(
    "config", [["--config", "configs/bert.py:base"], ["--config=configs/bert.py:base"]]
)
def test_readme_up_watch_plan_dry_run_prints_the_plan_and_runs_nothing(
    config, capsys, monkeypatch, tmp_path
):
    _forbid_children(monkeypatch)
    monkeypatch.chdir(tmp_path)
    workdir = str(tmp_path / "runs" / "base")
    archive = str(tmp_path / "src.tar.gz")
    lines = _launch(
        capsys, *README_UP, "--archive", archive, "--", *config, "--workdir", workdir, "--x", "1"
    )
    assert lines[0] == (
        "# planning v5p-8 (not in a dry run): bert-jax plan --config=configs/bert.py:base "
        "--topology v5p-8 --json"
    )
    preflight = next(line for line in lines if "--compile-only" in line)
    assert preflight.endswith(f"--workdir {workdir} --x 1 --compile-only --topology v5p-8")
    assert any(line.startswith(f"{QR} create bert-base") and "--spot" in line for line in lines)
    assert any(" pretrain " in line and "--worker=all" in line for line in lines)
    assert lines[-1].startswith(f"# then: save the job in {workdir}/launch/ and supervise")
    assert os.listdir(tmp_path) == []  # no workdir, no job.json, no source archive


@pytest.mark.parametrize(
    "config",
    [
        ["--config", "configs/bert.py:base", "--config.model.dtype", "float32"],
        ["--config=configs/bert.py:base", "--config.model.dtype=float32"],
    ],
)
def test_plan_runs_with_the_config_in_either_spelling_and_keeps_the_users_keys(
    config, monkeypatch, capsys, tmp_path
):
    """`up --plan` (not a dry run) calls `bert-jax plan --config=FILE --topology T --json` with
    the run's --config and overrides, and adds only the keys the user did not set."""
    from bert_jax.cli import launch as launch_cli

    planned = json.loads(open(_plan_file(tmp_path, "v5p-8"), encoding="utf-8").read())
    seen = []

    def fake_plan(argv, **kwargs):
        seen.append(argv)
        return subprocess.CompletedProcess(argv, 0, stdout=json.dumps(planned))

    monkeypatch.setattr(subprocess, "run", fake_plan)
    given = [*config, "--workdir", "/runs/base"]
    args = cli.build_parser().parse_args(
        ["launch", *README_UP[:-1], "--", *given]  # README_UP without --dry-run
    )
    combined = launch_cli._with_planned_settings(args)
    (command,) = seen
    assert command[3:] == [
        "plan",
        "--config=configs/bert.py:base",
        "--config.model.dtype=float32",
        *("--topology", "v5p-8", "--json"),
    ]
    assert combined == [
        *given,
        "--config.mesh.shape=(1,16,1)",
        "--config.mesh.windowed_einsum=False",
    ]
    assert (
        "# planning v5p-8: bert-jax plan --config=configs/bert.py:base" in capsys.readouterr().out
    )


def test_watch_and_status_dry_runs_read_and_run_nothing(capsys, monkeypatch, tmp_path):
    _forbid_children(monkeypatch)
    workdir = str(tmp_path / "absent")
    (line,) = _launch(capsys, "tpu", "watch", "--workdir", workdir, "--dry-run", "--detach")
    assert line.startswith(f"# would supervise the run whose job {workdir}/launch/job.json")
    (line,) = _launch(capsys, "tpu", "status", "--workdir", workdir, "--dry-run")
    assert line.startswith(f"# would read {workdir}/launch/")
    (line,) = _launch(capsys, "slurm", "record", "started", "--workdir", workdir, "--dry-run")
    assert line == f"# would add the event started to {workdir}/launch/"
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("workdir", [["--workdir", "/shared/w"], ["--workdir=/shared/w"]])
def test_slurm_reads_the_workdir_in_either_spelling(workdir, capsys):
    lines = _launch(
        capsys, "slurm", "--nodes", "2", "--submit", "--dry-run", "--", "--config=c", *workdir
    )
    assert lines[-1] == "# then: sbatch /shared/w/bert-jax.sbatch"
    assert any("record started --workdir /shared/w" in line for line in lines)


def test_every_action_builds_the_slice_from_tpuvms_declarations():
    """An action without a slice flag (`logs` has no --accelerator-type) gets the declared
    default, as the flag of one that has it does; --name and --zone are required."""
    from bert_jax.runtime import declarations

    for action in ("create", "logs"):
        argv = ["launch", "tpu", action, "--name", "bert-base", "--zone", "z"]
        args = cli.build_parser().parse_args(argv)
        assert declarations.from_args(tpu.TpuVm, args) == tpu.TpuVm("bert-base", "z")
    assert tpu.TpuVm("bert-base", "z").accelerator_type == "v4-32"  # the documented default
    with pytest.raises(SystemExit) as exit_info:
        cli.build_parser().parse_args(["launch", "tpu", "logs", "--zone", "z"])
    assert exit_info.value.code == 2
