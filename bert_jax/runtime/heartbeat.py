"""Per-host heartbeats of a pretraining run, written into the workdir for a supervisor to read.

Every host of a `pretrain` run writes `<workdir>/launch/heartbeat/process-<i>.json`: the step it
has reached and when, the step it started from, the slowest step it has seen, its attempt (set
by the supervisor through BERT_JAX_LAUNCH_ATTEMPT). `launch tpu watch` reads them to tell a run
that is making progress from one that hangs; `launch tpu status` to show step, speed and ETA.

Cheap and never in the step's way: `beat(step)` only notes the step under a lock; a background
thread writes the file, at once for the first step of a run and then at most once per interval
(BERT_JAX_HEARTBEAT_SECONDS, default 60 s, so a bucket is not hammered), and on `close`. The same
thread copies the host's log (BERT_JAX_LOG_FILE, set by the TPU launcher) to
`<workdir>/launch/logs/` every BERT_JAX_LOG_COPY_SECONDS (default 300 s) and on `close`.
A heartbeat that cannot be written is logged once and never stops the run.

This module imports only `fs`: the pretraining loop calls it without pulling in the launchers.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable

from bert_jax.runtime import fs

INTERVAL_ENV = "BERT_JAX_HEARTBEAT_SECONDS"
LOG_INTERVAL_ENV = "BERT_JAX_LOG_COPY_SECONDS"
ATTEMPT_ENV = "BERT_JAX_LAUNCH_ATTEMPT"
LOG_FILE_ENV = "BERT_JAX_LOG_FILE"
DEFAULT_INTERVAL = 60.0
DEFAULT_LOG_INTERVAL = 300.0
LOG_BYTES = 4 << 20  # the tail of a log that is copied (a week's log can grow large)

log = logging.getLogger("bert_jax")


def directory(workdir: str) -> str:
    return os.path.join(workdir, "launch", "heartbeat")


def logs_directory(workdir: str) -> str:
    return os.path.join(workdir, "launch", "logs")


def _seconds(name: str, default: float) -> float:
    value = os.environ.get(name, "")
    try:
        return float(value) if value else default
    except ValueError:
        log.warning("%s=%r is not a number of seconds; using %g", name, value, default)
        return default


class Heartbeat:
    """What one host tells the supervisor. `beat` is called after every step (cheap)."""

    def __init__(
        self,
        workdir: str,
        process_index: int,
        start_step: int,
        total_steps: int,
        *,
        process_count: int = 1,
        interval: float | None = None,
        log_interval: float | None = None,
        log_file: str | None = None,
        attempt: int | None = None,
        clock: Callable[[], float] = time.time,
    ):
        self.path = os.path.join(directory(workdir), f"process-{process_index}.json")
        self.interval = (
            interval if interval is not None else _seconds(INTERVAL_ENV, DEFAULT_INTERVAL)
        )
        self.log_interval = (
            log_interval
            if log_interval is not None
            else _seconds(LOG_INTERVAL_ENV, DEFAULT_LOG_INTERVAL)
        )
        if attempt is None:
            attempt = int(os.environ.get(ATTEMPT_ENV, "0") or 0)
        self.log_file = log_file if log_file is not None else os.environ.get(LOG_FILE_ENV)
        self.log_copy = os.path.join(
            logs_directory(workdir), f"attempt-{attempt}-process-{process_index}.log"
        )
        self._clock = clock
        now = clock()
        self.record = {
            "process": process_index,
            "process_count": process_count,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "attempt": attempt,
            "start_step": start_step,
            "total_steps": total_steps,
            "step": start_step,
            "step_time": now,
            "started": now,
            "first_step_time": None,
            "slowest_step_seconds": 0.0,
            "seconds_per_step": None,
            "state": "running",
        }
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._dirty = True  # the start is worth telling: restore and compile are done
        self._closing = False
        self._last_write: float | None = None
        self._last_log_copy = now
        self._window: tuple[int, float] = (start_step, now)  # for seconds_per_step
        self._failed = False
        self._thread = threading.Thread(target=self._run, name="bert-jax-heartbeat", daemon=True)
        self._thread.start()

    def beat(self, step: int) -> None:
        now = self._clock()
        with self._lock:
            record = self.record
            if record["first_step_time"] is None:
                record["first_step_time"] = now
                self._wake.set()  # start-up is over: say so at once
            else:  # the first step carries the compilation: not a step time
                record["slowest_step_seconds"] = max(
                    record["slowest_step_seconds"],
                    (now - record["step_time"]) / max(1, step - record["step"]),
                )
            record["step"], record["step_time"] = step, now
            self._dirty = True

    def close(self, state: str = "exited") -> None:
        """Writes the last heartbeat (`state`: done, stopped, exited) and the log; waits for it
        at most 10 s (a bucket that does not answer must not hold the run up)."""
        with self._lock:
            self.record["state"] = state
            self._dirty = True
            self._closing = True
        self._wake.set()
        self._thread.join(timeout=10)

    # --- the writer thread ----------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._lock:
                closing = self._closing
            now = self._clock()
            due = self._last_write is None or now - self._last_write >= self.interval
            if closing or due:
                self._write(now)
            if closing or self.log_file and now - self._last_log_copy >= self.log_interval:
                self._copy_log(now)
            if closing:
                return
            wait = (
                self.interval
                if self._last_write is None
                else (self.interval - (self._clock() - self._last_write))
            )
            if self.log_file:
                wait = min(wait, self.log_interval - (self._clock() - self._last_log_copy))
            self._wake.wait(timeout=max(0.01, wait))
            self._wake.clear()

    def _write(self, now: float) -> None:
        with self._lock:
            if not self._dirty:
                return
            step, start = self.record["step"], self._window
            if step > start[0]:
                self.record["seconds_per_step"] = (self.record["step_time"] - start[1]) / (
                    step - start[0]
                )
                if self.record["first_step_time"] is not None:
                    self._window = (step, self.record["step_time"])
            record = dict(self.record, written=now)
            self._dirty = False
        self._last_write = now

        def write():
            fs.makedirs(os.path.dirname(self.path), exist_ok=True)
            fs.write_text(self.path, json.dumps(record) + "\n")

        self._guard(write, "heartbeat")

    def _copy_log(self, now: float) -> None:
        self._last_log_copy = now
        path = self.log_file
        if not path or not os.path.isfile(path):
            return

        def copy():
            size = os.path.getsize(path)
            with open(path, "rb") as f:
                f.seek(max(0, size - LOG_BYTES))
                data = f.read()
            fs.makedirs(os.path.dirname(self.log_copy), exist_ok=True)
            fs.write_bytes(self.log_copy, data)

        self._guard(copy, "log copy")

    def _guard(self, work: Callable[[], None], what: str) -> None:
        try:
            work()
        except Exception as err:  # a heartbeat must never stop the run
            if not self._failed:
                log.warning("%s to %s failed (the run goes on): %s", what, self.path, err)
                self._failed = True


def read_all(workdir: str) -> list[dict]:
    """Every host's latest heartbeat in the workdir (unreadable ones are skipped)."""
    folder = directory(workdir)
    found = []
    try:
        names = fs.listdir(folder) if fs.isdir(folder) else []
    except FileNotFoundError:
        return []
    for name in names:
        if not (name.startswith("process-") and name.endswith(".json")):
            continue
        try:
            found.append(json.loads(fs.read_text(os.path.join(folder, name))))
        except (OSError, ValueError):
            continue
    return sorted(found, key=lambda r: r.get("process", 0))
