"""Test setup: 8 emulated CPU devices (set before JAX is imported) and strict rank promotion."""

import os

from tests.xla_flags import with_devices  # noqa: E402 (imports nothing of JAX)

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + with_devices(8)).strip()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
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

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_platforms", "cpu")

# Many tests compile the same small programs (each pretraining run builds its own jitted step);
# a persistent compilation cache shared by the test processes compiles each of them once.
_CACHE_DIR = os.path.join(os.environ.get("TMPDIR", "/tmp"), "bert_jax_test_jax_cache")
jax.config.update("jax_compilation_cache_dir", _CACHE_DIR)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
