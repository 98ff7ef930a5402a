"""The supervisor of `launch tpu up --watch` / `launch tpu watch`: keeps a pod run alive.

Each poll observes the slice (queued resource and TPU VM states), the job (one status line per
worker: running, exited N, none) and the run's progress (the hosts' heartbeats in the workdir),
then `decide` — a pure function from that observation to one action — says what to do:

  the exported model exists                 -> finish: delete the slice (unless --keep), exit 0
  resource SUSPENDED / FAILED, VM PREEMPTED / TERMINATED
                                            -> a lost slice: delete what is left; create again
                                               once the re-create delay has passed; start
  job stopped by SIGTERM (143)              -> a preemption of the job: restart it
  resource SUSPENDING / DELETING, queued    -> wait (a forced delete while SUSPENDING is refused)
  job exited 2 (user error) or 4 (no fit)   -> give up at once: retrying cannot help
  job exited non-zero on a healthy slice    -> a failure: restart it
  no new step for the stall timeout, or start-up longer than its limit
                                            -> a stall: SIGTERM, SIGKILL, restart
  a budget spent (--max-failures for failures and stalls, --max-preemptions)
                                            -> give up with the log's last lines (exit 1)

The loop that observes and acts is in watcher.py; this file is the rules alone, the timing
between polls included: a decision may name the pause before the next poll (the re-create
delay), else the watcher waits the poll interval.
"""

from __future__ import annotations

import dataclasses
import math

from bert_jax.launch import LaunchError, durations, events, queued
from bert_jax.runtime import declarations
from bert_jax.runtime.declarations import setting
from bert_jax.runtime.errors import EXIT_DOES_NOT_FIT, EXIT_STOPPED, EXIT_USER_ERROR

NEVER_RETRIED = (EXIT_USER_ERROR, EXIT_DOES_NOT_FIT)
MIN_STALL_TIMEOUT = 30 * 60.0
STALL_STEP_FACTOR = 5.0
NODE_LOST = ("PREEMPTED", "TERMINATED")
# A count of restarts; a duration (above 0, or from 0 for the re-create delay), read and shown
# as the duration flags spell it; both finite (an infinite stall timeout never restarts a hang).
_COUNT = {"low": 0, "metavar": "N"}
_DURATION = {"high": math.inf, "high_open": True, "parse": durations.seconds,
             "show": durations.text, "metavar": "DURATION"}  # fmt: skip
_POSITIVE_DURATION = {"low": 0.0, "low_open": True, **_DURATION}


