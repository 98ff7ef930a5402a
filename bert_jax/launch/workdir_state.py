"""The launcher's view of a pretraining workdir: what a supervisor (or a job script) reads and
writes there, so that nothing about a launched run lives anywhere else.

`WORKDIR/launch/job.json` (the slice, capacity and command: `Job`), `launch/src.tar.gz` (the
source the workers install), the newest committed checkpoint, whether the model is exported,
events recorded from a job script (`launch slurm record`) and the text of `launch ... status`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence

from bert_jax.launch import ApiError, LaunchError, Runner, events, queued, supervisor, tpu
from bert_jax.runtime import fs, heartbeat

ATTEMPT_ENV = heartbeat.ATTEMPT_ENV


def job_path(workdir: str) -> str:
    return os.path.join(workdir, "launch", "job.json")


def source_path(workdir: str) -> str:
    return os.path.join(workdir, "launch", "src.tar.gz")


@dataclasses.dataclass(frozen=True)
class Job:
    """What the supervisor (re)starts: the slice, how it is obtained, and the command."""

    vm: tpu.TpuVm
    workdir: str
    pretrain_args: tuple[str, ...]
    capacity: str | None = queued.Capacity.kind  # None: a TPU VM created directly (--no-queued)
    valid_until_duration: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    jax_spec: str = "jax[tpu]"
    setup_commands: tuple[str, ...] = ()

    @property
    def qr(self) -> queued.QueuedResource | None:
        if self.capacity is None:
            return None
        return queued.QueuedResource(self.vm, self.capacity, self.valid_until_duration)

    def to_json(self) -> str:
        fields = dataclasses.asdict(self)
        return json.dumps(fields, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Job:
        fields = json.loads(text)
        fields["vm"] = tpu.TpuVm(**fields["vm"])
        fields["pretrain_args"] = tuple(fields["pretrain_args"])
        fields["env"] = tuple(tuple(pair) for pair in fields["env"])
        fields["setup_commands"] = tuple(fields["setup_commands"])
        return cls(**fields)


def save_job(job: Job, source_dir: str, archive: str) -> None:
    """Writes job.json and the packed source into the workdir: all a later watcher needs."""
    tpu.pack_source(source_dir, archive)
    fs.makedirs(os.path.dirname(job_path(job.workdir)), exist_ok=True)
    fs.upload(archive, source_path(job.workdir))
    fs.write_text(job_path(job.workdir), job.to_json())


def load_job(workdir: str) -> Job:
    where = job_path(workdir)
    if not fs.exists(where):
        raise LaunchError(
            f"{where} does not exist: `launch tpu watch` follows a job started by `launch tpu up` "
            "(which writes it); check --workdir"
        )
    return Job.from_json(fs.read_text(where))


# checkpointing.COMMIT_MARKER and workdir.LOCK_NAME (not imported: that would pull JAX into
# `launch tpu status`; tests/test_launch_supervisor.py checks they agree).
COMMIT_MARKER = "commit_success.txt"
LOCK_NAME = "bert-jax.lock"


def latest_checkpoint(workdir: str) -> int | None:
    """The newest finished checkpoint step in the workdir: Orbax names a save by its step (a
    local one once complete; one in a bucket is complete with its commit marker)."""
    folder = os.path.join(workdir, "checkpoints")
    try:
        steps = sorted((int(name) for name in fs.listdir(folder) if name.isdigit()), reverse=True)
    except FileNotFoundError:
        return None
    for step in steps:
        if not fs.is_remote(folder) or fs.exists(os.path.join(folder, str(step), COMMIT_MARKER)):
            return step
    return None


def model_exported(workdir: str) -> bool:
    return fs.exists(os.path.join(workdir, "model", "config.json"))


def all_stepped(beats: Sequence[dict]) -> bool:
    """Whether every host of the run has reported a first step (a host that dispatched its
    first step may wait for another that is still compiling: that is start-up too)."""
    count = max((int(h.get("process_count", 1)) for h in beats), default=0)
    stepped = {h.get("process") for h in beats if h.get("first_step_time")}
    return bool(beats) and len(stepped) >= count


def check_workdir(workdir: str) -> None:
    """That `--workdir` is a directory a run may have written to: a typo must not read as a run
    without checkpoints. A local path must exist; in a bucket, where folders exist only through
    their objects, a prefix with no object under it does not exist either (a run writes
    `launch/job.json` or its config there as it starts)."""
    if fs.isdir(workdir):
        return
    if fs.isfile(workdir):
        raise LaunchError(f"--workdir {workdir} is a file, not a run's workdir")
    where = " (no object in the bucket under it)" if fs.is_remote(workdir) else ""
    raise LaunchError(f"--workdir {workdir} does not exist{where}: check the path")


def _slice_state(job: Job, runner: Runner) -> str:
    """`queued resource ACTIVE, TPU VM NAME READY`; a state gcloud failed to give (an API error,
    not NOT_FOUND) is `unknown`, with gcloud's error, never `absent`."""
    failed: list[ApiError] = []

    def shown(state_of) -> str:
        try:
            return state_of() or "absent"
        except ApiError as err:
            failed.append(err)
            return "unknown (API error)"

    parts = [f"queued resource {shown(lambda: queued.state(job.qr, runner))}"] if job.qr else []
    parts.append(f"TPU VM {job.vm.name} {shown(lambda: queued.node_state(job.vm, runner))}")
    return ", ".join(parts) + "".join(f"; {err}" for err in failed[:1])


