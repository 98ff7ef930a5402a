"""The FnApiRunner's worker processes on this machine (``--direct_running_mode=multi_processing``):
started ahead, as soon as the command knows it runs Beam (``LocalWorkers``), and quick to leave.

Beam starts its worker processes when the pipeline's first stage runs, each importing Beam
(about a CPU second) while this process waits; on a small input that is a good part of the job.
So ``Standbys`` starts them first, before the command imports the rest of bert-jax, imports
Beam and checks the run: one interpreter imports Beam's worker and the pipeline's steps, on a
core this process leaves idle meanwhile, then forks a copy of itself per worker
(``serve_standbys``): Beam is imported once, not once per worker, and every worker is ready at
the same moment. Each copy waits for Beam's call. The command Beam is given (``local_runner``)
is a small interpreter without site-packages that claims a waiting process (renames its
``slot-I``), hands it its environment (Beam's addresses, the worker's id and options:
``env-I``) and waits for it to end (the lock ``lock-I`` that the waiting process holds for
life), ending with its exit status (``status-I``).
Where no process waits (Beam asks for more than were started), it becomes Beam's worker itself.

A worker ends, once Beam's worker loop returns, without the interpreter's teardown (``_leave``).
The forking process stays as the workers' parent: it reaps them (so their CPU time is the
command's), and ends them where the command ends first.

Beam is imported inside the functions that need it; this module imports nothing else of
bert-jax, so the workers start before the command imports NumPy.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import logging
import multiprocessing
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

# Beam's own option for its log level; without it Beam's lines below ERROR are hidden
# (``beam_watch``), and the workers' output goes to a file.
LOG_LEVEL_OPTION = "default_sdk_harness_log_level"

logger = logging.getLogger(__name__)

# Where no process waits: Beam's worker in a fresh interpreter.
_WORKER = "from bert_jax.data.preparation import beam_workers\nbeam_workers.be_the_worker()\n"
# The waiting processes (``serve_standbys``): argv = [directory, INDEX:FD ...]. The process
# imports Beam's worker and the pipeline's steps (their own imports) before it forks, so that
# the forks share them. (The pipeline imports this module: the import is the process's, not
# this module's.)
_STANDBY = (
    "import sys\n"
    "from apache_beam.runners.worker import sdk_worker_main\n"
    "from bert_jax.data.preparation import beam_pipeline, beam_workers\n"
    "beam_workers.serve_standbys(sys.argv[1], sys.argv[2:])\n"
)
# What Beam runs for each worker: argv = [directory].
_CLAIM = (
    "import fcntl, json, os, sys\n"
    "directory = sys.argv[1]\n"
    "for name in sorted(os.listdir(directory)):\n"
    "    if not name.startswith('slot-'):\n"
    "        continue\n"
    "    index = name[len('slot-'):]\n"
    "    try:\n"
    "        os.rename(os.path.join(directory, name), os.path.join(directory, 'taken-' + index))\n"
    "    except FileNotFoundError:  # another worker's\n"
    "        continue\n"
    "    with open(os.path.join(directory, '.env-' + index), 'w') as f:\n"
    "        json.dump(dict(os.environ), f)\n"
    "    os.rename(os.path.join(directory, '.env-' + index), "
    "os.path.join(directory, 'env-' + index))\n"
    "    with open(os.path.join(directory, 'lock-' + index)) as f:\n"
    "        fcntl.flock(f, fcntl.LOCK_SH)  # held by the waiting process until it ends\n"
    "    try:\n"
    "        with open(os.path.join(directory, 'status-' + index)) as f:\n"
    "            sys.exit(int(f.read()))\n"
    "    except FileNotFoundError:  # it died\n"
    "        sys.exit(1)\n"
    "os.execv(sys.executable, [sys.executable, '-c', {worker!r}])\n"
)


def _command(*argv: str, log_path: str | None) -> str:
    command = " ".join(shlex.quote(part) for part in argv)
    return command if log_path is None else f"{command} 2>>{shlex.quote(log_path)}"


class Standbys:
    """``count`` worker processes started now, waiting for Beam's call (their output, stderr,
    to ``log_path``; None: to this terminal): one interpreter that imports Beam's worker and the
    steps once, then forks a copy per worker (``serve_standbys``). ``close`` ends those that
    Beam did not call."""

    def __init__(self, count: int, log_path: str | None):
        self.directory = tempfile.mkdtemp(prefix="bert-jax-beam-workers-")
        self.log_path = log_path
        self.server: subprocess.Popen | None = None  # serve_standbys
        stderr = None if log_path is None else open(log_path, "ab")
        locks: dict[str, int] = {}
        try:
            for index in range(count):
                name = f"{index:04d}"
                locks[name] = os.open(
                    os.path.join(self.directory, f"lock-{name}"), os.O_CREAT | os.O_RDWR
                )
                # Locked before the processes start, so that a claim waits for its worker
                # however slow its start.
                fcntl.flock(locks[name], fcntl.LOCK_EX)
            held = [f"{name}:{lock}" for name, lock in locks.items()]
            argv = [sys.executable, "-c", _STANDBY, self.directory, *held]
            self.server = subprocess.Popen(argv, stderr=stderr, pass_fds=tuple(locks.values()))
            for name in locks:
                open(os.path.join(self.directory, f"slot-{name}"), "w").close()
        except BaseException:
            self.close()
            raise
        finally:
            for lock in locks.values():
                os.close(lock)  # each lock stays with its worker's copy
            if stderr is not None:
                stderr.close()

    def command(self) -> str:
        """The worker command for Beam: claim a waiting process, or be the worker."""
        claim = _CLAIM.format(worker=_WORKER)
        return _command(sys.executable, "-S", "-c", claim, self.directory, log_path=self.log_path)

    def close(self) -> None:
        """Ends the workers Beam did not call (and any other still there), once their parent
        has reaped them: their CPU time is the command's."""
        if self.server is not None:
            if self.server.poll() is None:
                self.server.terminate()  # serve_standbys ends its workers and waits for them
                try:
                    self.server.wait(timeout=_CLOSE_SECONDS)
                except subprocess.TimeoutExpired:
                    self.server.kill()
            self.server.wait()
        shutil.rmtree(self.directory, ignore_errors=True)


