"""host_memory: a function in a child process, its result, notes and errors brought back, and
the child stopped past a host-memory limit; compile_check's watched compile and the compile
cache's memory of a program too large for a host (the two that compile for a TPU slice are marked
`tpu_compile`: `make test-tpu`)."""

from __future__ import annotations

import json
import os
import time

import pytest

from bert_jax.planning import compile_check
from bert_jax.runtime import caches, host_memory, topology
from bert_jax.runtime.errors import UserError
from tests import host_memory_children as children
from tests.test_topology import small_config


def test_the_childs_result_notes_and_errors_come_back():
    notes = []
    result = host_memory.run_watched(
        children.adds, 2, 3, what="adding", on_note=lambda *n: notes.append(n)
    )
    assert result == 5 and notes == [("adding", 2), ("adding", 3)]
    with pytest.raises(UserError, match="--seed is wrong"):  # a user error stays one
        host_memory.run_watched(children.refuses, "seed", what="refusing")
    with pytest.raises(ValueError, match="shapes differ") as raised:  # a bug: with the
        host_memory.run_watched(children.differs, what="comparing")  # child's traceback as a note
    assert "in differs" in raised.value.__notes__[0] and not isinstance(raised.value, UserError)
    with pytest.raises(host_memory.ChildDied, match="^crashing: its process ended by SIGSEGV$"):
        host_memory.run_watched(children.crashes, what=lambda: "crashing")  # a crash in native code
    unpicklable = r"(?s)breaking failed in its process:\n.*Unpicklable: 1 2"
    with pytest.raises(RuntimeError, match=unpicklable):
        host_memory.run_watched(children.breaks, what="breaking")


def test_a_child_past_the_limit_is_stopped_and_named():
    """The child imports what it needs (well under 1 GiB), says so, then grows 64 MiB at a time:
    it is stopped past the limit, named by its latest note."""
    started, doing = time.perf_counter(), ["importing"]
    with pytest.raises(host_memory.HostMemoryError) as raised:
        host_memory.run_watched(
            children.grows,
            64,
            what=lambda: doing[-1],
            on_note=doing.append,
            limit=1024 * children.MIB,
        )
    message = str(raised.value)
    assert message.startswith("allocating held ") and "past the limit of 1.00 GiB" in message
    assert host_memory.LIMIT_ENV in message and time.perf_counter() - started < 60


def test_the_limit_is_the_setting_or_what_the_host_has(monkeypatch):
    monkeypatch.setenv(host_memory.LIMIT_ENV, "2.5")
    assert host_memory.limit_bytes() == int(2.5 * 1024**3)
    for bad in ("lots", "0", "-1", "nan", "inf"):
        monkeypatch.setenv(host_memory.LIMIT_ENV, bad)
        with pytest.raises(UserError, match=f"GIB='{bad}' is not a positive number of GiB"):
            host_memory.limit_bytes()
    monkeypatch.delenv(host_memory.LIMIT_ENV)
    info = host_memory._meminfo()  # noqa: SLF001
    assert 0 < host_memory.limit_bytes() < info["MemAvailable"]
    assert 0 < host_memory.resident_bytes(os.getpid()) < info["MemTotal"]


@pytest.mark.tpu_compile
def test_a_watched_compile_check_equals_one_in_process():
    target = topology.parse("v5p-8")
    watched = compile_check.check(small_config(), target, watched=True)
    here = compile_check.check(small_config(), target)
    assert [p.program_key for p in watched.phases] == [p.program_key for p in here.phases]
    assert [p.memory for p in watched.phases] == [p.memory for p in here.phases]
    assert watched.fits and watched.target == target