def status_text(workdir: str, runner: Runner | None = None) -> str:
    """`launch tpu status`: the events and heartbeats of the workdir, and (with a runner that can
    reach gcloud) the slice's state. A workdir that does not exist, or a file, is a LaunchError."""
    check_workdir(workdir)
    rows = events.read(workdir)
    beats = heartbeat.read_all(workdir)
    attempt = events.attempts(rows)
    beats = [h for h in beats if h.get("attempt") == attempt] or beats
    slice_state = None
    if runner is not None and fs.exists(job_path(workdir)):
        job = load_job(workdir)
        try:
            slice_state = _slice_state(job, runner)
        except LaunchError:
            slice_state = "unknown (gcloud not available here)"
    text = events.status_report(
        rows,
        beats,
        slice_state=slice_state,
        checkpoint=latest_checkpoint(workdir),
        model_exported=model_exported(workdir),
    )
    recorded = [r["policy"] for r in rows if r["event"] == "watching" and "policy" in r]
    if recorded:  # the settings of the latest supervisor, as its `watching` row recorded them
        text += f"\nsupervisor: {supervisor.Policy.from_dict(recorded[-1]).flags_text()}"
    return text


def record_event(
    workdir: str, event: str, *, note: str | None = None, exit_status: int | None = None
) -> dict:
    """An event written by a job script (SLURM): `started` numbers the attempt; an ending event
    (finished, preempted, failed) takes step, checkpoint and, before it, the attempt's `running`
    row from the hosts' heartbeats, so that goodput is counted as under `launch tpu watch`."""
    known = events.named(job_script=True)
    if event not in known:
        raise LaunchError(f"event {event!r}: use one of {', '.join(known)}")
    log = events.EventLog(workdir)
    extra = {k: v for k, v in (("note", note), ("exit_status", exit_status)) if v is not None}
    attempt = int(os.environ.get(ATTEMPT_ENV) or 0) or log.attempt + (event == "started")
    if event == "started":
        return log.append("started", attempt=attempt, **extra)
    beats = [h for h in heartbeat.read_all(workdir) if h.get("attempt") == attempt]
    seen = any(r["event"] == "running" and r.get("attempt") == attempt for r in log.rows)
    if all_stepped(beats) and not seen:
        start = min(h.get("start_step", 0) for h in beats)
        first = max(h["first_step_time"] for h in beats)
        log.append("running", attempt=attempt, step=start + 1, step_time=first, start_step=start)
    fields: dict = {"attempt": attempt, "checkpoint": latest_checkpoint(workdir), **extra}
    if beats:
        newest = max(beats, key=lambda h: (h.get("step", 0), h.get("step_time", 0)))
        fields.update(step=newest["step"], step_time=newest["step_time"])
    return log.append(event, **fields)
