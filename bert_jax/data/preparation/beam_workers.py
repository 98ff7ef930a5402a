"""The FnApiRunner's worker processes on this machine (``--direct_running_mode=multi_processing``):
started ahead, as soon as the command knows it runs Beam (``LocalWorkers``), and quick to leave.

Beam starts its worker processes when the pipeline's first stage runs, each importing Beam
(about a CPU second) while this process waits; on a small input that is a good part of the job.
So ``Standbys`` starts them first, before the command imports the rest of bert-jax (JAX among
it), imports Beam and checks the run: each imports Beam's worker and the pipeline's steps on a
core this process leaves idle meanwhile, then waits for Beam's call. The command Beam is given
(``local_runner``) is a small interpreter without site-packages that claims a waiting process
(renames its ``slot-I``), hands it its environment (Beam's addresses, the worker's id and
options: ``env-I``) and waits for it to end (the lock ``lock-I`` that the waiting process holds
for life), ending with its exit status (``status-I``).
Where no process waits (Beam asks for more than were started), it becomes Beam's worker itself.

A worker ends, once Beam's worker loop returns, without the interpreter's teardown: the runner
stops its workers one after the other, each waited for, and a teardown with Beam loaded takes
about 0.2 s; the loop has sent everything (its log lines too) when it returns.

Beam is imported inside the functions that need it.
"""

from __future__ import annotations

import argparse
import fcntl
import logging
import multiprocessing
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

from bert_jax.data.preparation.beam_watch import LOG_LEVEL_OPTION

logger = logging.getLogger(__name__)

# Beam's worker, then out without the interpreter's teardown.
_RUN_WORKER = (
    "from apache_beam.runners.worker import sdk_worker_main\n"
    "try:\n"
    "    sdk_worker_main.main(sys.argv)\n"
    "    status = 0\n"
    "except BaseException:\n"
    "    import traceback; traceback.print_exc(); status = 1\n"
)
_WORKER = (
    "import os, sys\n" + _RUN_WORKER + "sys.stdout.flush(); sys.stderr.flush(); os._exit(status)\n"
)
# A waiting process: argv = [directory, index, the driver's pid].
_STANDBY = (
    "import json, os, sys, time\n"
    "from apache_beam.runners.worker import sdk_worker_main\n"
    "import bert_jax.data.preparation.beam_pipeline  # the steps' own imports, ahead\n"
    "directory, index, driver = sys.argv[1], sys.argv[2], int(sys.argv[3])\n"
    "env = os.path.join(directory, 'env-' + index)\n"
    "while not os.path.exists(env):\n"
    "    if os.getppid() != driver:  # the job is gone\n"
    "        os._exit(0)\n"
    "    time.sleep(0.005)\n"
    "with open(env) as f:\n"
    "    os.environ.update(json.load(f))\n"
    + _RUN_WORKER
    + "with open(os.path.join(directory, '.status-' + index), 'w') as f:\n"
    "    f.write(str(status))\n"
    "os.rename(os.path.join(directory, '.status-' + index), "
    "os.path.join(directory, 'status-' + index))\n"
    "sys.stdout.flush(); sys.stderr.flush(); os._exit(status)\n"
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
    to ``log_path``; None: to this terminal). ``close`` ends those that Beam did not call."""

    def __init__(self, count: int, log_path: str | None):
        self.directory = tempfile.mkdtemp(prefix="bert-jax-beam-workers-")
        self.log_path = log_path
        self.processes: list[subprocess.Popen] = []
        stderr = None if log_path is None else open(log_path, "ab")
        try:
            for index in range(count):
                name = f"{index:04d}"
                lock = os.open(os.path.join(self.directory, f"lock-{name}"), os.O_CREAT | os.O_RDWR)
                try:
                    # Locked before it starts, so that a claim waits for it however slow its start.
                    fcntl.flock(lock, fcntl.LOCK_EX)
                    argv = [sys.executable, "-c", _STANDBY, self.directory, name, str(os.getpid())]
                    self.processes.append(subprocess.Popen(argv, stderr=stderr, pass_fds=(lock,)))
                finally:
                    os.close(lock)  # the lock stays with the child's copy
                open(os.path.join(self.directory, f"slot-{name}"), "w").close()
        except BaseException:
            self.close()
            raise
        finally:
            if stderr is not None:
                stderr.close()

    def command(self) -> str:
        """The worker command for Beam: claim a waiting process, or be the worker."""
        claim = _CLAIM.format(worker=_WORKER)
        return _command(sys.executable, "-S", "-c", claim, self.directory, log_path=self.log_path)

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)


class LocalWorkers:
    """The FnApiRunner's worker processes on this machine that ``beam_args`` ask for
    (``Standbys``; none for another runner), started as soon as the command knows
    it runs Beam: each imports Beam and the pipeline's steps (about a CPU second) while the
    launching process imports the rest and checks the run, so they are ready, together, when
    the first stage starts. What they print goes to a file kept only where the job fails with
    a bug (unless Beam's log level option shows it)."""

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
