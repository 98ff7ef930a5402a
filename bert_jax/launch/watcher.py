"""The supervisor's loop: observe the slice, the job and the heartbeats; act on `decide`.

`launch tpu up --watch` saves the job (`<workdir>/launch/job.json`: the TPU VM, capacity, pretrain
command, environment; `<workdir>/launch/src.tar.gz`: the source the workers install) and runs
this loop; `launch tpu watch --workdir W` loads them and runs it too, from any machine that can
read the workdir and run gcloud. The rules are in supervisor.py, the pause before the next poll
too (the poll interval, or what a decision names: the re-create delay after a lost slice); what
happened goes to `<workdir>/launch/events.jsonl` (events.py).

Progress is judged on this machine's clock: a stall is "no new step seen in the heartbeats for
the stall timeout"; a watcher that starts afresh counts from its first look.

Only the service's NOT_FOUND makes a queued resource or TPU VM absent. A describe that fails
otherwise (an expired auth token, 429/5xx, a dropped connection: `ApiError`), like any cloud
command that fails, ends the poll before anything is decided: nothing is created, deleted or
restarted because of it. It is retried with backoff (`queued.api_error_backoff`) and said on a
line; `API_ERRORS_EVENT_AFTER` in a row add a `cloud-errors` row to events.jsonl;
`MAX_COMMAND_FAILURES` in a row stop the watch (exit 1; the job goes on).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import TextIO

from bert_jax.launch import CommandFailed, LaunchError, Runner, events, queued, tpu
from bert_jax.launch.supervisor import Decision, Observation, Policy, decide
from bert_jax.launch.workdir_state import (
    LOCK_NAME,
    Job,
    all_stepped,
    latest_checkpoint,
    model_exported,
    source_path,
)
from bert_jax.runtime import fs, heartbeat

ATTEMPT_ENV = heartbeat.ATTEMPT_ENV
MAX_COMMAND_FAILURES = 10
API_ERRORS_EVENT_AFTER = 3  # failed polls in a row that make a `cloud-errors` row


def parse_job_status(output: str) -> tuple[str, tuple[int, ...]]:
    """(none | running | exited | unknown, exit statuses) from the workers' status lines."""
    states = [
        line.split(":", 1)[1].strip()
        for line in output.splitlines()
        if line.startswith("bert-jax-job:")
    ]
    if not states:
        return "unknown", ()
    exited = tuple(
        int(s.split()[1]) for s in states if s.startswith("exited ") and s.split()[1].isdigit()
    )
    if any(s in ("running", "starting") for s in states):
        return "running", exited
    if exited:
        return "exited", exited
    return "none", ()


