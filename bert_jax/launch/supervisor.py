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

from bert_jax.launch import LaunchError, events, queued
from bert_jax.runtime.errors import EXIT_DOES_NOT_FIT, EXIT_STOPPED, EXIT_USER_ERROR

NEVER_RETRIED = (EXIT_USER_ERROR, EXIT_DOES_NOT_FIT)
MIN_STALL_TIMEOUT = 30 * 60.0
STALL_STEP_FACTOR = 5.0
NODE_LOST = ("PREEMPTED", "TERMINATED")
# The flag of each setting: a bad value is refused in one line naming it.
COUNT_FLAGS = {"max_failures": "--max-failures", "max_preemptions": "--max-preemptions"}
DURATION_FLAGS = {
    "stall_timeout": "--stall-timeout",
    "startup_timeout": "--startup-timeout",
    "stop_grace": "--stop-grace",
    "poll_seconds": "--poll",
}
RECREATE_DELAY_FLAG = "--recreate-delay"


@dataclasses.dataclass(frozen=True)
class Policy:
    max_failures: int = 3  # failures and stalls on a healthy slice
    max_preemptions: int | None = None  # None: no limit
    stall_timeout: float | None = None  # None: max(30 min, 5 x the slowest step seen)
    startup_timeout: float = 3600.0  # install + compile + restore, until the first step
    stop_grace: float = 120.0  # SIGTERM -> SIGKILL
    poll_seconds: float = 60.0
    # From deleting a lost slice to asking for it again; None: the poll interval.
    recreate_delay_seconds: float | None = None
    keep: bool = False  # keep the slice when done

    def __post_init__(self):
        """Refuses, before anything runs, a setting that would make the supervisor act on a
        healthy run (a negative stall timeout restarts the job at every poll)."""
        for name, flag in COUNT_FLAGS.items():
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise LaunchError(f"{flag} {value!r}: use a whole number, 0 or more")
            if value is not None and value < 0:
                raise LaunchError(f"{flag} {value}: use a whole number, 0 or more")
        for name, flag in DURATION_FLAGS.items():
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise LaunchError(f"{flag} {value:g} s: use a duration above 0 (e.g. 90s, 45m, 2h)")
        delay = self.recreate_delay_seconds
        if delay is not None and not (math.isfinite(delay) and delay >= 0):
            raise LaunchError(
                f"{RECREATE_DELAY_FLAG} {delay:g} s: use a duration of 0 or more (e.g. 0, 90s, 5m)"
            )

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
            "give-up", "preempted", f"{reason}; --max-preemptions {policy.max_preemptions} spent", 1
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
            reason=f"the slice was lost: asking again {delay:g} s after ({RECREATE_DELAY_FLAG})",
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
            "give-up", event, f"{reason}; --max-failures {policy.max_failures} spent", 1
        )
    return Decision("restart", event, reason)
