"""Where a CPU step's temporaries come from: the same host memory each step, instead of fresh
pages from the kernel.

XLA's CPU runtime allocates a program's temporaries as one block per run (an all-MiniLM-L6-v2
fine-tuning step: 135 MB at SST-2's 16x16 shape, 362 MB at RTE's 7x128). glibc's malloc maps a
block that large afresh (mmap) and unmaps it when freed, so every step page-faults through all of
it again: 33,000 faults a step at 16x16 and 93,000 at 7x128 on the 2-core development machine,
9-10 s of system time in a 60-step RTE run. Run inline (`run_cpu_programs_inline`: on the calling
thread, which allocates from malloc's main heap) and with that heap told to keep what it frees
(`keep_step_buffers`), a step reuses the block its predecessor freed: the same RTE step took 0.71 s
against 0.85-0.91 s.

Both do nothing where they cannot apply: on other platforms' runtimes (a GPU's or TPU's memory
is its own), and `keep_step_buffers` without glibc (its `mallopt`).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
from collections.abc import Iterator

# glibc's mallopt(3) parameters, and their defaults.
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_DEFAULT_TRIM_THRESHOLD, _DEFAULT_MMAP_MAX = 128 * 1024, 65536
# While steps run, a free block at the top of the heap up to this size stays (a step's
# temporaries are freed there and taken again by the next step).
_KEPT_BYTES = 1 << 30


def run_cpu_programs_inline() -> None:
    """JAX's CPU runtime runs a single-device program on the thread that calls it, instead of
    on a thread of its own (`jax_cpu_enable_async_dispatch`): its temporaries then come from the
    main heap that `keep_step_buffers` governs. Takes effect only where the CPU backend has not
    started yet (a command calls it first thing). A step's Python then waits for the step, which
    costs a fine-tuning loop nothing it could measure: the next batch takes milliseconds to
    gather, a step hundreds."""
    import jax

    jax.config.update("jax_cpu_enable_async_dispatch", False)


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
        libc.malloc_trim.argtypes = (ctypes.c_size_t,)
        return libc
    except (OSError, AttributeError, TypeError):  # not glibc: no mallopt or malloc_trim
        return None


def release_freed_memory() -> None:
    """Give the pages malloc holds free, in every arena, back to the kernel (`malloc_trim`): after
    a compile, whose working memory is freed but kept by malloc, so that what the run makes next
    does not add to it in the process's peak. Nothing without glibc."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


@contextlib.contextmanager
def keep_step_buffers() -> Iterator[None]:
    """Inside: malloc serves large blocks from its heap (no mmap) and keeps up to 1 GiB freed at
    the heap's top, so each step's temporaries reuse the last step's pages. On leaving, the
    defaults come back and the free pages malloc holds go back to the kernel
    (`release_freed_memory`)."""
    libc = _glibc()
    if libc is None:
        yield
        return
    libc.mallopt(_M_MMAP_MAX, 0)
    libc.mallopt(_M_TRIM_THRESHOLD, _KEPT_BYTES)
    try:
        yield
    finally:
        libc.mallopt(_M_MMAP_MAX, _DEFAULT_MMAP_MAX)
        libc.mallopt(_M_TRIM_THRESHOLD, _DEFAULT_TRIM_THRESHOLD)
        release_freed_memory()