@dataclasses.dataclass(frozen=True)
class Policy:
    """The supervisor's settings, each declared once here: the `launch tpu up --watch` and
    `launch tpu watch` flags and their help, the checks (a bad value refused in one line naming
    its flag, before anything runs), the detached watcher's command line and the `watching` row
    of events.jsonl (`to_dict`) are derived from these declarations."""

    max_failures: int = setting(
        3, "restarts after failures and stalls on a healthy slice", **_COUNT
    )
    max_preemptions: int | None = setting(
        None,
        "recreations of a lost slice and restarts after SIGTERM",
        zero="default: no limit",
        **_COUNT,
    )
    stall_timeout: float | None = setting(
        None,
        "no new step for this long is a hang",
        zero=f"default: max({durations.text(MIN_STALL_TIMEOUT)}, {STALL_STEP_FACTOR:g} x the "
        "slowest step)",
        **_POSITIVE_DURATION,
    )
    startup_timeout: float = setting(
        3600.0, "install + compile + restore limit, until the first step", **_POSITIVE_DURATION
    )
    stop_grace: float = setting(
        120.0, "SIGTERM to SIGKILL when stopping a hung job", **_POSITIVE_DURATION
    )
    poll_seconds: float = setting(
        60.0,
        "how often the supervisor looks at the slice, the job and the heartbeats",
        flag="poll",
        **_POSITIVE_DURATION,
    )
    recreate_delay_seconds: float | None = setting(
        None,
        "from deleting a preempted or failed slice to asking for it again",
        flag="recreate-delay",
        zero="default: the --poll interval",
        low=0.0,
        **_DURATION,
    )
    keep: bool = setting(False, "keep the slice when done")

    def __post_init__(self):
        """Refuses, before anything runs, a setting that would make the supervisor act on a
        healthy run (a negative stall timeout restarts the job at every poll)."""
        for problem in declarations.problems(self):
            raise LaunchError(problem)

    def to_dict(self) -> dict:
        """The settings as the supervisor records them (the `watching` row of events.jsonl)."""
        return declarations.as_dict(self)

    @classmethod
    def from_dict(cls, recorded: dict) -> Policy:
        """A policy `to_dict` recorded (a name this version does not declare is left out)."""
        return cls(**{k: v for k, v in recorded.items() if k in declarations.declarations(cls)})

    def flags_text(self) -> str:
        """The settings as their flags, as a user types them (`--max-failures 3 --poll 1m`);
        one unset (None, its default says what then) is left out."""
        words = []
        for name, declared in declarations.declarations(Policy).items():
            value = getattr(self, name)
            if value is None or value is False:
                continue
            words.append(_flag(name))
            if value is not True:
                words.append((declared.show or declarations.shown)(value))
        return " ".join(words)

    @property
    def recreate_delay(self) -> float:
        """Seconds from deleting a lost slice to asking for it again (its one definition)."""
        if self.recreate_delay_seconds is None:
            return self.poll_seconds
        return self.recreate_delay_seconds

    def stall_limit(self, slowest_step: float) -> float:
        if self.stall_timeout is not None:
            return self.stall_timeout
        return max(MIN_STALL_TIMEOUT, STALL_STEP_FACTOR * slowest_step)


def _flag(name: str) -> str:
    """The flag of the policy's setting `name` (`poll_seconds` -> `--poll`), as messages say it."""
    return declarations.flag_name(name, declarations.declarations(Policy)[name])


@dataclasses.dataclass(frozen=True)
class Observation:
    """What one poll saw. `qr_state` is None without a queued resource (or when there is
    none); `job` is none | running | exited | unknown (workers unreachable)."""

    queued: bool
    qr_state: str | None
    node_state: str | None
    job: str = "none"
    exit_statuses: tuple[int, ...] = ()
    model_exported: bool = False
    since_start: float | None = None  # seconds since this attempt started
    since_progress: float | None = None  # seconds since a new step; None: no step yet
    slowest_step: float = 0.0
    preemptions: int = 0
    failures: int = 0  # failures + stalls so far
    attempt: int = 1  # starts recorded in the workdir; 0: none (a job not started by us)
    since_lost: float | None = None  # seconds since a lost slice was deleted; None: none since


@dataclasses.dataclass(frozen=True)
class Decision:
    action: str  # wait | create | recreate | start | restart | finish | give-up
    event: str | None = None  # the events.jsonl row this decision writes
    reason: str = ""
    exit_status: int | None = None
    pause: float | None = None  # seconds until the next poll; None: the poll interval


def decide(obs: Observation, policy: Policy) -> Decision:
    """The action for one observation (see the module docstring); pure."""
    if obs.model_exported:
        return Decision("finish", "finished", "the exported model exists", 0)
    if obs.queued:
        if obs.qr_state is None:
            return _create(obs, policy, "no queued resource")
        if obs.qr_state in queued.WAITING:
            return Decision("wait", reason=f"queued resource {obs.qr_state}")
        if obs.qr_state in ("SUSPENDING", "DELETING"):
            return Decision("wait", reason=f"queued resource {obs.qr_state}: waiting for it")
        if obs.qr_state in queued.LOST:
            return _preempted(obs, policy, f"queued resource {obs.qr_state}", "recreate")
        if obs.qr_state != "ACTIVE":
            return Decision("wait", reason=f"queued resource {obs.qr_state}")
    if obs.node_state in NODE_LOST:
        return _preempted(obs, policy, f"TPU VM {obs.node_state}", "recreate")
    if obs.node_state is None:
        if obs.queued:
            return Decision("wait", reason="queued resource ACTIVE, TPU VM not listed yet")
        return _create(obs, policy, "no TPU VM")
    if obs.node_state != "READY":
        return Decision("wait", reason=f"TPU VM {obs.node_state}")
    return _job(obs, policy)