class Watcher:
    """One supervisor: `run()` polls until the run is done or cannot go on; returns the exit
    status of `launch tpu watch` (0 done, 2/4 the job's own, 1 a budget spent)."""

    def __init__(
        self,
        job: Job,
        policy: Policy,
        runner: Runner,
        *,
        stream: bool = True,
        out: TextIO | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.job, self.policy, self.runner = job, policy, runner
        self.vm, self.qr = job.vm, job.qr
        self.stream, self.out = stream, out or sys.stdout
        self.clock, self.sleep = clock, sleep
        self.log = events.EventLog(job.workdir, clock)
        self._progress: tuple[int, int, float] | None = None  # (attempt, step, seen at)
        self._streamer: subprocess.Popen | None = None
        self._command_failures = 0
        self._interrupted = threading.Event()
        self._waiting: str | None = None
        self._next_pause = policy.poll_seconds  # what the last decision said, else the poll

    # --- observing --------------------------------------------------------------------------
    def say(self, text: str) -> None:
        stamp = time.strftime("%H:%M:%S", time.localtime(self.clock()))
        print(f"[watch {stamp}] {text}", file=self.out, flush=True)

    def _heartbeats(self) -> list[dict]:
        attempt = self.log.attempt
        return [h for h in heartbeat.read_all(self.job.workdir) if h.get("attempt") == attempt]

    def _where(self, beats: Sequence[dict]) -> dict:
        """step / step_time / checkpoint fields for an event row."""
        fields: dict = {
            "attempt": self.log.attempt,
            "checkpoint": latest_checkpoint(self.job.workdir),
        }
        if beats:
            newest = max(beats, key=lambda h: (h.get("step", 0), h.get("step_time", 0)))
            fields.update(step=newest["step"], step_time=newest["step_time"])
            fields["start_step"] = min(h.get("start_step", 0) for h in beats)
        return fields

    def observe(self) -> tuple[Observation, list[dict]]:
        qr_state = queued.state(self.qr, self.runner) if self.qr else None
        node_state = None
        if self.qr is None or qr_state == "ACTIVE":
            node_state = queued.node_state(self.vm, self.runner)
        job, statuses = "none", ()
        if node_state == "READY":
            code, output = self.runner.capture(self.vm.ssh_command(self.vm.status_script()))
            job, statuses = parse_job_status(output) if code == 0 else ("unknown", ())
        beats = self._heartbeats()
        now = self.clock()
        since_progress = None
        if all_stepped(beats):  # start-up is over once every host has done a step
            step = max(h["step"] for h in beats)
            attempt = self.log.attempt
            if self._progress is None or self._progress[0] != attempt or step > self._progress[1]:
                self._progress = (attempt, step, now)
            since_progress = now - self._progress[2]
        starts = [r for r in self.log.rows if r["event"] in events.STARTS]
        counts = events.counts(self.log.rows)
        lost = events.lost_at(self.log.rows)
        obs = Observation(
            queued=self.qr is not None,
            qr_state=qr_state,
            node_state=node_state,
            job=job,
            exit_statuses=statuses,
            model_exported=model_exported(self.job.workdir),
            since_start=now - starts[-1]["time"] if starts else None,
            since_progress=since_progress,
            slowest_step=max((h.get("slowest_step_seconds") or 0.0 for h in beats), default=0.0),
            preemptions=counts["preempted"],
            failures=counts["failed"] + counts["stalled"],
            attempt=self.log.attempt,
            since_lost=None if lost is None else now - lost,
        )
        self._note_milestones(obs, beats)
        return obs, beats

    def _note_milestones(self, obs: Observation, beats: list[dict]) -> None:
        """`active` when the slice is first seen ready, `running` at an attempt's first step."""
        rows = self.log.rows
        said = [events.kind(r).slice for r in rows if events.kind(r).slice]
        last_said = said[-1] if said else None
        if obs.node_state == "READY" and last_said not in (None, "ready"):
            self.log.append("active", attempt=self.log.attempt)
            self.say(f"slice {self.vm.name} is ready")
        attempt = self.log.attempt
        seen = any(r["event"] == "running" and r.get("attempt") == attempt for r in rows)
        if attempt and not seen and all_stepped(beats):
            first = [h["first_step_time"] for h in beats]
            start = min(h.get("start_step", 0) for h in beats)
            self.log.append(
                "running", attempt=attempt, step=start + 1, step_time=max(first), start_step=start
            )
            self.say(f"attempt {attempt}: first step done (resumed from step {start})")

    # --- acting -----------------------------------------------------------------------------
    def _last_lines(self, lines: int = 20) -> list[str]:
        code, output = self.runner.capture(self.vm.ssh_command(self.vm.tail_script(lines)))
        kept = [line for line in output.splitlines() if line.strip()]
        return kept[-2 * lines :] if code == 0 else []

    def _create(self) -> None:
        self.log.append("queued", attempt=self.log.attempt, capacity=self.job.capacity)
        if self.qr is not None:
            self.say(
                f"asking for {self.vm.accelerator_type} ({self.job.capacity}) through a "
                "queued resource"
            )
            queued.create(self.qr, self.runner)
        else:
            tpu.create(self.vm, self.runner)

    def _delete_slice(self, obs: Observation) -> None:
        """Deletes what the observation saw (no describe of its own, which could fail between
        an event row and the delete, and make the next poll record the event again)."""
        if self.qr is not None:
            queued.delete(self.qr, self.runner, obs.qr_state)
        elif obs.node_state is not None:
            tpu.delete(self.vm, self.runner)

    def _release_lock(self) -> None:
        """The workdir lock of a run whose slice is gone: its holder died with the slice, and a
        new slice's hosts (other host names) could not tell; the next start would be refused."""
        lock = os.path.join(self.job.workdir, LOCK_NAME)
        if fs.exists(lock):
            holder = fs.read_text(lock).strip()
            fs.remove(lock)
            self.say(f"removed the lock of the run that died with the slice ({holder})")

    def _setup(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            archive = os.path.join(tmp, "src.tar.gz")
            fs.copy_to_local(source_path(self.job.workdir), archive)
            self.runner(
                self.vm.ssh_command(f"mkdir -p {shlex.quote(self.vm.remote_dir)}"), quiet=True
            )
            self.runner(self.vm.scp_command(archive, self.vm.path("src.tar.gz")), quiet=True)
            self.runner(
                self.vm.ssh_command(
                    self.vm.install_script(self.job.jax_spec, self.job.setup_commands)
                ),
                quiet=True,
            )

    def _start(self, event: str) -> None:
        attempt = self.log.attempt + 1
        env = tpu.run_environment({**dict(self.job.env), ATTEMPT_ENV: str(attempt)})
        self.runner(
            self.vm.ssh_command(self.vm.start_script(self.job.pretrain_args, env)), quiet=True
        )
        self.log.append(event, attempt=attempt, checkpoint=latest_checkpoint(self.job.workdir))
        self._progress = None
        self.say(
            f"attempt {attempt} {event} (latest checkpoint: {latest_checkpoint(self.job.workdir)})"
        )
        self._follow()

    def _stop_job(self) -> None:
        """SIGTERM every worker's run, then SIGKILL what is left after the grace period."""
        self.runner(self.vm.ssh_command(self.vm.stop_script()), check=False, quiet=True)
        deadline = self.clock() + self.policy.stop_grace
        while self.clock() < deadline:
            code, output = self.runner.capture(self.vm.ssh_command(self.vm.status_script()))
            if code == 0 and parse_job_status(output)[0] != "running":
                return
            self.sleep(min(5.0, self.policy.poll_seconds))
        self.runner(self.vm.ssh_command(self.vm.kill_script()), check=False, quiet=True)
        for _ in range(30):
            code, output = self.runner.capture(self.vm.ssh_command(self.vm.status_script()))
            if code == 0 and parse_job_status(output)[0] != "running":
                return
            self.sleep(1.0)

    def _follow(self) -> None:
        """Streams worker 0's log here (foreground only), replacing an earlier stream."""
        self._unfollow()
        if self.stream and not self.runner.dry_run:
            self._streamer = subprocess.Popen(
                self.vm.ssh_command(self.vm.logs_script(), worker=0),
                stdout=self.out if self.out is not sys.stdout else None,
                stderr=subprocess.DEVNULL,
            )

    def _unfollow(self) -> None:
        if self._streamer is not None and self._streamer.poll() is None:
            self._streamer.terminate()
            self._streamer.wait()
        self._streamer = None

    def act(self, decision: Decision, obs: Observation, beats: list[dict]) -> int | None:
        """Carries out one decision; an exit status when the watch is over."""
        if decision.action == "wait":
            if decision.reason != self._waiting:  # a line per change of state, not per poll
                asked = [r for r in self.log.rows if r["event"] == "queued"]
                waited = ""
                if obs.qr_state in queued.WAITING and asked:
                    waited = f", waited {queued.duration(self.clock() - asked[-1]['time'])}"
                self.say(decision.reason + waited)
                self._waiting = decision.reason
            return None
        self._waiting = None
        self.say(f"{decision.action}: {decision.reason}")
        where = self._where(beats)
        if decision.action == "create":
            self._create()
        elif decision.action == "recreate":
            self.log.append(decision.event, reason=decision.reason, **where)
            self._unfollow()
            self._delete_slice(obs)
            self._release_lock()
        elif decision.action == "start":
            self._setup()
            self._start("started")
        elif decision.action == "restart":
            lines = self._last_lines()
            self.log.append(decision.event, reason=decision.reason, last_lines=lines, **where)
            self._stop_job()
            self._start("restarted")
        elif decision.action in ("finish", "give-up"):
            return self._end(decision, obs, where)
        return None

    def _end(self, decision: Decision, obs: Observation, where: dict) -> int:
        self._unfollow()
        if decision.action == "give-up":
            lines = self._last_lines() if obs.node_state == "READY" else []
            self.log.append(decision.event, reason=decision.reason, last_lines=lines, **where)
            self.log.append(
                "gave-up", reason=decision.reason, exit_status=decision.exit_status, **where
            )
            if obs.job == "running":
                self._stop_job()
            self.say(f"gave up: {decision.reason}")
            if lines:
                self.say("the log's last lines:\n" + "\n".join(lines))
        else:
            self.log.append("finished", reason=decision.reason, **where)
            model = os.path.join(self.job.workdir, "model")
            self.say(f"finished: {decision.reason}; the model is in {model}")
        if self.policy.keep:
            self.say(f"keeping {self.vm.name} (--keep)")
        else:
            self._delete_slice(obs)
            self.log.append("deleted", attempt=self.log.attempt)
            self.say(f"deleted {self.vm.name}")
        return int(decision.exit_status or 0)

    def poll_once(self) -> int | None:
        obs, beats = self.observe()
        if obs.job == "running" and self._streamer is None:
            self._follow()  # a watcher that found the job running streams it too
        decision = decide(obs, self.policy)
        self._next_pause = self.policy.poll_seconds if decision.pause is None else decision.pause
        return self.act(decision, obs, beats)

    def _check_alone(self) -> None:
        """Two supervisors of one run would both recreate and restart: refuse to start beside a
        live one on this host; name one on another host (it cannot be checked from here)."""
        last = None
        for row in self.log.rows:
            if row["event"] == "watching":
                last = row
            elif events.kind(row).ends_watching:
                last = None
        if last is None or last.get("pid") == os.getpid():
            return
        if last.get("host") == os.uname().nodename:
            try:
                os.kill(int(last["pid"]), 0)
            except (ProcessLookupError, ValueError, TypeError):
                return  # it died without saying so
            except PermissionError:
                pass
            raise LaunchError(
                f"another supervisor watches this run (pid {last['pid']} on this host): stop it "
                f"first (kill -INT {last['pid']}), or leave it to watch"
            )
        self.say(
            f"note: a supervisor on {last.get('host')} (pid {last.get('pid')}) started watching "
            "this run and never said it stopped; if it still runs, stop one of the two"
        )

    def _failed_poll(self, err: CommandFailed) -> float:
        """Counts and reports a poll that a cloud command ended (nothing was decided on it);
        the pause before the next one. MAX_COMMAND_FAILURES in a row stop the watch."""
        self._command_failures += 1
        failures = self._command_failures
        if failures >= MAX_COMMAND_FAILURES:
            reason = f"{failures} failed polls in a row: {err}"
            self.log.append("stopped-watching", attempt=self.log.attempt, reason=reason)
            self.say(f"{err} ({failures} in a row: stopping the watch; the job goes on)")
            raise err
        if failures == API_ERRORS_EVENT_AFTER:
            self.log.append(
                "cloud-errors", attempt=self.log.attempt, count=failures, error=str(err)
            )
        delay = queued.api_error_backoff(self.policy.poll_seconds, failures)
        self.say(f"{err} ({failures} in a row; nothing done on it, retrying in {delay:g} s)")
        return delay

    def _pause(self, seconds: float) -> None:
        if self.sleep is time.sleep:
            self._interrupted.wait(seconds)  # Ctrl-C ends the wait at once
        else:
            self.sleep(seconds)

    def run(self) -> int:
        """Polls until done. Ctrl-C (SIGINT) is taken between actions, never inside one: an
        action started (a create, a restart) is finished and recorded first."""
        self._check_alone()
        previous = None
        with contextlib.suppress(ValueError):  # not the main thread: no handler
            previous = signal.signal(signal.SIGINT, lambda *_: self._interrupted.set())
        self.log.append(
            "watching",
            attempt=self.log.attempt,
            host=os.uname().nodename,
            pid=os.getpid(),
            policy=self.policy.to_dict(),
        )
        self.say(
            f"watching {self.vm.name} ({self.job.workdir}) every {self.policy.poll_seconds:g} s; "
            "Ctrl-C stops the watching, not the job"
        )
        try:
            while not self._interrupted.is_set():
                try:
                    status = self.poll_once()
                except CommandFailed as err:
                    self._pause(self._failed_poll(err))
                    continue
                if self._command_failures:
                    self.say(
                        f"cloud commands work again after {self._command_failures} failed poll(s)"
                    )
                    self._command_failures = 0
                if status is not None:
                    return status
                self._pause(self._next_pause)
            self.log.append("stopped-watching", attempt=self.log.attempt)
            self.say(
                "stopped watching; the job goes on. Watch again with `bert-jax launch tpu watch "
                f"--workdir {self.job.workdir}`; `bert-jax launch tpu status --workdir "
                f"{self.job.workdir}` says where it is"
            )
            return 130
        finally:
            self._unfollow()
            if previous is not None:
                signal.signal(signal.SIGINT, previous)


def detach(watch_argv: Sequence[str], pid_file: str, log_file: str) -> int:
    """`bert-jax WATCH_ARGV` in the background, in a session of its own (a closed terminal does
    not end it), its output appended to `log_file`; writes its pid to `pid_file`."""
    with open(log_file, "a", encoding="utf-8") as log:
        child = subprocess.Popen(
            [sys.executable, "-m", "bert_jax.cli", *watch_argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    with open(pid_file, "w", encoding="utf-8") as f:
        f.write(f"{child.pid}\n")
    return child.pid
