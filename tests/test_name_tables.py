"""Families of names kept as one table each (STYLE 22), walked the way tests/test_declarations.py
walks settings: the supervisor's events (launch/events.py EVENTS) with their badput cause, restart
and run-ending attributes, and the consumers that read them."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

from bert_jax.launch import LaunchError, events, slurm, workdir_state

LAUNCH = pathlib.Path(events.__file__).parent


# --- the supervisor's events -----------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(events.EVENTS))
def test_every_event_has_a_meaning_and_a_known_mode(name):
    event = events.EVENTS[name]
    assert event.name == name and event.meaning
    assert event.after in (None, events.RUNNING, *events.CAUSES), event.after
    assert event.slice in (None, "asked", "ready", "lost")
    if event.restart_cause:  # a restart's cause ends the run and says where the time goes
        assert event.ends_run and event.after in events.CAUSES
    if event.final:  # the run is over: no run of steps nor supervisor goes on after it
        assert event.ends_run and event.ends_watching
    if event.starts_attempt:
        assert event.after == "startup"


def test_the_tables_consumers_read_what_they_used_to_spell():
    # The names events.jsonl holds, and the order `launch ... status` lists the restarts in.
    assert events.RESTART_CAUSES == ("preempted", "stalled", "failed")
    assert events.STARTS == ("started", "restarted")
    assert set(events.named(final=True)) == {"finished", "gave-up"}
    assert list(events.CAUSES) == ["capacity", "startup", "lost", "stall", "other"]
    assert events.counts([{"event": "failed"}, {"event": "stalled"}, {"event": "deleted"}]) == {
        "preempted": 0,
        "stalled": 1,
        "failed": 1,
    }
    # A row of a kind this version does not know changes nothing.
    assert events.kind({"event": "from-a-newer-version"}) is events.NOT_KNOWN


def test_an_event_outside_the_table_is_refused(tmp_path):
    log = events.EventLog(str(tmp_path), clock=lambda: 1.0)
    with pytest.raises(ValueError, match="not one of events.EVENTS"):
        log.append("stoped")
    assert events.read(str(tmp_path)) == []


def _literal_events(source: str) -> set[str]:
    """Event names the code spells: `....log.append("NAME", ...)` and the event of a
    `Decision(action, "NAME", ...)` or `_failure(obs, policy, "NAME", ...)`."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        where = {"append": 0, "Decision": 1, "_failure": 2, "_start": 0}.get(name)
        if name == "append" and not ast.unparse(func.value).endswith("log"):
            continue
        if where is not None and len(node.args) > where:
            arg = node.args[where]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.add(arg.value)
    return found


def test_every_event_the_launcher_writes_is_in_the_table():
    written = set()
    for path in sorted(LAUNCH.glob("*.py")):
        written |= _literal_events(path.read_text())
    assert written <= set(events.EVENTS), written - set(events.EVENTS)
    # The walk sees the supervisor's and the watcher's rows (it is not vacuous).
    assert {"queued", "active", "running", "restarted", "gave-up", "cloud-errors"} <= written


def test_a_job_script_records_only_what_record_event_takes(tmp_path):
    script = slurm.SlurmJob(nodes=1).script(["--workdir", str(tmp_path / "run")])
    recorded = set(re.findall(r"launch slurm record (\S+) --workdir", script))
    assert recorded and recorded <= set(events.named(job_script=True))
    with pytest.raises(LaunchError, match="use one of started, preempted"):
        workdir_state.record_event(str(tmp_path), "running")