def _job(obs: Observation, policy: Policy) -> Decision:
    """The job on a healthy slice."""
    if obs.job == "unknown":
        return Decision("wait", reason="the workers did not answer")
    if obs.job == "none":
        return Decision("start", "started", "the slice is ready and runs no job")
    if obs.job == "exited" and obs.attempt == 0:  # an earlier job's status, not this run's
        return Decision("start", "started", "the slice is ready and runs no job of this run")
    failed = [s for s in obs.exit_statuses if s != 0]
    for status in NEVER_RETRIED:
        if status in failed:
            what = "a user error" if status == EXIT_USER_ERROR else "does not fit"
            return Decision(
                "give-up", "failed", f"exit status {status} ({what}): not retried", status
            )
    if obs.job == "exited" and not failed:
        return Decision("finish", "finished", "every worker exited 0", 0)
    if failed and all(s == EXIT_STOPPED for s in failed):
        if obs.job == "exited":
            return _preempted(obs, policy, "the job stopped after SIGTERM (status 143)", "restart")
        return Decision("wait", reason="workers are stopping after SIGTERM")
    if failed:
        return _failure(obs, policy, "failed", f"the job exited {max(failed)} on a healthy slice")
    if obs.since_progress is None:
        if obs.since_start is not None and obs.since_start > policy.startup_timeout:
            return _failure(
                obs,
                policy,
                "stalled",
                f"no first step {obs.since_start:.0f} s after the start (limit "
                f"{policy.startup_timeout:.0f} s)",
            )
        return Decision("wait", reason="starting")
    limit = policy.stall_limit(obs.slowest_step)
    if obs.since_progress > limit:
        return _failure(
            obs,
            policy,
            "stalled",
            f"no new step for {obs.since_progress:.0f} s (limit {limit:.0f} s)",
        )
    return Decision("wait", reason="running")


def _preempted(obs: Observation, policy: Policy, reason: str, action: str) -> Decision:
    if policy.max_preemptions is not None and obs.preemptions >= policy.max_preemptions:
        return Decision(
            "give-up",
            "preempted",
            f"{reason}; {_flag('max_preemptions')} {policy.max_preemptions} spent",
            1,
        )
    if action == "recreate":  # the next poll comes when the new slice may be asked for
        return Decision(action, "preempted", reason, pause=_until_recreate(policy, 0.0))
    return Decision(action, "preempted", reason)


def _create(obs: Observation, policy: Policy, reason: str) -> Decision:
    """Asks for the slice; after a lost one, only once the re-create delay has passed since its
    deletion (counted from events.jsonl, so a watcher started afresh keeps it too)."""
    delay = policy.recreate_delay
    # events.jsonl keeps times to the millisecond: within that, the delay has passed.
    if obs.since_lost is not None and obs.since_lost + events.TIME_RESOLUTION < delay:
        return Decision(
            "wait",
            reason=f"the slice was lost: asking again {delay:g} s after "
            f"({_flag('recreate_delay_seconds')})",
            pause=_until_recreate(policy, obs.since_lost),
        )
    return Decision("create", "queued", reason)


def _until_recreate(policy: Policy, waited: float) -> float:
    """The pause before the next poll while the re-create delay runs: the rest of it, at most
    the poll interval (so the slice's state is still seen every poll)."""
    return min(policy.poll_seconds, max(0.0, policy.recreate_delay - waited))


def _failure(obs: Observation, policy: Policy, event: str, reason: str) -> Decision:
    if obs.failures >= policy.max_failures:
        return Decision(
            "give-up", event, f"{reason}; {_flag('max_failures')} {policy.max_failures} spent", 1
        )
    return Decision("restart", event, reason)
