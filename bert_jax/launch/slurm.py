"""`bert-jax launch slurm`: an sbatch script for GPU nodes (one process per GPU or per node).

The script exports the coordinator (first host of `scontrol show hostnames $SLURM_JOB_NODELIST`
and a port), the number of processes (`$SLURM_NTASKS`) and which devices a process drives, then
starts one `bert-jax pretrain` per task with `srun`; each task takes its process id from
`$SLURM_PROCID` (see bert_jax/runtime/distributed.py). `srun --kill-on-bad-exit=1` ends the
whole job when one task fails, and JAX's heartbeat does the same when a node vanishes.

Unattended: the job is `--requeue`able (SLURM puts it back in the queue after a node failure or
a preemption), and `--signal=TERM@SECONDS` has SLURM send SIGTERM to every task that long before
the time limit: the run saves a checkpoint at the same step on every host and exits 143, and the
script then requeues the job itself (`scontrol requeue`), which resumes from the workdir. Each
start and end is a row of `<workdir>/launch/events.jsonl` (`bert-jax launch slurm record`),
which `bert-jax launch slurm status --workdir W` reads, as `launch tpu status` does.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import shlex
from collections.abc import Sequence

from bert_jax.launch import LaunchError, Runner, durations
from bert_jax.launch import pretrain_args as pretrain_args_lib
from bert_jax.runtime import declarations
from bert_jax.runtime.declarations import setting
from bert_jax.runtime.errors import EXIT_STOPPED

PER_CHOICES = ("gpu", "node")
# The script's mark: `write_and_submit` replaces only a file that carries it.
WRITTEN_BY = "# Written by `bert-jax launch slurm`"
# #SBATCH lines are read by sbatch, not by a shell: values are restricted instead of quoted.
_DIRECTIVE_VALUE = re.compile(r"^[A-Za-z0-9_.:,=+@%/\-\[\]]+$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _whole_seconds(text: str) -> int:
    """`--signal-before`'s value: a duration (`5m`, `300`) in whole seconds."""
    seconds = durations.seconds(text)
    if not math.isfinite(seconds):
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (e.g. 5m)")
    return int(seconds)


_DEFAULT_SLURMS = "default: SLURM's"


