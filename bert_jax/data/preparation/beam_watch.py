"""What a ``data prepare --runner beam`` job shows (``beam_pipeline.py``): bert-jax's progress
lines, from the shards that appear in the output directory (``ShardWatch``, whatever the runner:
workers on other machines included); Beam's counters ``COUNTERS`` (``count`` in a step,
``job_counters`` at the end; Dataflow's console lists them under the job's custom counters);
Beam's own log lines hidden below ``LOG_LEVEL_OPTION``'s level, ERROR unless it is given
(``HideBeam`` in this process; the FnApiRunner's worker processes write theirs to a file:
``beam_workers.Standbys``).

Beam is imported inside the functions that need it.
"""

from __future__ import annotations

import logging
import os
import threading

from bert_jax.data.preparation import groups as groups_lib
from bert_jax.data.preparation import progress as prepare_lib
from bert_jax.data.preparation.beam_workers import LOG_LEVEL_OPTION
from bert_jax.runtime import fs
from bert_jax.runtime.errors import UserError

# Beam's counters (Metrics.counter), in this namespace: what Dataflow's console shows of a job.
COUNTER_NAMESPACE = "bert_jax.prepare"
COUNTERS = (
    "documents",
    "input_bytes",
    "groups",
    "instances",
    "heldout_groups",
    "heldout_instances",
)
# A user error raised in a step crosses the runner as text: this mark finds its line again.
USER_ERROR_MARK = "[bert-jax user error] "
# How often the launching machine looks for new shards (a bucket's listing costs a request).
_POLL_SECONDS = {"local": 1.0, "remote": 10.0}


def beam_log_level(options) -> int | None:
    """The level of Beam's own log lines that a run shows: Beam's ``LOG_LEVEL_OPTION`` where it
    is given, else None (only errors)."""
    given = options.get_all_options(drop_default=True).get(LOG_LEVEL_OPTION)
    if given is None:
        return None
    level = int(given) if str(given).isdecimal() else logging.getLevelName(str(given).upper())
    if not isinstance(level, int):
        raise UserError(
            f"--{LOG_LEVEL_OPTION}={given}: not a log level (DEBUG, INFO, WARNING, ERROR)"
        )
    return level


class HideBeam(logging.Filter):
    """Drops Beam's own records below ``level`` (whatever logger its code used, the root logger
    included), and its report of a step that failed with a user error (``USER_ERROR_MARK``:
    the command says that one line itself); keeps a Dataflow job's state and console link."""

    _BEAM_DIR = f"{os.sep}apache_beam{os.sep}"

    def __init__(self, level: int):
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("apache_beam.runners.dataflow"):
            return True
        if not (record.name.startswith("apache_beam") or self._BEAM_DIR in record.pathname):
            return True
        return record.levelno >= self.level and USER_ERROR_MARK not in record.getMessage()


class ShardWatch(threading.Thread):
    """Progress lines while a job runs: the groups in ``todo`` (``{records directory: its
    groups}``: the training records' and the held-out records') whose shard has appeared,
    counted by this process, so they come whatever the runner (workers on other machines
    included), in the local path's format."""

    def __init__(self, todo: dict[str, frozenset[int]]):
        super().__init__(name="bert-jax-shard-watch", daemon=True)
        self.todo = todo
        self.seen: set[tuple[str, int]] = set()
        total = sum(len(groups) for groups in todo.values())
        self.rate = prepare_lib._Rate("groups written", total, every=max(1, total // 20))
        remote = "remote" if any(fs.is_remote(d) for d in todo) else "local"
        self.poll_seconds = _POLL_SECONDS[remote]
        self.stopped = threading.Event()

    def poll(self) -> None:
        new = set()
        for directory, groups in self.todo.items():
            try:
                parts = groups_lib.existing_parts(directory)
            except Exception:  # a listing that failed (or no heldout/ yet): the next one will tell
                continue
            written = {g for g, suffixes in parts.items() if "tfrecord" in suffixes} & groups
            new |= {(directory, g) for g in written}
        new -= self.seen
        if new:
            self.seen |= new
            self.rate.tick(len(new))

    def run(self) -> None:
        while not self.stopped.wait(self.poll_seconds):
            self.poll()

    def stop(self) -> None:
        self.stopped.set()
        self.join()
        self.poll()


def job_counters(result) -> dict[str, int]:
    """Beam's committed counters of a finished job (``COUNTERS``), by name; {} where the runner
    keeps none."""
    from apache_beam.metrics.metric import MetricsFilter

    try:
        found = result.metrics().query(MetricsFilter().with_namespace(COUNTER_NAMESPACE))
    except Exception:  # a runner without metrics (or a job that runs on)
        return {}
    counters: dict[str, int] = {}
    for counter in found["counters"]:
        name = counter.key.metric.name
        counters[name] = counters.get(name, 0) + (counter.committed or 0)
    return counters


def count(name: str, value: int) -> None:
    from apache_beam.metrics.metric import Metrics

    Metrics.counter(COUNTER_NAMESPACE, name).inc(value)
