"""What happened to a launched run: `<workdir>/launch/events.jsonl`, and goodput from it.

One JSON row per event, written by the supervisor (or a SLURM job script): `time` (UNIX seconds),
`event`, `attempt`, `step` (the highest step the hosts reported), `checkpoint` (the latest
checkpoint step in the workdir) and what the event adds (`state`, `exit_status`, `reason`,
`last_lines`, ...). The events, what each means and what its consumers read of it (the badput
cause after it, whether it is a restart's cause, whether it ends a run of steps, ...) are one
table: `EVENTS` below. Every consumer (the accounting here, the supervisor's watcher, `launch
slurm record`) reads it; `EventLog.append` refuses a name it does not hold.

Goodput is productive step time over the wall time since the first event; the rest (badput) is
split into waiting for capacity, start-up (install + compile + restore, until the first step),
steps lost to restarts (steps after the last checkpoint, redone) and stalls (the time a hung job
burnt before it was killed); `other` is what is left (tear-down, polling), so that the parts add
up to the wall time (`CAUSES`). Times of steps come from the hosts' heartbeats (clocks kept by
NTP).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Iterable, Sequence

from bert_jax.runtime import fs

# The parts of the badput, each with how `launch ... status` names it.
CAUSES = {
    "capacity": "waiting for capacity",
    "startup": "start-up (install, compile, restore)",
    "lost": "steps lost to restarts (redone after the last checkpoint)",
    "stall": "stalls",
    "other": "other (tear-down, polling)",
}
RUNNING = "running"  # the mode between a `running` row and the row that ends the run


@dataclasses.dataclass(frozen=True)
class Event:
    """One kind of events.jsonl row: its `name` (as written), what it means, and what the
    consumers read of it."""

    name: str
    meaning: str
    # The badput cause (a key of CAUSES) that the time after it counts to until the next row;
    # RUNNING for `running`; None: the time goes on as before it (watching, deleted, ...).
    after: str | None = None
    restart_cause: bool = False  # a cause of a restart: counted by cause, spent from a budget
    ends_run: bool = False  # ends a run of steps (the steps after the checkpoint are lost)
    final: bool = False  # the run is over: the wall time ends here (tear-down is not the run's)
    starts_attempt: bool = False  # a start of the job: the attempts are these rows counted
    # What it says of the slice: "asked" (capacity asked for), "ready", "lost"; None: nothing.
    slice: str | None = None
    ends_watching: bool = False  # no supervisor watches the run after it
    job_script: bool = False  # a job script may record it (`launch slurm record EVENT`)


EVENTS = {
    event.name: event
    for event in (
        Event(
            "queued",
            "capacity asked for (a queued resource created, a TPU VM created)",
            after="capacity",
            slice="asked",
        ),
        Event(
            "active",
            "the slice is there (queued resource ACTIVE / VM READY)",
            after="startup",
            slice="ready",
        ),
        Event(
            "started",
            "the job started on every host (`attempt` numbers the starts)",
            after="startup",
            starts_attempt=True,
            job_script=True,
        ),
        Event(
            "running",
            "its first step is done (start-up over: install, compile, restore)",
            after=RUNNING,
        ),
        Event(
            "preempted",
            "the slice was taken back (SUSPENDED / FAILED resource, PREEMPTED / TERMINATED VM, "
            "or the job stopped by SIGTERM with status 143)",
            after="capacity",
            restart_cause=True,
            ends_run=True,
            slice="lost",
            job_script=True,
        ),
        Event(
            "stalled",
            "no new step for the stall timeout (or start-up took too long): the job was killed",
            after="startup",
            restart_cause=True,
            ends_run=True,
            job_script=True,
        ),
        Event(
            "failed",
            "the job exited non-zero on a healthy slice",
            after="startup",
            restart_cause=True,
            ends_run=True,
            job_script=True,
        ),
        Event(
            "restarted",
            "the same command started again (after a failure or a stall, same slice)",
            after="startup",
            starts_attempt=True,
        ),
        Event(
            "finished",
            "the exported model exists",
            after="other",
            ends_run=True,
            final=True,
            ends_watching=True,
            job_script=True,
        ),
        Event(
            "gave-up",
            "a budget ran out, or the job's status says retrying cannot help (2, 4)",
            after="other",
            ends_run=True,
            final=True,
            ends_watching=True,
        ),
        Event("deleted", "the slice was deleted (after finishing, unless --keep)"),
        Event(
            "watching",
            "a supervisor attached (`policy`: its settings, as `supervisor.Policy.to_dict` "
            "writes them)",
        ),
        Event(
            "stopped-watching",
            "the supervisor detached (`reason` when cloud commands failed too often in a row)",
            ends_watching=True,
        ),
        Event(
            "cloud-errors",
            "several polls in a row ended by a failed cloud command (an API error, not the "
            "service's NOT_FOUND): `count`, `error`; nothing was done on them",
        ),
    )
}


def named(**attributes) -> tuple[str, ...]:
    """The names of the events whose attributes have the given values (`restart_cause=True`),
    in the table's order."""
    return tuple(
        name
        for name, event in EVENTS.items()
        if all(getattr(event, key) == value for key, value in attributes.items())
    )


