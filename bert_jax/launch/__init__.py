"""Launch helpers, thin over `bert-jax pretrain`: TPU VM pod slices (`tpu.py`) and SLURM GPU
clusters (`slurm.py`). `launch/README.md` at the top of the repository has the recipes.

Commands are argument lists run without a shell; text that a remote shell will read (the
command given to `gcloud ... ssh --command`, the lines of an sbatch script) is built with
`shlex.quote` around every value that came from the user, so names, paths and config overrides
such as `--config.data.source='a b; rm -rf /'` arrive as one argument each.

Errors: what the user must change (a setting, a missing `gcloud`) is a `LaunchError`, a
`UserError` (one line, exit status 2). A cloud command that fails (quota, capacity, permissions,
the API itself; its own message is printed above ours) is a `CommandFailed`: one line too, but
exit status 1, since retrying later may succeed where 2 says "change something first".

A describe (`cloud_state`) tells three answers apart: a state, the service's NOT_FOUND (the thing is
absent: None) and anything else (an `ApiError`: an expired auth token, 429/5xx, a dropped
connection). Only NOT_FOUND may lead to a create; an ApiError leaves the state unknown.

Rooms: `tpu.py` (a TPU VM and its workers), `queued.py` (capacity through queued resources),
`slurm.py`, `events.py`
(`<workdir>/launch/events.jsonl`, goodput), `supervisor.py` (the decision function and its
declared Policy; `watcher.py` the loop that keeps a run alive), `durations.py` (90s, 45m, 2h).
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import TextIO

from bert_jax.runtime.errors import UserError


class LaunchError(UserError):
    """An invalid launch setting, or a tool the launch needs is missing: the user's to fix."""


class CommandFailed(RuntimeError):
    """An external command (gcloud, sbatch) failed; its own message is on stderr above."""

    def __init__(self, message: str, returncode: int = 1):
        super().__init__(message)
        self.returncode = returncode


class ApiError(CommandFailed):
    """A describe failed for another reason than NOT_FOUND: the state is unknown (not absent)."""


# How gcloud reports the service's NOT_FOUND, e.g. `ERROR: (gcloud.compute.tpus.tpu-vm.describe)
# NOT_FOUND: Resource 'projects/P/locations/Z/nodes/N' was not found`. Nothing else is "absent".
_NOT_FOUND = re.compile(r"^ERROR: \(gcloud\.[^)]*\) NOT_FOUND\b", re.MULTILINE)


def first_error_line(stderr: str) -> str:
    """The line of gcloud's stderr that says what went wrong (its `ERROR:` line), shortened."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    line = next((x for x in lines if x.startswith("ERROR:")), lines[0] if lines else "")
    return line if len(line) <= 240 else line[:237] + "..."


# Where each external tool comes from: a missing one is named in one line with this.
TOOL_HINTS = {
    "gcloud": "install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install), then "
    "`gcloud auth login`",
    "sbatch": "run this on a SLURM login node, or leave out --submit and submit the script there",
    "srun": "run this on a SLURM login node",
}


def missing_tool(tool: str) -> LaunchError:
    hint = TOOL_HINTS.get(tool, "install it or put it on PATH")
    return LaunchError(f"{tool} not found on PATH: {hint}")


class Runner:
    """Runs commands (argument lists, never through a shell) or, with `dry_run`, prints each
    one as a line a user can paste (`shlex.join`), with `note`s as `#` comments."""

    def __init__(
        self,
        dry_run: bool = False,
        out: TextIO | None = None,
        run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
        which: Callable[[str], str | None] | None = None,
    ):
        self.dry_run = dry_run
        self.out = out
        self._run = run
        # A stand-in `run` (tests) has every tool unless told otherwise.
        self._which = which or (shutil.which if run is subprocess.run else (lambda tool: tool))

    def require(self, *tools: str) -> None:
        """Fails (LaunchError naming the tool and where to get it) before anything is done when a
        tool is not on PATH; a dry run needs none."""
        for tool in tools:
            if not self.dry_run and self._which(tool) is None:
                raise missing_tool(tool)

    def show(self, text: str) -> None:
        print(text, file=self.out or sys.stdout, flush=True)

    def note(self, text: str) -> None:
        self.show(f"# {text}")

    def __call__(
        self,
        argv: Sequence[str],
        *,
        check: bool = True,
        quiet: bool = False,
        cwd: str | None = None,
    ) -> int:
        """Runs `argv` (in `cwd`); returns its exit status (0 in a dry run). `check` raises on
        failure."""
        argv = [str(a) for a in argv]
        if self.dry_run:
            self.show(shlex.join(argv))
            return 0
        if not quiet:
            self.show(f"+ {shlex.join(argv)}")
        kwargs = {"capture_output": True, "text": True} if quiet else {}
        if cwd is not None:
            kwargs["cwd"] = cwd
        try:
            result = self._run(argv, check=False, **kwargs)
        except FileNotFoundError:
            raise missing_tool(argv[0]) from None
        if check and result.returncode != 0:
            raise CommandFailed(
                f"command failed (exit status {result.returncode}): {shlex.join(argv)}",
                result.returncode,
            )
        return result.returncode

    def capture(self, argv: Sequence[str]) -> tuple[int, str]:
        """(exit status, standard output) of `argv`, run quietly; a dry run prints it and
        returns (0, "")."""
        argv = [str(a) for a in argv]
        if self.dry_run:
            self.show(shlex.join(argv))
            return 0, ""
        try:
            result = self._run(argv, check=False, capture_output=True, text=True)
        except FileNotFoundError:
            raise missing_tool(argv[0]) from None
        return result.returncode, result.stdout or ""

    def capture_all(self, argv: Sequence[str]) -> tuple[int, str, str]:
        """(exit status, standard output, standard error) of `argv`, run quietly; a dry run
        prints it and returns (0, "", "")."""
        argv = [str(a) for a in argv]
        if self.dry_run:
            self.show(shlex.join(argv))
            return 0, "", ""
        try:
            result = self._run(argv, check=False, capture_output=True, text=True)
        except FileNotFoundError:
            raise missing_tool(argv[0]) from None
        return result.returncode, result.stdout or "", result.stderr or ""


def cloud_state(runner: Runner, argv: Sequence[str], what: str) -> str | None:
    """The state a `gcloud ... describe --format=value(...)` prints (upper case); None only when
    the service answers NOT_FOUND. Any other failure, or an answer without a state, is an
    ApiError naming `what` and gcloud's error line: the caller must not act on it."""
    code, out, err = runner.capture_all(argv)
    if runner.dry_run:
        return None
    text = out.strip().upper()
    if code == 0 and text:
        return text
    if code != 0 and _NOT_FOUND.search(err):
        return None
    why = first_error_line(err) if code != 0 else "it answered without a state"
    raise ApiError(
        f"gcloud could not describe {what} (exit status {code}: {why or 'no message'}); its state "
        "is unknown, not absent",
        code or 1,
    )
