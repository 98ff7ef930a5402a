"""A CPU step's temporaries reuse the host memory the last step freed (`step_buffers`): counted in
the kernel's page faults, the measure of fresh pages."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import numpy as np
import pytest

from bert_jax.runtime import step_buffers

needs_glibc = pytest.mark.skipif(step_buffers._glibc() is None, reason="needs glibc's mallopt")


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _faults_of_a_fresh_block(size: int) -> int:
    """Page faults while a block of `size` bytes is allocated, written through and freed."""
    before = _faults()
    block = np.empty(size, np.uint8)
    block[::4096] = 1  # a byte a page: every page touched
    del block
    return _faults() - before


@needs_glibc
def test_inside_a_freed_block_is_taken_again_without_fresh_pages():
    size = 48 << 20  # above malloc's largest mmap threshold (32 MiB): mapped afresh by default
    _faults_of_a_fresh_block(size)
    outside = _faults_of_a_fresh_block(size)
    with step_buffers.keep_step_buffers():
        _faults_of_a_fresh_block(size)  # the heap grows once
        inside = [_faults_of_a_fresh_block(size) for _ in range(3)]
    after = _faults_of_a_fresh_block(size)  # the defaults are back: mapped afresh again
    assert outside > 20 and after > 20, (outside, after)  # 12,288 pages, or 24 huge ones
    assert max(inside) <= 2, inside


@needs_glibc
def test_freed_memory_goes_back_to_the_kernel():
    """`release_freed_memory` hands back what malloc kept free: inside `keep_step_buffers` a
    freed block is taken again without fresh pages, and after the release it pages in afresh."""
    size = 48 << 20
    with step_buffers.keep_step_buffers():
        _faults_of_a_fresh_block(size)
        kept = _faults_of_a_fresh_block(size)
        step_buffers.release_freed_memory()
        released = _faults_of_a_fresh_block(size)
    assert kept <= 2 and released > 20, (kept, released)


_STEPS = """
import contextlib, json, resource, sys
import jax, jax.numpy as jnp
from bert_jax.runtime import step_buffers
if sys.argv[1] == "inline":
    step_buffers.run_cpu_programs_inline()
def loss(w, x):  # a gradient step's shape: 32 MB activations kept for the backward pass
    return jnp.sum(jnp.tanh(jnp.tanh(x @ w[0]) @ w[1]) ** 2)
step = jax.jit(jax.grad(loss))
w = (jnp.full((256, 2048), 0.01), jnp.full((2048, 256), 0.01))
x = jnp.ones((4096, 256), jnp.float32)
jax.block_until_ready(step(w, x))
faults = {}
for kept in ("default", "kept"):
    faults[kept] = []
    with step_buffers.keep_step_buffers() if kept == "kept" else contextlib.nullcontext():
        for _ in range(12):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            jax.block_until_ready(step(w, x))
            faults[kept].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps(faults))
"""


def _step_faults(mode: str) -> dict[str, list[int]]:
    """Page faults of each of twelve steps run `mode` ("inline" or on JAX's thread), with malloc's
    defaults and inside `keep_step_buffers`."""
    env = {**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu", "JAX_COMPILATION_CACHE_DIR": ""}
    out = subprocess.run(
        [sys.executable, "-c", _STEPS, mode], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@needs_glibc
def test_a_program_run_inline_reuses_its_temporaries_and_one_run_on_jax_s_thread_does_not():
    """On JAX's own thread (the default) the block comes from that thread's malloc arena, which
    maps a block this large afresh whatever the main heap is told; inline it comes from the
    main heap, which `keep_step_buffers` keeps: once the heap has grown, a step reuses its
    predecessor's pages. Under load a small block now and then takes the freed one's place and
    one step pages its block in again (seen in 1 to 3 of 12 steps, mostly early), so the check
    is that at least six of the last eight steps page in under 5% of a fresh block, and every
    threaded step most of one."""
    inline, threaded = _step_faults("inline"), _step_faults("threaded")
    fresh = min(inline["default"] + threaded["default"])  # a block paged in: ~18,000 faults
    assert fresh > 1000, (inline, threaded)
    reused = [n for n in inline["kept"][4:] if n < fresh / 20]
    assert len(reused) >= 6, inline
    assert min(threaded["kept"]) > fresh / 2, threaded
