"""Capacity through Cloud TPU queued resources: create, describe, wait until ACTIVE, delete.

A queued resource (QR) asks for a slice and waits for it: CREATING/ACCEPTED ->
WAITING_FOR_RESOURCES -> PROVISIONING -> ACTIVE, with its node (the TPU VM, named as the QR
here) created when it turns ACTIVE. A preempted spot slice goes SUSPENDING -> SUSPENDED: its node
is gone, the QR keeps its name until deleted. Delete without `--force` works once the nodes are
gone (ACCEPTED, FAILED, SUSPENDED); `--force` (which deletes the nodes too) is used only on a
resource that still holds a slice, and never while SUSPENDING.

Capacity kinds: `spot` (preemptible, about a third of the on-demand price), `best-effort` (the
alpha API's preemptible kind), `reserved` (a reservation of the project), `guaranteed`, and
on-demand when none is given.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import time
from collections.abc import Callable

from bert_jax.launch import ApiError, CommandFailed, LaunchError, Runner, cloud_state
from bert_jax.launch.tpu import TpuVm
from bert_jax.runtime import declarations
from bert_jax.runtime.declarations import setting

# The capacity kinds other than on-demand (the default), each a switch of `launch tpu` and
# gcloud's flag of the same name.
SWITCHES = {
    "spot": "Spot capacity: preemptible, about a third of the on-demand price",
    "best-effort": "best-effort capacity (the alpha API's preemptible kind)",
    "reserved": "the project's reserved capacity",
    "guaranteed": "guaranteed capacity",
}
CAPACITY = ("on-demand", *SWITCHES)
WAITING = ("CREATING", "ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING")
LOST = ("SUSPENDED", "FAILED")  # the slice is gone: delete, then create again
# gcloud's duration format, e.g. 6h, 90m, 1d, 1h30m.
_DURATION = re.compile(r"^(\d+[dhms])+$")
POLL_SECONDS = 60.0
MAX_API_ERRORS = 10  # describes in a row that fail (not NOT_FOUND) before a wait gives up


def api_error_backoff(poll_seconds: float, failures: int) -> float:
    """The pause after `failures` cloud commands in a row that failed (an API error: the state
    is unknown): the poll, doubled each time, at most 512 s (AXLearn's backoff). Not the
    supervisor's re-create delay (`supervisor.Policy.recreate_delay`), which is the pause from
    deleting a lost slice to asking for it again."""
    return min(512.0, poll_seconds * 2 ** max(0, failures - 1))


@dataclasses.dataclass(frozen=True)
class Capacity:
    """How `launch tpu` asks for its slice, each setting declared once here: the flags of
    `create`, `up` and `delete`, their help, defaults and checks derive from the declarations.
    `kind` has no flag of its own but a switch per kind (`SWITCHES`: `--spot`, ...)."""

    kind: str = setting("on-demand", "capacity kind (a switch each)", choices=CAPACITY, flag="")
    valid_until_duration: str | None = setting(
        None, "give up the queued request after this long (e.g. 6h)", metavar="DURATION"
    )
    no_queued: bool = setting(
        False,
        "no queued resource: create the TPU VM directly (`tpu-vm create`); with delete, a TPU "
        "VM created so",
    )

    def __post_init__(self):
        def name_of(name: str) -> str:  # the kind has switches, not a flag
            return "capacity" if name == "kind" else declarations.flag_name(name)

        for problem in declarations.problems(self, name_of=name_of):
            raise LaunchError(problem)
        if self.valid_until_duration is not None and not _DURATION.match(self.valid_until_duration):
            raise LaunchError(
                f"--valid-until-duration {self.valid_until_duration!r}: use a duration such as "
                "6h, 90m or 1d"
            )


@dataclasses.dataclass(frozen=True)
class QueuedResource:
    """The queued resource that brings `vm` (its node id) to life; it carries the VM's name. Its
    capacity's defaults and checks are `Capacity`'s."""

    vm: TpuVm
    capacity: str = Capacity.kind
    valid_until_duration: str | None = Capacity.valid_until_duration

    def __post_init__(self):
        Capacity(self.capacity, self.valid_until_duration)

    @property
    def name(self) -> str:
        return self.vm.name

    def _gcloud(self, verb: str, *args: str) -> list[str]:
        vm = self.vm
        where = [f"--zone={vm.zone}"] + ([f"--project={vm.project}"] if vm.project else [])
        # --best-effort exists in the alpha API only.
        track = ["alpha"] if self.capacity == "best-effort" else []
        return ["gcloud", *track, "compute", "tpus", "queued-resources", verb, *args, *where]

    def create_command(self) -> list[str]:
        command = self._gcloud("create", self.name) + [
            f"--node-id={self.vm.name}",
            f"--accelerator-type={self.vm.accelerator_type}",
            f"--runtime-version={self.vm.version}",
        ]
        if self.capacity != "on-demand":
            command.append(f"--{self.capacity}")
        if self.valid_until_duration:
            command.append(f"--valid-until-duration={self.valid_until_duration}")
        return command

    def describe_command(self) -> list[str]:
        return self._gcloud("describe", self.name) + ["--format=value(state.state)"]

    def delete_command(self, force: bool = False) -> list[str]:
        return self._gcloud("delete", self.name) + (["--force"] if force else []) + ["--quiet"]


def state(qr: QueuedResource, runner: Runner) -> str | None:
    """The queued resource's state (ACTIVE, SUSPENDED, ...); None when the service says
    NOT_FOUND. Any other failure of the describe is an ApiError (the state is unknown)."""
    return cloud_state(runner, qr.describe_command(), f"queued resource {qr.name}")


def node_state(vm: TpuVm, runner: Runner) -> str | None:
    """The TPU VM's state (READY, PREEMPTED, ...); None when the service says NOT_FOUND. Any
    other failure of the describe is an ApiError (the state is unknown)."""
    return cloud_state(runner, vm.describe_command(), f"TPU VM {vm.name}")


def create(qr: QueuedResource, runner: Runner) -> None:
    runner(qr.create_command())


def delete(qr: QueuedResource, runner: Runner, current: str | None) -> bool:
    """Deletes the queued resource as its state `current` allows; False when it must wait
    (SUSPENDING: a forced delete then is what the service warns against; DELETING: under way)."""
    if current is None or current in ("SUSPENDING", "DELETING"):
        return current is None
    holds_slice = current not in ("ACCEPTED", "FAILED", "SUSPENDED")
    runner(qr.delete_command(force=holds_slice))
    return True


def duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def wait_until_active(
    qr: QueuedResource,
    runner: Runner,
    *,
    poll_seconds: float = POLL_SECONDS,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    progress: Callable[[str], None] | None = None,
) -> float:
    """Polls until the queued resource is ACTIVE; returns the seconds waited. A progress line
    (state and time waited) is shown at each poll. A resource that ends SUSPENDED or FAILED, or
    disappears (NOT_FOUND), is a CommandFailed: the capacity request did not succeed. A describe
    that fails otherwise is retried with backoff; MAX_API_ERRORS in a row end the wait."""
    if runner.dry_run:
        runner.note(f"then every {poll_seconds:g} s until the state is ACTIVE:")
        runner(qr.describe_command())
        return 0.0
    show = progress or _progress_line(runner)
    start = clock()
    api_errors = 0
    while True:
        try:
            current = state(qr, runner)
        except ApiError as err:
            api_errors += 1
            if api_errors >= MAX_API_ERRORS:
                raise
            delay = api_error_backoff(poll_seconds, api_errors)
            runner.note(f"{err} ({api_errors} in a row; retrying in {delay:g} s)")
            sleep(delay)
            continue
        api_errors = 0
        waited = clock() - start
        show(f"queued resource {qr.name}: {current or 'absent'}, waited {duration(waited)}")
        if current == "ACTIVE":
            return waited
        if current is None or current in LOST:
            raise CommandFailed(
                f"queued resource {qr.name} is {current or 'gone'} after {duration(waited)}: "
                "the capacity request did not succeed (try again, another zone, or --watch to "
                "keep asking)"
            )
        sleep(poll_seconds)


def _progress_line(runner: Runner) -> Callable[[str], None]:
    """One line rewritten in place on a terminal; a line per change otherwise (logs)."""
    out = runner.out or sys.stdout
    last = [None]
    if out.isatty():

        def show(text: str) -> None:
            end = "\n" if text.split(":", 1)[1].startswith(" ACTIVE") else ""
            print(f"\r\033[K{text}", end=end, file=out, flush=True)

        return show

    def show_changes(text: str) -> None:
        state_now = text.split(",", 1)[0]
        if state_now != last[0]:
            print(text, file=out, flush=True)
            last[0] = state_now

    return show_changes


def bring_up(
    qr: QueuedResource,
    runner: Runner,
    *,
    poll_seconds: float = POLL_SECONDS,
) -> None:
    """`launch tpu up`'s capacity step: reuse an ACTIVE (or still queued) resource of this
    name, replace a SUSPENDED/FAILED one, create one otherwise; then wait until ACTIVE."""
    if runner.dry_run:
        runner(qr.describe_command())
        runner.note("only when the describe above finds none (SUSPENDED or FAILED: delete first):")
        runner(qr.create_command())
        wait_until_active(qr, runner, poll_seconds=poll_seconds)
        return
    current = state(qr, runner)
    if current in LOST:
        runner.note(f"queued resource {qr.name} is {current}: deleting it to ask again")
        delete(qr, runner, current)
        current = None
    if current is None:
        create(qr, runner)
    elif current in ("SUSPENDING", "DELETING"):
        raise CommandFailed(
            f"queued resource {qr.name} is {current}: wait until it is SUSPENDED (or gone), "
            "then run this again (`launch tpu up --watch` waits by itself)"
        )
    else:
        runner.note(f"reusing queued resource {qr.name} ({current})")
    waited = wait_until_active(qr, runner, poll_seconds=poll_seconds)
    runner.note(f"queued resource {qr.name} is ACTIVE after {duration(waited)}")


def delete_slice(qr: QueuedResource, runner: Runner) -> None:
    """`launch tpu delete`: the queued resource (and its TPU VM); a TPU VM without one (created
    with --no-queued) is deleted itself."""
    if runner.dry_run:
        runner(qr.delete_command(force=True))
        return
    current = state(qr, runner)
    if current is None:
        runner.note(f"no queued resource {qr.name}; deleting the TPU VM itself")
        runner(qr.vm.delete_command())
    elif not delete(qr, runner, current):
        raise CommandFailed(
            f"queued resource {qr.name} is {current}: delete it once it is SUSPENDED"
        )