# How long ``Standbys.close`` waits for the waiting processes to end before it kills them.
_CLOSE_SECONDS = 10.0
# How often a waiting process looks for Beam's call, and their parent for the command's end.
_CLAIM_POLL_SECONDS = 0.005
_PARENT_POLL_SECONDS = 0.05


def serve_standbys(directory: str, held: list[str]) -> None:
    """``Standbys``' process (``_STANDBY``, which has imported Beam's worker and the pipeline's
    steps): forks a waiting copy per worker (``held``: ``INDEX:FD``, the lock each holds for
    life; a fork shares what was imported, so Beam is imported once, not once per worker). It
    stays as their parent: reaps them, and ends them (and itself) when the command ends or
    asks (SIGTERM, ``Standbys.close``)."""
    command = os.getppid()
    locks = [(index, int(fd)) for index, fd in (entry.split(":") for entry in held)]
    children: list[int] = []

    def end(*_) -> None:
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)  # a worker that is done is only reaped
            except ProcessLookupError:
                pass
        for pid in children:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        os._exit(0)

    signal.signal(signal.SIGTERM, end)
    for index, lock in locks:
        pid = os.fork()
        if pid == 0:  # never back into this loop, whatever happens
            try:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                for _, other in locks:
                    if other != lock:
                        os.close(other)
                _standby(directory, index)
            finally:
                os._exit(1)
        children.append(pid)
    for _, lock in locks:
        os.close(lock)
    while children:
        if os.getppid() != command:  # the command is gone
            end()
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid:
            children.remove(pid)
        else:
            time.sleep(_PARENT_POLL_SECONDS)
    os._exit(0)


def _standby(directory: str, index: str) -> None:
    """A waiting worker: Beam's environment from its claim (``env-INDEX``), then Beam's worker
    loop; its exit status to ``status-INDEX``; out without the interpreter's teardown."""
    parent = os.getppid()
    env = os.path.join(directory, f"env-{index}")
    while not os.path.exists(env):
        if os.getppid() != parent:  # the command is gone
            os._exit(0)
        time.sleep(_CLAIM_POLL_SECONDS)
    with open(env) as f:
        os.environ.update(json.load(f))
    status = _beam_worker()
    with open(os.path.join(directory, f".status-{index}"), "w") as f:
        f.write(str(status))
    os.rename(
        os.path.join(directory, f".status-{index}"), os.path.join(directory, f"status-{index}")
    )
    _leave(status)