# A row of a kind this version does not know (written by a newer one): it changes nothing.
NOT_KNOWN = Event("", "not an event of this version")


def kind(row: dict) -> Event:
    """The table's entry for a row's event (NOT_KNOWN for a name it does not hold)."""
    return EVENTS.get(row["event"], NOT_KNOWN)


RESTART_CAUSES = named(restart_cause=True)
STARTS = named(starts_attempt=True)
TIME_DIGITS = 3  # a row's `time` is kept to the millisecond
TIME_RESOLUTION = 10.0**-TIME_DIGITS


def path(workdir: str) -> str:
    return os.path.join(workdir, "launch", "events.jsonl")


class EventLog:
    """events.jsonl of one workdir. Appends rewrite the file (a bucket object cannot be appended
    to); the rows are few (one per event, not per step)."""

    def __init__(self, workdir: str, clock=time.time):
        self.path = path(workdir)
        self._clock = clock
        self.rows = read(workdir)

    def append(self, event: str, **fields) -> dict:
        if event not in EVENTS:  # a bug: every kind of row is one of the table's
            raise ValueError(f"event {event!r} is not one of events.EVENTS")
        row = {"time": round(self._clock(), TIME_DIGITS), "event": event, **fields}
        self.rows.append(row)
        fs.makedirs(os.path.dirname(self.path), exist_ok=True)
        fs.write_text(self.path, "".join(json.dumps(r) + "\n" for r in self.rows))
        return row

    @property
    def attempt(self) -> int:
        return attempts(self.rows)


def read(workdir: str) -> list[dict]:
    """The rows of events.jsonl (none when it does not exist); a torn last line is skipped."""
    where = path(workdir)
    if not fs.exists(where):
        return []
    rows = []
    for line in fs.read_text(where).splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def attempts(rows: Iterable[dict]) -> int:
    """How many times the job was started (the rows that start an attempt)."""
    return sum(1 for r in rows if r["event"] in STARTS)


def counts(rows: Iterable[dict]) -> dict[str, int]:
    """Restarts by cause: how many times each of RESTART_CAUSES happened."""
    found = {cause: 0 for cause in RESTART_CAUSES}
    for row in rows:
        if row["event"] in found:
            found[row["event"]] += 1
    return found


def lost_at(rows: Sequence[dict]) -> float | None:
    """When the supervisor deleted a lost slice that it has not asked for again: the time of the
    last `preempted` row with no capacity asked for (`queued`) nor job started since; None
    otherwise. (A job stopped by SIGTERM is a `preempted` row too, followed by `restarted` at
    once: its slice was not lost.)"""
    lost = None
    for row in rows:
        event = EVENTS.get(row["event"])
        if event is None:
            continue
        if event.slice == "lost":
            lost = row["time"]
        elif event.slice is not None or event.starts_attempt:
            lost = None
    return lost


@dataclasses.dataclass
class Accounting:
    wall: float = 0.0
    productive: float = 0.0
    badput: dict[str, float] = dataclasses.field(default_factory=lambda: dict.fromkeys(CAUSES, 0.0))
    redone_steps: int = 0

    @property
    def goodput(self) -> float:
        return self.productive / self.wall if self.wall > 0 else 0.0


