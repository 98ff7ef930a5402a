"""Test setup: 8 emulated CPU devices (set before JAX is imported) and strict rank promotion."""

import gc
import os

import pytest

from bert_jax.cli import (  # imports nothing of JAX (test_cli.py)
    collect_garbage_less_often,
    quiet_tensorflow,
)
from tests.xla_flags import with_devices  # noqa: E402 (imports nothing of JAX)

# As in `bert-jax` processes, from the first import on: collecting the tests imports JAX,
# TensorFlow, torch and transformers.
collect_garbage_less_often()

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + with_devices(8)).strip()
quiet_tensorflow()  # as in bert-jax processes: TensorFlow alike in every test, whatever the order
# What bert-jax caches (the embedded corpus), shared by the test processes and their children,
# outside the user's ~/.cache.
os.environ.setdefault(
    "BERT_JAX_CACHE_DIR", os.path.join(os.environ.get("TMPDIR", "/tmp"), "bert_jax_test_cache")
)
# The tests run on CPU devices, children too (libtpu, installed for the TPU compile tests, would
# otherwise probe for TPU chips in every process).
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# TensorFlow (tf.data) imports Keras 3 eagerly, 1.5 s of every process that reads records; no
# test uses Keras, and with this setting (tf_keras is not installed) TensorFlow skips it.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

# Many tests compile the same small programs (each pretraining run builds its own jitted step);
# a persistent compilation cache shared by the test processes compiles each of them once. Set
# through the environment, so the `bert-jax` processes the tests start use it too. Programs that
# compile in under 0.2 s (thousands of single operations) are not worth a file each.
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR",
    os.path.join(os.environ.get("TMPDIR", "/tmp"), "bert_jax_test_jax_cache"),
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_platforms", "cpu")


def pytest_collection_finish(session):
    """Python's cyclic garbage collector, at its defaults, walks every object the imports made
    (JAX, TensorFlow, torch, transformers: about 460,000 in each worker) each time it collects
    the oldest generation, and JAX's tracing allocates enough to set that off thousands of times.
    The objects alive after collection are frozen out of its walks, and it runs after 10,000 new
    objects instead of 700 (set when this file is imported): 44.8 s of the suite's CPU time in
    collections -> 15.4 s."""
    gc.freeze()


def pytest_collection_modifyitems(config, items):
    """Modules with a test marked `slow` (tens of seconds each) run first: `make test`'s work
    stealing (pytest-xdist) balances what is left over the workers, but a long test that starts
    last has no one to share it. Whole modules move, so that their module fixtures are set up
    once; the order is otherwise kept."""
    slow = {item.module for item in items if item.get_closest_marker("slow") is not None}
    items[:] = [i for i in items if i.module in slow] + [i for i in items if i.module not in slow]


@pytest.fixture(autouse=True)
def _restore_logging_handlers():
    """A command sets its progress handlers once per process (`data prepare`'s basicConfig,
    fine-tuning's stdout handler) on the sys.stdout of that moment; in a test worker that is one
    test's captured stream, closed when the test ends. Each test's handlers are put back after it,
    so a later test's logging never writes to a closed stream."""
    import logging

    loggers = [logging.getLogger(), logging.getLogger("bert_jax.finetune")]
    saved = [(lg, list(lg.handlers), lg.level, lg.propagate) for lg in loggers]
    yield
    for lg, handlers, level, propagate in saved:
        lg.handlers, lg.level, lg.propagate = handlers, level, propagate