@dataclasses.dataclass(frozen=True)
class SlurmJob:
    """One sbatch job: each setting declared once here; `launch slurm`'s flags, their help and
    the checks derive from the declarations. `setup`, `env` and `sbatch_options` take a line
    each time their flag is given (declared without a flag: cli/launch.py adds the repeated
    flag)."""

    nodes: int | None = setting(None, "nodes to run on (required to write a script)", low=1)
    gpus_per_node: int = setting(8, "GPUs on each node", low=1)
    per: str = setting(
        "gpu", "one process per GPU, or per node (driving all its GPUs)", choices=PER_CHOICES
    )
    job_name: str = setting("bert-jax", "sbatch --job-name")
    partition: str | None = setting(None, "sbatch --partition", zero=_DEFAULT_SLURMS)
    account: str | None = setting(None, "sbatch --account", zero=_DEFAULT_SLURMS)
    time: str | None = setting(None, "sbatch --time, e.g. 4-00:00:00", zero=_DEFAULT_SLURMS)
    cpus_per_task: int | None = setting(None, "sbatch --cpus-per-task", low=1, zero=_DEFAULT_SLURMS)
    port: int | None = setting(
        None, "the coordinator's TCP port", low=1, high=65535, zero="default: from the job id"
    )
    output: str | None = setting(
        None, "SLURM's log", zero="default: JOB_NAME-%%j.out beside the script"
    )
    bert_jax: str = setting("bert-jax", "the executable on the nodes")
    setup: tuple[str, ...] = setting(
        (), "shell lines run first (module load, source venv/bin/activate)", flag=""
    )
    env: tuple[tuple[str, str], ...] = setting((), "extra environment, NAME=VALUE", flag="")
    sbatch_options: tuple[str, ...] = setting(
        (), "extra #SBATCH directives, e.g. --exclusive, --mem=0", flag=""
    )
    requeue: bool = setting(
        True,
        "requeue after a preemption or node failure, and SIGTERM before the time limit "
        "(--no-requeue: the job ends at its time limit)",
    )
    signal_seconds: int = setting(
        300,
        "SIGTERM the run this long before the time limit: it saves, then is requeued",
        flag="signal-before",
        low=0,
        parse=_whole_seconds,
        show=durations.text,
        metavar="DURATION",
        zero="0: none",
    )

    def __post_init__(self):
        # `--sbatch-option mem=0` reads better on a command line than `--sbatch-option=--mem=0`.
        options = tuple(o if o.startswith("-") else f"--{o}" for o in self.sbatch_options)
        object.__setattr__(self, "sbatch_options", options)
        if self.nodes is None:
            raise LaunchError("--nodes is required (the number of nodes to run on)")
        for problem in declarations.problems(self):
            raise LaunchError(problem)
        declared = declarations.declarations(SlurmJob)
        for flag, value in (
            *(
                (declarations.flag_name(name, declared[name]), getattr(self, name))
                for name in ("job_name", "partition", "account", "time", "output")
            ),
            *(("--sbatch-option", option) for option in self.sbatch_options),
        ):
            if value is not None and not _DIRECTIVE_VALUE.match(value):
                raise LaunchError(
                    f"{flag} {value!r} cannot go into an #SBATCH line: use letters, digits and "
                    "_ . : , = + @ % / - [ ] only"
                )
        for key, _ in self.env:
            if not _ENV_NAME.match(key):
                raise LaunchError(f"--env {key!r}: not a shell variable name")

    @property
    def tasks_per_node(self) -> int:
        return self.gpus_per_node if self.per == "gpu" else 1

    def script(self, pretrain_args: Sequence[str]) -> str:
        if not pretrain_args:
            raise LaunchError(
                "nothing to run: give the pretrain arguments after --, e.g. -- --config "
                "configs/bert.py:base --workdir /shared/runs/base"
            )
        processes = self.nodes * self.tasks_per_node
        unit = "GPU" if self.per == "gpu" else "node"
        directives = [
            f"--job-name={self.job_name}",
            f"--nodes={self.nodes}",
            f"--ntasks-per-node={self.tasks_per_node}",
            f"--gpus-per-node={self.gpus_per_node}",
        ]
        if self.cpus_per_task:
            directives.append(f"--cpus-per-task={self.cpus_per_task}")
        for flag, value in (
            ("time", self.time),
            ("partition", self.partition),
            ("account", self.account),
        ):
            if value:
                directives.append(f"--{flag}={value}")
        directives.append(f"--output={self.output or self.job_name + '-%j.out'}")
        if self.requeue:
            directives.append("--requeue")
            if self.signal_seconds:
                directives.append(f"--signal=TERM@{self.signal_seconds}")
        directives.extend(self.sbatch_options)
        port = str(self.port) if self.port else "$((SLURM_JOB_ID % 4096 + 61440))"
        devices = "local-rank" if self.per == "gpu" else "all"
        lines = [
            "#!/bin/bash",
            *(f"#SBATCH {d}" for d in directives),
            f"{WRITTEN_BY}: {self.nodes} node(s) x {self.gpus_per_node} "
            f"GPU(s), one process per {unit} ({processes} processes).",
            *self.setup,  # before `set -eu`: activate scripts and `module` may use unset names
            "set -eu",
            "# Process 0 (first task, first node) hosts the coordinator; each task reads its "
            "process id from SLURM_PROCID.",
            'coordinator_host="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"',
            f'export BERT_JAX_COORDINATOR="$coordinator_host:{port}"',
            'export BERT_JAX_NUM_PROCESSES="$SLURM_NTASKS"',
            f"export BERT_JAX_LOCAL_DEVICE_IDS={devices}",
            "export TF_CPP_MIN_LOG_LEVEL=2",
            *(f"export {key}={shlex.quote(value)}" for key, value in self.env),
        ]
        srun = shlex.join(
            ["srun", "--kill-on-bad-exit=1", self.bert_jax, "pretrain", *pretrain_args]
        )
        workdir = workdir_in(pretrain_args)
        if not self.requeue:
            return "\n".join([*lines, srun]) + "\n"
        record = [self.bert_jax, "launch", "slurm", "record"] if workdir else None

        def note(event: str) -> str:
            if record is None:
                return ":"
            status = "" if event == "started" else ' --exit-status "$status"'
            line = shlex.join([*record, event, "--workdir", workdir])
            return line + f' --note "job $SLURM_JOB_ID"{status} || true'

        lines += [
            "# The n-th start of this job (requeues included); heartbeats carry it.",
            'export BERT_JAX_LAUNCH_ATTEMPT="$((${SLURM_RESTART_COUNT:-0} + 1))"',
            note("started"),
            "set +e",
            srun,
            "status=$?",
            "set -e",
            f"# {EXIT_STOPPED}: stopped by SIGTERM after saving (time limit near, or preempted): "
            "requeue, resume from the workdir.",
            f'if [ "$status" -eq {EXIT_STOPPED} ]; then',
            f"  {note('preempted')}",
            '  scontrol requeue "$SLURM_JOB_ID"',
            'elif [ "$status" -eq 0 ]; then',
            f"  {note('finished')}",
            "else",
            f"  {note('failed')}",
            "fi",
            'exit "$status"',
        ]
        return "\n".join(lines) + "\n"