def test_a_program_too_large_for_the_host_is_remembered_for_that_limit(monkeypatch, tmp_path):
    """The compile cache keeps the verdict with the limit it was stopped at: a run under that
    limit or less is refused at once, one with more memory compiles again."""
    monkeypatch.setenv(caches.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(host_memory, "limit_bytes", lambda: 8 * 1024**3)

    def stopped(fn, *args, what, on_note, limit, **_):
        on_note("c" * 64, "compiling config.phase1 (global batch 16, seq 32) for v5p-8")
        on_note("", "the compile check for v5p-8")  # phase 1 compiled: not the one stopped
        on_note("k" * 64, "compiling config.phase2 (global batch 16, seq 128) for v5p-8")
        raise host_memory.HostMemoryError(f"{what()} held 8.1 GiB ... past the limit")

    monkeypatch.setattr(host_memory, "run_watched", stopped)
    target = topology.parse("v5p-8")
    with pytest.raises(host_memory.HostMemoryError, match="compiling config.phase2 .* held"):
        compile_check.check(small_config(), target, watched=True)
    assert os.listdir(tmp_path / "tpu_compiles") == [f"{'k' * 64}.json"]
    with open(tmp_path / "tpu_compiles" / f"{'k' * 64}.json", encoding="utf-8") as f:
        entry = json.load(f)
    assert entry["host_memory_limit"] == 8 * 1024**3
    monkeypatch.setattr(compile_check, "_host_limit", 8 * 1024**3)
    with pytest.raises(host_memory.HostMemoryError, match="found in the compile cache"):
        compile_check._cache_read("k" * 64)  # noqa: SLF001
    monkeypatch.setattr(compile_check, "_host_limit", 16 * 1024**3)
    assert compile_check._cache_read("k" * 64) is None  # noqa: SLF001


@pytest.mark.tpu_compile
def test_a_host_with_tpu_chips_compiles_in_process(monkeypatch):
    """A TPU VM has the memory, and its chips take one process: no child there."""
    monkeypatch.setattr(compile_check, "has_local_tpu_chips", lambda: True)
    monkeypatch.setattr(host_memory, "run_watched", pytest.fail)
    report = compile_check.check(small_config(), topology.parse("v5p-8"), watched=True)
    assert report.fits


def test_the_child_takes_the_environment_given_and_ours_is_left_as_it_was(monkeypatch):
    monkeypatch.setenv("BERT_JAX_TEST_KEPT", "kept")
    monkeypatch.setenv("BERT_JAX_TEST_GONE", "here")
    change = {"BERT_JAX_TEST_GONE": None, "BERT_JAX_TEST_NEW": "new"}
    names = ("BERT_JAX_TEST_KEPT", "BERT_JAX_TEST_GONE", "BERT_JAX_TEST_NEW")
    seen = host_memory.run_watched(children.reads, *names, what="reading", environment=change)
    assert seen == {
        "BERT_JAX_TEST_KEPT": "kept",
        "BERT_JAX_TEST_GONE": None,
        "BERT_JAX_TEST_NEW": "new",
    }
    assert os.environ["BERT_JAX_TEST_GONE"] == "here" and "BERT_JAX_TEST_NEW" not in os.environ


def test_a_compiling_child_drops_only_the_jax_platforms_bert_jax_chose(monkeypatch):
    """quiet_runtime_without_chips's JAX_PLATFORMS=cpu crashed XLA's TPU compiler on a large
    program (topology.compile_environment); a JAX_PLATFORMS the user set stays."""
    monkeypatch.setattr(topology, "has_local_tpu_chips", lambda: False)
    monkeypatch.setattr(topology, "_other_plugins", lambda: False)
    monkeypatch.delenv("JAX_PLATFORMS")
    for name in ("TPU_SKIP_MDS_QUERY", "ALLOW_MULTIPLE_LIBTPU_LOAD"):  # restored after the test
        monkeypatch.setenv(name, "1")
    topology.quiet_runtime_without_chips()
    assert os.environ["JAX_PLATFORMS"] == "cpu"
    assert topology.compile_environment() == {
        "JAX_PLATFORMS": None,
        "BERT_JAX_SET_JAX_PLATFORMS": None,
    }
    monkeypatch.delenv("BERT_JAX_SET_JAX_PLATFORMS")  # as the user's own JAX_PLATFORMS=cpu
    assert topology.compile_environment() == {}


def test_ctrl_c_stops_the_child_without_its_stack(tmp_path):
    """Ctrl-C reaches the whole process group: the child ignores it (no KeyboardInterrupt stack
    of its own), the parent is interrupted, and the child is gone with it. Both Pythons start
    with SIGINT handled as a terminal's foreground command has it: a test run started in the
    background (`make test &`, nohup) ignores SIGINT, and a Python started so keeps ignoring it."""
    import signal
    import subprocess
    import sys
    import textwrap

    ours = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert host_memory.run_watched(children.waits, 0.0, what="waiting")  # SIGINT ignored there
    finally:
        signal.signal(signal.SIGINT, ours)
    started = tmp_path / "started"
    script = textwrap.dedent(
        f"""
        import pathlib
        import signal

        signal.signal(signal.SIGINT, signal.default_int_handler)
        from bert_jax.runtime import host_memory
        from tests import host_memory_children as children

        def note(*_):
            pathlib.Path({str(started)!r}).write_text("yes")

        try:
            host_memory.run_watched(children.waits, 120.0, what="waiting", on_note=note)
        except KeyboardInterrupt:
            print("interrupted")
        """
    )
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.Popen(
        [sys.executable, "-c", script], cwd=repo, start_new_session=True, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    for _ in range(600):
        if started.exists() or proc.poll() is not None:
            break
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: every process of the group
    out, err = proc.communicate(timeout=60)
    assert out.strip() == "interrupted", err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