def be_the_worker() -> None:
    """A claim where no process waits: Beam's worker in this process, then out."""
    _leave(_beam_worker())


def _beam_worker() -> int:
    """Beam's worker loop (its addresses and options from the environment); its exit status."""
    from apache_beam.runners.worker import sdk_worker_main

    try:
        sdk_worker_main.main(sys.argv)
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def _leave(status: int) -> None:
    """Out without the interpreter's teardown: the runner stops its workers one after the
    other, each waited for, and a teardown with Beam loaded takes about 0.2 s; Beam's worker
    loop has sent everything (its log lines too) when it returns."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


class LocalWorkers:
    """The FnApiRunner's worker processes on this machine that ``beam_args`` ask for
    (``Standbys``; none for another runner), started as soon as the command knows
    it runs Beam: Beam and the pipeline's steps are imported for them (about a CPU second,
    once) while the launching process imports the rest and checks the run, so they are ready,
    together, when the first stage starts. What they print goes to a file kept only where the
    job fails with a bug (unless Beam's log level option shows it)."""

    def __init__(self, beam_args: list[str]):
        count, shown = planned(beam_args)
        self.log = None
        if count and not shown:
            self.log = os.path.join(tempfile.mkdtemp(prefix="bert-jax-beam-"), "workers.log")
        self.standbys = Standbys(count, self.log) if count else None
        self.closed = False

    def close(self, failed: bool = False) -> None:
        """Ends the processes Beam did not call; their output's file goes, unless ``failed``
        (a bug, not a user error: its path is logged). Once: a second call does nothing."""
        if self.closed:
            return
        self.closed = True
        if self.standbys is not None:
            self.standbys.close()
        if self.log is not None:
            if failed and os.path.exists(self.log):
                logger.error("Beam's worker processes' output: %s", self.log)
            else:
                shutil.rmtree(os.path.dirname(self.log), ignore_errors=True)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # raised, not printed: Beam's own parser says it
        raise ValueError(message)


def planned(beam_args: list[str]) -> tuple[int, bool]:
    """What Beam's options ``beam_args`` ask of the FnApiRunner, read before Beam is imported,
    as Beam reads the options that tell: its worker processes (0: none, or another runner) and
    whether their log lines are shown (``LOG_LEVEL_OPTION``). Options Beam would refuse: 0
    (Beam says what is wrong with them)."""
    parser = _Parser(add_help=False, allow_abbrev=False, exit_on_error=False)
    parser.add_argument("--runner")
    parser.add_argument("--direct_num_workers", type=int, default=1)
    parser.add_argument("--direct_running_mode", default="in_memory")
    parser.add_argument(f"--{LOG_LEVEL_OPTION}")
    try:
        known, _ = parser.parse_known_args(list(beam_args))
    except (argparse.ArgumentError, ValueError):
        return 0, False
    shown = getattr(known, LOG_LEVEL_OPTION) is not None
    if known.runner or known.direct_running_mode != "multi_processing":
        return 0, shown
    return known.direct_num_workers or multiprocessing.cpu_count(), shown


def local_runner(options, standbys: Standbys | None):
    """The FnApiRunner for ``options``; with ``--direct_running_mode=multi_processing``, with
    ``standbys``' processes as its workers (None: Beam's own command)."""
    from apache_beam.options.pipeline_options import DirectOptions
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner
    from apache_beam.transforms.environments import SubprocessSDKEnvironment

    if standbys is None or options.view_as(DirectOptions).direct_running_mode != "multi_processing":
        return FnApiRunner()
    # In "multi_processing" the runner would replace this environment with its own command.
    options.view_as(DirectOptions).direct_running_mode = "in_memory"
    environment = SubprocessSDKEnvironment.from_command_string(standbys.command())
    return FnApiRunner(default_environment=environment)
