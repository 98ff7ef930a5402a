"""`bert-jax launch tpu`: pretraining on a Cloud TPU VM slice (one host or a pod slice).

Actions, each a short sequence of `gcloud compute tpus tpu-vm` commands:

  create  describe the TPU VM; create it only when it does not exist (reuse otherwise)
  setup   pack this source tree (pyproject.toml, README.md, bert_jax/, configs/, launch/), copy
          it to every worker (`scp --worker=all`), install it with `jax[tpu]` in a virtualenv
  run     start `bert-jax pretrain ARGS` on every worker at once, detached (nohup), logging to
          `~/REMOTE_DIR/run.log`, with BERT_JAX_DISTRIBUTED=on so that every worker joins the job
          through `jax.distributed` (the TPU metadata names the workers); then stream worker 0's log
  logs    stream a worker's log (worker 0 by default)
  stop    SIGTERM the run on every worker: JAX's preemption notice makes all hosts save a
          checkpoint at the same step and exit; `run` again resumes
  delete  delete the TPU VM
  up      preflight + create + setup + run: the job is first compiled here for the accelerator
          type (`pretrain --compile-only --topology`); one that cannot fit never starts billing.
          The slice comes through a queued resource (queued.py) unless `--no-queued`; `--watch`
          then keeps the run alive (supervisor.py)
  watch   the supervisor alone, for a run already started (its settings are in the workdir)
  status  what `<workdir>/launch/events.jsonl` and the heartbeats say (events.py)

Workers run from `~/REMOTE_DIR/src`, so config paths like `configs/bert.py:base` work; the workdir
and data must be paths every worker sees (a bucket mounted with Cloud Storage FUSE, or Filestore),
see launch/README.md.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import sys
import tarfile
from collections.abc import Callable, Iterable, Mapping, Sequence

from bert_jax.launch import LaunchError, Runner, cloud_state
from bert_jax.runtime.declarations import setting
from bert_jax.runtime.errors import EXIT_DOES_NOT_FIT

SOURCE_ITEMS = ("pyproject.toml", "README.md", "bert_jax", "configs", "launch")
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class DoesNotFit(LaunchError):
    """The preflight compile check says the job does not fit the slice (exit status 4)."""


def _home(path: str) -> str:
    """A path under the remote home directory, safe in a shell command line."""
    return '"$HOME"/' + shlex.quote(path)


def default_jax_spec() -> str:
    """`jax[tpu]` pinned to the jax version installed here (the one the code was tested with)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"jax[tpu]=={version('jax')}"
    except PackageNotFoundError:
        return "jax[tpu]"


