"""What test_host_memory runs in `host_memory.run_watched`'s spawned children.

A spawned child imports the module of the function it runs: this one imports nothing of JAX,
so each child starts in a fraction of a second instead of importing JAX and the compile check
(about 1.5 s of CPU each, seven children in `make test`)."""

from __future__ import annotations

import os
import signal
import time

from bert_jax.runtime.errors import UserError

MIB = 1024**2


def adds(note, a, b):
    note("adding", a)
    note("adding", b)
    return a + b


def refuses(note, flag):
    raise UserError(f"--{flag} is wrong")


def differs(note):
    raise ValueError("shapes differ")


class Unpicklable(Exception):
    def __init__(self, a, b):
        super().__init__(f"{a} {b}")


def breaks(note):
    raise Unpicklable(1, 2)


def crashes(note):
    note("crashing")
    os.kill(os.getpid(), signal.SIGSEGV)


def grows(note, step_mib):
    note("allocating")
    held = []
    while True:  # until it is stopped
        held.append(bytearray(os.urandom(1)) * (step_mib * MIB))
        time.sleep(0.05)


def reads(note, *names):
    return {name: os.environ.get(name) for name in names}


def waits(note, seconds):
    """Says it started, then waits (until the test interrupts its parent)."""
    note("started")
    time.sleep(seconds)
    return signal.getsignal(signal.SIGINT) == signal.SIG_IGN