def parse_env(pairs: Sequence[str]) -> tuple[tuple[str, str], ...]:
    out = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise LaunchError(f"--env {pair!r}: use NAME=VALUE")
        out.append((key, value))
    return tuple(out)


def workdir_in(pretrain_args: Sequence[str]) -> str | None:
    """The --workdir in the pretrain arguments (the last one given, either spelling), or None."""
    return pretrain_args_lib.value_of(pretrain_args, "workdir")


def default_paths(
    job_name: str, pretrain_args: Sequence[str], script: str | None, output: str | None
) -> tuple[str | None, str | None]:
    """(script path, SLURM log path): the ones given, else JOB_NAME.sbatch in the run's --workdir
    and JOB_NAME-%j.out beside the script; never the current directory. (None, output) when
    neither --script nor a --workdir says where (a dry run still prints the script)."""
    if script is None:
        workdir = workdir_in(pretrain_args)
        if workdir is None:
            return None, output
        script = os.path.join(workdir, f"{job_name}.sbatch")
    if output is None:
        output = os.path.join(os.path.dirname(os.path.abspath(script)), f"{job_name}-%j.out")
        if not _DIRECTIVE_VALUE.match(output):
            raise LaunchError(
                f"SLURM's log would go to {output!r}, which an #SBATCH line cannot hold: give "
                "--output PATH (letters, digits and _ . : , = + @ % / - [ ] only)"
            )
    return script, output


def write_and_submit(
    job: SlurmJob,
    pretrain_args: Sequence[str],
    script_path: str | None,
    runner: Runner,
    submit: bool,
) -> str:
    """Writes the script and, with `submit`, runs `sbatch` on it. A dry run prints the script as
    it would be written (so `--dry-run > job.sbatch` works) and the sbatch line as a comment.
    An existing file at `script_path` is replaced only when this command wrote it."""
    text = job.script(pretrain_args)
    if runner.dry_run:
        runner.show(text.rstrip("\n"))
        if submit:
            shown = script_path or f"{job.job_name}.sbatch"
            runner.note(f"then: {shlex.join(['sbatch', shown])}")
        return text
    if script_path is None:
        raise LaunchError(
            "where to write the sbatch script: give --script PATH, or --workdir in the pretrain "
            "arguments (it then goes there)"
        )
    if submit:
        runner.require("sbatch")
    _check_replaceable(script_path)
    os.makedirs(os.path.dirname(os.path.abspath(script_path)), exist_ok=True)
    partial = f"{script_path}.tmp-{os.getpid()}"
    with open(partial, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(partial, script_path)
    runner.note(f"wrote {script_path}")
    if submit:
        runner(["sbatch", script_path])
    return text


def _check_replaceable(path: str) -> None:
    if os.path.isdir(path):
        raise LaunchError(f"--script {path} is a directory: name the script file")
    if os.path.exists(path):
        with open(path, encoding="utf-8", errors="replace") as f:
            if WRITTEN_BY not in f.read(4096):
                raise LaunchError(
                    f"{path} exists and was not written by bert-jax launch slurm: choose another "
                    "--script (or move that file)"
                )