@dataclasses.dataclass(frozen=True)
class TpuVm:
    """One TPU VM (a single host or a pod slice) and where bert-jax lives on its workers. Each
    setting is declared once here: `launch tpu`'s flags, their help and the defaults of an
    action that has no flag for one derive from the declarations (`--name` and `--zone`, which
    have no default, are required flags; `spot` is set by `--spot`, one of the capacity kinds)."""

    name: str = setting(
        "",
        "TPU VM name: lowercase letters, digits and hyphens, starting with a letter (at most 63 "
        "characters)",
    )
    zone: str = setting("", "the TPU VM's zone, e.g. us-central2-b")
    project: str | None = setting(
        None, "Google Cloud project", zero="default: gcloud's configured project"
    )
    accelerator_type: str = setting("v4-32", "TPU slice to create")
    version: str = setting("tpu-ubuntu2204-base", "TPU VM software")
    spot: bool = setting(False, "Spot capacity (--spot)", flag="")
    remote_dir: str = setting("bert-jax", "directory under each worker's home")

    def __post_init__(self):
        if not _NAME.match(self.name):
            raise LaunchError(
                f"TPU VM name {self.name!r} is not valid: use lowercase letters, digits and "
                "hyphens, starting with a letter (at most 63 characters)"
            )
        if not self.zone:
            raise LaunchError("--zone is required (e.g. us-central2-b)")
        if not self.remote_dir or self.remote_dir.startswith(("/", "~")) or ".." in self.remote_dir:
            raise LaunchError(
                f"--remote-dir {self.remote_dir!r} must be a relative path under the home directory"
            )

    # --- gcloud commands --------------------------------------------------------------------
    def _gcloud(self, verb: str, *args: str) -> list[str]:
        where = [f"--zone={self.zone}"] + ([f"--project={self.project}"] if self.project else [])
        return ["gcloud", "compute", "tpus", "tpu-vm", verb, *args, *where]

    def describe_command(self) -> list[str]:
        return self._gcloud("describe", self.name) + ["--format=value(state)"]

    def create_command(self) -> list[str]:
        command = self._gcloud("create", self.name) + [
            f"--accelerator-type={self.accelerator_type}",
            f"--version={self.version}",
        ]
        return command + (["--spot"] if self.spot else [])

    def delete_command(self) -> list[str]:
        return self._gcloud("delete", self.name) + ["--quiet"]

    def ssh_command(self, remote_command: str, worker: str | int = "all") -> list[str]:
        return self._gcloud("ssh", self.name) + [
            f"--worker={worker}",
            f"--command={remote_command}",
        ]

    def scp_command(self, local_path: str, remote_path: str) -> list[str]:
        return self._gcloud("scp", local_path, f"{self.name}:{remote_path}") + ["--worker=all"]

    # --- remote shell command lines ---------------------------------------------------------
    def path(self, *parts: str) -> str:
        return "/".join((self.remote_dir, *parts))

    def install_script(self, jax_spec: str, setup_commands: Sequence[str] = ()) -> str:
        """Unpack the source and install it (editable) with `jax_spec` into REMOTE_DIR/venv."""
        src, venv = _home(self.path("src")), _home(self.path("venv"))
        pip = _home(self.path("venv", "bin", "pip"))
        lines = [
            "set -e",
            f"rm -rf {src} && mkdir -p {src}",
            f"tar -xzf {_home(self.path('src.tar.gz'))} -C {src}",
            f"test -x {_home(self.path('venv', 'bin', 'python'))} || python3 -m venv {venv} || "
            "{ sudo apt-get update -qq && sudo apt-get install -y -qq python3-venv && "
            f"python3 -m venv {venv}; }}",
            f"{pip} install -q --upgrade pip",
            f"{pip} install -q {shlex.quote(jax_spec)} -e {src}",
            *setup_commands,  # the user's own shell lines, as given (e.g. a gcsfuse mount)
        ]
        return "; ".join(lines)

    def start_script(self, pretrain_args: Sequence[str], env: Mapping[str, str]) -> str:
        """Start `bert-jax pretrain` detached; refuse when a run is still alive on the worker.

        A small bash wrapper waits for the run and writes its exit status to `run.exit`
        (`status_script` reads it); `run.pid` holds the run's own pid (what `stop` signals),
        `run.started` marks a start before that pid is known. The wrapper also tells the run
        where its log is (BERT_JAX_LOG_FILE), which the heartbeat copies into the workdir."""
        pid, log = _home(self.path("run.pid")), _home(self.path("run.log"))
        status, started = _home(self.path("run.exit")), _home(self.path("run.started"))
        program = [
            "env",
            *(f"{key}={value}" for key, value in env.items()),
            "../venv/bin/bert-jax",
            "pretrain",
            *pretrain_args,
        ]
        wrapper = (
            f'export BERT_JAX_LOG_FILE={log}; "$@" & echo $! > {pid}; wait $!; echo $? > {status}'
        )
        return (
            f"cd {_home(self.path('src'))} && "
            f'if [ -f {pid} ] && kill -0 "$(cat {pid})" 2>/dev/null; then '
            "echo 'bert-jax: a run is still going on this worker; stop it first' >&2; exit 1; fi; "
            f"rm -f {pid} {status}; date +%s > {started}; "
            f"nohup {shlex.join(['bash', '-c', wrapper, 'bert-jax', *program])} > {log} 2>&1 "
            "< /dev/null &"
        )

    def status_script(self) -> str:
        """One line per worker: `bert-jax-job: running | starting | exited N | none`."""
        pid, status = _home(self.path("run.pid")), _home(self.path("run.exit"))
        started = _home(self.path("run.started"))
        return (
            f'if [ -f {pid} ] && kill -0 "$(cat {pid})" 2>/dev/null; then s=running; '
            f'elif [ -f {status} ]; then s="exited $(cat {status})"; '
            f"elif [ -f {started} ]; then s=starting; else s=none; fi; "
            'echo "bert-jax-job: $s"'
        )

    def kill_script(self) -> str:
        """SIGKILL the run on a worker (after `stop`'s SIGTERM had its time)."""
        pid = _home(self.path("run.pid"))
        return f'if [ -f {pid} ]; then kill -KILL "$(cat {pid})" 2>/dev/null; fi; true'

    def tail_script(self, lines: int = 20) -> str:
        """The last lines of each worker's log, each prefixed with the worker's host name."""
        log = _home(self.path("run.log"))
        return f'tail -n {int(lines)} {log} 2>/dev/null | sed "s/^/[$(hostname)] /"'

    def logs_script(self) -> str:
        return f"tail -n +1 -F {_home(self.path('run.log'))}"

    def stop_script(self) -> str:
        pid = _home(self.path("run.pid"))
        return (
            f'if [ -f {pid} ] && kill -TERM "$(cat {pid})" 2>/dev/null; then '
            'echo "sent SIGTERM to bert-jax on $(hostname)"; else '
            'echo "no bert-jax run on $(hostname)"; fi'
        )


