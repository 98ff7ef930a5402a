"""A function run in a child process, stopped before it exhausts this host's memory.

XLA's compile of a large program for a TPU slice asks much of the host planning it: BERT-Large
at seq 512 with rematerialization for a v4-8 held 17.9 GiB here (288 s). Where a host has less,
the kernel's OOM killer ends the whole command with SIGKILL and no word; and the same compile
crashed XLA (SIGSEGV in a compiler thread, after about a minute) in 6 of 11 runs here (see
`topology.compile_environment`), which in the command's own process ends it too.
`run_watched` runs such a function in a spawned process and reads the child's resident anonymous
memory five times a second: past the limit it kills the child and raises `HostMemoryError`,
naming what was running and the limit; a child that dies raises `ChildDied`, naming the signal.
Either way the caller goes on.

The limit: ``$BERT_JAX_HOST_MEMORY_GIB`` if set, else the memory the host has available when the
child starts less a margin (the larger of 1 GiB and 5% of the host's memory). Where /proc cannot
be read (not Linux) the child runs unwatched.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import threading
import traceback
from collections.abc import Callable
from typing import Any

from bert_jax.runtime.errors import UserError

GIB = 1024**3
LIMIT_ENV = "BERT_JAX_HOST_MEMORY_GIB"
_POLL_SECONDS = 0.2


class ChildDied(RuntimeError):
    """The child ended without a result or an error: a signal (a crash in native code) or exit."""


class HostMemoryError(UserError):
    """The child passed the host-memory limit and was stopped; the message names what it ran."""


def _meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes ({} where there is none)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            rows = [line.split() for line in f]
    except OSError:
        return {}
    return {row[0].rstrip(":"): int(row[1]) * 1024 for row in rows if len(row) >= 2}


def limit_bytes() -> int | None:
    """The most memory a watched child may hold (see the module docstring); None: unwatched."""
    if os.environ.get(LIMIT_ENV):
        try:
            gib = float(os.environ[LIMIT_ENV])
        except ValueError:
            gib = float("nan")
        if not gib > 0 or gib == float("inf"):
            raise UserError(
                f"{LIMIT_ENV}={os.environ[LIMIT_ENV]!r} is not a positive number of GiB"
            )
        return int(gib * GIB)
    info = _meminfo()
    if "MemAvailable" not in info:
        return None
    margin = max(GIB, info.get("MemTotal", 0) // 20)
    return max(info["MemAvailable"] - margin, GIB // 2)


def resident_bytes(pid: int) -> int | None:
    """The process's resident anonymous memory (its heap: what the OOM killer weighs), or None."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
        return None
    value = fields.get("RssAnon") or fields.get("VmRSS")
    return int(value.split()[0]) * 1024 if value else None


def _child(conn, fn: Callable[..., Any], args: tuple) -> None:
    """Runs in the spawned process: ("done", result), or the error as ("raise", (error, its
    traceback text)) when it pickles whole, else ("bug", traceback text)."""
    try:
        result = fn(lambda *message: conn.send(("note", message)), *args)
        conn.send(("done", result))
    except BaseException as err:  # noqa: BLE001 (every failure goes back to the parent)
        text = traceback.format_exc()
        try:
            pickle.loads(pickle.dumps(err))
        except Exception:  # noqa: BLE001
            conn.send(("bug", text))
        else:
            conn.send(("raise", (err, text)))
    finally:
        conn.close()


def run_watched(
    fn: Callable[..., Any],
    *args: Any,
    what: str | Callable[[], str],
    on_note: Callable[..., None] = lambda *_: None,
    limit: int | None = None,
    environment: dict[str, str | None] | None = None,
) -> Any:
    """``fn(note, *args)`` in a spawned process, its result returned and its error raised here.
    ``fn`` (a module-level function) may call ``note(*values)``: ``on_note(*values)`` runs here.
    Past `limit` bytes (default `limit_bytes()`) the child is killed and HostMemoryError raised,
    naming `what` (a callable: what the child is doing by its latest note). `environment`:
    variables set (or, None, removed) for the child."""
    limit = limit_bytes() if limit is None else limit
    describe = what if callable(what) else (lambda: what)
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(send, fn, args), daemon=True)
    saved = dict(os.environ)
    # Ctrl-C reaches the whole process group: the child ignores it (an ignored signal stays
    # ignored in the spawned interpreter) and the caller, interrupted, kills it below; without
    # this the child would print its own KeyboardInterrupt stack.
    main_thread = threading.current_thread() is threading.main_thread()
    interrupt = signal.signal(signal.SIGINT, signal.SIG_IGN) if main_thread else None
    try:
        for name, value in (environment or {}).items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        child.start()  # the spawned interpreter takes this environment
    finally:
        os.environ.clear()
        os.environ.update(saved)
        if interrupt is not None:
            signal.signal(signal.SIGINT, interrupt)
    send.close()
    try:
        while True:
            if receive.poll(_POLL_SECONDS):
                try:
                    kind, value = receive.recv()
                except EOFError:  # the child died without a word (a signal, a crash)
                    child.join()
                    code = child.exitcode or 0
                    how = signal.Signals(-code).name if code < 0 else f"exit status {code}"
                    raise ChildDied(f"{describe()}: its process ended by {how}") from None
                if kind == "note":
                    on_note(*value)
                    continue
                child.join()
                if kind == "done":
                    return value
                if kind == "raise":  # with the child's traceback as a note, for a bug's report
                    error, text = value
                    error.add_note(f"raised in the process {describe()}, where:\n{text}")
                    raise error
                raise RuntimeError(f"{describe()} failed in its process:\n{value}")
            held = resident_bytes(child.pid) if limit is not None else None
            if held is not None and held > limit:
                child.kill()
                child.join()
                raise HostMemoryError(
                    f"{describe()} held {held / GIB:.2f} GiB of this host's memory, past the "
                    f"limit of {limit / GIB:.2f} GiB ({_total()}): stopped before the system's "
                    f"OOM killer would end bert-jax; run it on a host with more memory, or set "
                    f"{LIMIT_ENV}"
                )
    finally:
        if child.is_alive():  # KeyboardInterrupt, SIGTERM: the child does not outlive us
            child.kill()
            child.join()
        receive.close()


def _total() -> str:
    total = _meminfo().get("MemTotal")
    return f"the host has {total / GIB:.1f} GiB" if total else "the host's memory is unknown"