def account(
    rows: Sequence[dict], now: float | None = None, current: dict | None = None
) -> Accounting:
    """Goodput and badput by cause from the events (see the module docstring).

    A run of steps goes from a `running` row (`step`, `step_time`: the attempt's first step and
    when the hosts finished it) to the row that ends the attempt, whose `step` / `step_time` say
    the last step reached and when, and `checkpoint` the last one saved. Steps up to the
    checkpoint are productive; those after it are lost (they will be redone); the time from the
    last step to the end row is a stall for `stalled` and lost for the others. A run still
    going at `now` ends at `current` (`step`, `step_time` of the newest heartbeat)."""
    result = Accounting()
    rows = sorted(rows, key=lambda r: r["time"])
    if not rows:
        return result
    ends = [r["time"] for r in rows if kind(r).final]
    if ends:  # the wall time ends with the run (tear-down after it is not the run's)
        rows = [r for r in rows if r["time"] <= ends[-1]]
    if ends:
        end = ends[-1]
    else:
        end = rows[-1]["time"] if now is None else max(now, rows[-1]["time"])
    result.wall = end - rows[0]["time"]
    mode, since, run = "other", rows[0]["time"], None
    for row in [*rows, {**(current or {}), "time": end, "event": "now"}]:
        t = row["time"]
        if mode == RUNNING:
            if row["event"] != "now" and not kind(row).ends_run:
                continue  # a row inside a run (e.g. watching): the run goes on
            _close_run(result, run, row, t)
        else:
            if kind(row).after == RUNNING:  # start-up ended with the first step, seen later
                t = min(max(float(row.get("step_time", t)), since), t)
            result.badput[mode] += max(0.0, t - since)
        if row["event"] == "now":
            break
        if kind(row).after == RUNNING:
            run = {"start": t, "step": int(row.get("step", 0))}
        # Rows that change nothing (watching, deleted, ...) leave the mode as it was.
        mode = kind(row).after or mode
        since = row["time"]
    accounted = result.productive + sum(result.badput.values())
    result.badput["other"] += max(0.0, result.wall - accounted)
    return result


def _close_run(result: Accounting, run: dict, row: dict, t: float) -> None:
    first_step, first_time = run["step"], run["start"]
    last_step = int(row.get("step", first_step))
    last_time = min(float(row.get("step_time", t)), t)
    if row["event"] in ("finished", "now"):
        kept = last_step
    else:
        kept = int(row.get("checkpoint") or 0)
    kept = max(first_step, min(kept, last_step))
    stepping = max(0.0, last_time - first_time)
    per_step = stepping / (last_step - first_step) if last_step > first_step else 0.0
    result.productive += per_step * (kept - first_step)
    result.badput["lost"] += per_step * (last_step - kept)
    result.redone_steps += last_step - kept
    tail = max(0.0, t - max(first_time, last_time))
    if row["event"] == "stalled":
        result.badput["stall"] += tail
    elif row["event"] not in ("finished", "now"):
        result.badput["lost"] += tail
    else:
        result.badput["other"] += tail


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h{minutes:02d}m"
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s"


def status_report(
    rows: Sequence[dict],
    heartbeats: Sequence[dict],
    *,
    slice_state: str | None = None,
    checkpoint: int | None = None,
    model_exported: bool = False,
    now: float | None = None,
) -> str:
    """`launch tpu status`: slice state, step, latest checkpoint, ETA, restarts by cause,
    goodput and the badput split."""
    now = time.time() if now is None else now
    lines = []
    last = rows[-1] if rows else None
    if slice_state is not None:
        lines.append(f"slice: {slice_state}")
    if last is not None:
        lines.append(
            f"last event: {last['event']} {_duration(now - last['time'])} ago (attempt "
            f"{last.get('attempt', 0)})"
        )
    step = max((int(h.get("step", 0)) for h in heartbeats), default=None)
    total = max((int(h.get("total_steps", 0)) for h in heartbeats), default=None)
    if step is not None:
        newest = max(float(h.get("step_time", 0)) for h in heartbeats)
        line = f"step: {step}" + (f" of {total}" if total else "")
        line += f" (reported {_duration(now - newest)} ago)"
        speeds = [h["seconds_per_step"] for h in heartbeats if h.get("seconds_per_step")]
        if speeds and total and step < total and not model_exported:
            eta = (total - step) * max(speeds)
            line += f", {max(speeds):.3g} s/step, ETA {_duration(eta)}"
        lines.append(line)
    lines.append(f"latest checkpoint: {'none' if checkpoint is None else f'step {checkpoint}'}")
    if model_exported:
        lines.append("exported model: yes")
    restarts = counts(rows)
    lines.append(
        "restarts by cause: " + ", ".join(f"{name} {restarts[name]}" for name in RESTART_CAUSES)
    )
    newest = max(heartbeats, key=lambda h: h.get("step", 0), default=None)
    accounting = account(rows, now, newest)
    if accounting.wall > 0:
        lines.append(
            f"goodput: {100 * accounting.goodput:.1f}% ({_duration(accounting.productive)} of "
            f"productive steps in {_duration(accounting.wall)} since the first start)"
        )
        lines.append("badput:")
        for cause in CAUSES:
            share = 100 * accounting.badput[cause] / accounting.wall
            lines.append(f"  {CAUSES[cause]}: {share:.1f}% ({_duration(accounting.badput[cause])})")
        if accounting.redone_steps:
            lines.append(f"steps redone after restarts: {accounting.redone_steps}")
    return "\n".join(lines)