def parse_env(pairs: Iterable[str]) -> dict[str, str]:
    """KEY=VALUE strings -> dict; names must be shell variable names."""
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not _ENV_NAME.match(key):
            raise LaunchError(f"--env {pair!r}: use NAME=VALUE with a shell variable name")
        env[key] = value
    return env


def run_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """What every worker's `bert-jax pretrain` gets: join the job via jax.distributed (the TPU
    metadata names the workers), quiet TensorFlow, then the user's `--env` settings."""
    env = {"BERT_JAX_DISTRIBUTED": "on", "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.update(extra or {})
    return env


def pack_source(source_dir: str, archive: str) -> str:
    """A .tar.gz of what a worker needs to install and run (SOURCE_ITEMS, no caches)."""
    missing = [
        item
        for item in ("pyproject.toml", "bert_jax")
        if not os.path.exists(os.path.join(source_dir, item))
    ]
    if missing:
        raise LaunchError(f"--source {source_dir} is not a bert-jax checkout (no {missing[0]})")

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        base = os.path.basename(info.name)
        return None if base == "__pycache__" or base.endswith(".pyc") else info

    os.makedirs(os.path.dirname(os.path.abspath(archive)), exist_ok=True)
    with tarfile.open(archive, "w:gz") as tar:
        for item in SOURCE_ITEMS:
            path = os.path.join(source_dir, item)
            if os.path.exists(path):
                tar.add(path, arcname=item, filter=keep)
    return archive


def default_source_dir() -> str:
    """The checkout this bert_jax package was imported from."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# --- actions ----------------------------------------------------------------------------------


def create(vm: TpuVm, runner: Runner) -> None:
    if runner.dry_run:
        runner(vm.describe_command())
        runner.note("only when the describe above answers NOT_FOUND (no such TPU VM):")
        runner(vm.create_command())
        return
    # Only the service's NOT_FOUND leads to a create; a describe that fails otherwise stops here
    # (an ApiError, exit status 1) rather than create a second VM of the same name.
    current = cloud_state(runner, vm.describe_command(), f"TPU VM {vm.name}")
    if current is not None:
        runner.note(f"reusing TPU VM {vm.name} in {vm.zone} ({current})")
        return
    runner(vm.create_command())


def setup(
    vm: TpuVm,
    runner: Runner,
    *,
    source_dir: str,
    archive: str,
    jax_spec: str,
    setup_commands: Sequence[str] = (),
) -> None:
    runner.note(f"pack {' '.join(SOURCE_ITEMS)} of {source_dir} into {archive}")
    if not runner.dry_run:
        pack_source(source_dir, archive)
    runner(vm.ssh_command(f"mkdir -p {_home(vm.remote_dir)}"))
    runner(vm.scp_command(archive, vm.path("src.tar.gz")))
    runner(vm.ssh_command(vm.install_script(jax_spec, setup_commands)))


def preflight_command(vm: TpuVm, pretrain_args: Sequence[str]) -> list[str]:
    """The local compile check of the job for the VM's accelerator type (`pretrain
    --compile-only --topology`): it needs no TPU, so it runs before anything is created."""
    return [
        sys.executable, "-m", "bert_jax.cli", "pretrain", *pretrain_args,
        "--compile-only", "--topology", vm.accelerator_type,
    ]  # fmt: skip


def preflight(vm: TpuVm, runner: Runner, pretrain_args: Sequence[str], source_dir: str) -> None:
    """Runs the compile check in `source_dir` (where the config paths of `pretrain_args` lead, as
    on the workers); a job that does not fit, or a bad config, stops the launch here."""
    runner.note(
        f"preflight (in {source_dir}): compile the step for {vm.accelerator_type} before "
        "creating anything; --skip-preflight skips it"
    )
    status = runner(preflight_command(vm, pretrain_args), check=False, cwd=source_dir)
    if status == EXIT_DOES_NOT_FIT:
        raise DoesNotFit(
            f"preflight: this job does not fit {vm.accelerator_type} (see above); nothing was "
            "created. Change the mesh, batch or accumulation (`bert-jax plan` searches them), or "
            "pass --skip-preflight"
        )
    if status != 0:
        raise LaunchError(
            f"preflight: the compile check for {vm.accelerator_type} failed (exit status "
            f"{status}, see above); nothing was created (--skip-preflight to launch anyway)"
        )


def run(
    vm: TpuVm,
    runner: Runner,
    pretrain_args: Sequence[str],
    env: Mapping[str, str] | None = None,
    follow: bool = True,
) -> None:
    if not pretrain_args:
        raise LaunchError(
            "nothing to run: give the pretrain arguments after --, e.g. -- --config "
            "configs/bert.py:base --workdir /gcs/BUCKET/runs/base"
        )
    runner(vm.ssh_command(vm.start_script(pretrain_args, run_environment(env))))
    if follow:
        logs(vm, runner)


def logs(vm: TpuVm, runner: Runner, worker: int = 0) -> None:
    runner(vm.ssh_command(vm.logs_script(), worker=worker), check=False)


def stop(vm: TpuVm, runner: Runner) -> None:
    runner(vm.ssh_command(vm.stop_script()))


def delete(vm: TpuVm, runner: Runner) -> None:
    runner(vm.delete_command())


ACTIONS = ("up", "create", "setup", "run", "logs", "stop", "delete")


def perform(
    action: str,
    vm: TpuVm,
    runner: Runner,
    *,
    pretrain_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    follow: bool = True,
    source_dir: str | None = None,
    archive: str | None = None,
    jax_spec: str | None = None,
    setup_commands: Sequence[str] = (),
    worker: int = 0,
    check_fit: bool = True,
    create_slice: Callable[[], None] | None = None,
    delete_slice: Callable[[], None] | None = None,
) -> None:
    """One `bert-jax launch tpu ACTION` (see the module docstring); `up` first compiles the job
    for the accelerator type here (`preflight`) unless `check_fit` is False. `create_slice` and
    `delete_slice` replace the direct `tpu-vm create/delete` (queued resources: queued.py)."""
    if action not in ACTIONS:
        raise LaunchError(f"unknown action {action!r}; use one of {', '.join(ACTIONS)}")
    if action in ("up", "run") and not pretrain_args:
        run(vm, runner, pretrain_args)  # raises, before anything is created
    runner.require("gcloud")
    if action == "up" and check_fit:
        preflight(vm, runner, pretrain_args, source_dir or default_source_dir())
    if action in ("up", "create"):
        create_slice() if create_slice else create(vm, runner)
    if action in ("up", "setup"):
        import tempfile

        setup(
            vm,
            runner,
            source_dir=source_dir or default_source_dir(),
            archive=archive
            or os.path.join(tempfile.gettempdir(), f"bert-jax-src-{vm.name}.tar.gz"),
            jax_spec=jax_spec or default_jax_spec(),
            setup_commands=setup_commands,
        )
    if action in ("up", "run"):
        run(vm, runner, pretrain_args, env, follow=follow)
    if action == "logs":
        logs(vm, runner, worker)
    if action == "stop":
        stop(vm, runner)
    if action == "delete":
        delete_slice() if delete_slice else delete(vm, runner)
