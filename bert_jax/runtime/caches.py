"""What bert-jax keeps on disk to skip work it has done before, all under one root
(`cache_root`): the embedded corpus parsed from Python's sources (`data/sources/embedded.py`),
the figures of TPU compiles (`planning/compile_cache.py`) and the XLA programs a `bert-jax`
process compiles (`keep_compiled_programs`: JAX's persistent compilation cache).

Every entry is rebuilt when it is missing, so deleting the root costs time, never results. With
$BERT_JAX_CACHE_DIR set but empty, bert-jax keeps nothing. Imports nothing of JAX: the command
line sets the compilation cache up before JAX is imported.
"""

from __future__ import annotations

import os

CACHE_ENV = "BERT_JAX_CACHE_DIR"

# JAX's persistent compilation cache, as environment variables (JAX reads them when it is
# imported; the processes a command starts inherit them). A program is kept when compiling it took
# at least MIN_COMPILE_SECONDS: a training step takes seconds to minutes to compile, a fresh head's
# or optimizer's initialisation tenths of a second; the single operations run eagerly take
# milliseconds, which a file each would not repay. The oldest entries go once the directory holds
# MAX_BYTES.
COMPILED_PROGRAMS_DIR = "xla"
MIN_COMPILE_SECONDS = 0.2
MAX_BYTES = 2 << 30
JAX_CACHE_DIR_ENV = "JAX_COMPILATION_CACHE_DIR"


def cache_root() -> str | None:
    """$BERT_JAX_CACHE_DIR (empty: no caching), else $XDG_CACHE_HOME/bert_jax, else
    ~/.cache/bert_jax."""
    if CACHE_ENV in os.environ:
        return os.environ[CACHE_ENV] or None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "bert_jax")


def keep_compiled_programs() -> str | None:
    """Turn JAX's persistent compilation cache on for this process and the processes it starts,
    in `cache_root()`/xla, so a command run again with the same model and shapes reads its
    compiled steps back instead of compiling them (a fine-tuning step of all-MiniLM-L6-v2 takes
    7-8 s to compile on a 2-core CPU). A cache the user configured for JAX
    ($JAX_COMPILATION_CACHE_DIR, set empty to turn it off) stands; with no cache root, or one
    bert-jax cannot write, nothing is kept. Returns the directory in use, or None. Must run before
    JAX is imported."""
    if JAX_CACHE_DIR_ENV in os.environ:
        return os.environ[JAX_CACHE_DIR_ENV] or None
    root = cache_root()
    if root is None:
        return None
    directory = os.path.join(root, COMPILED_PROGRAMS_DIR)
    if not _writable(directory):  # a read-only home: compile afresh, warn of nothing
        return None
    os.environ[JAX_CACHE_DIR_ENV] = directory
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", str(MIN_COMPILE_SECONDS))
    os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(MAX_BYTES))
    return directory


def _writable(directory: str) -> bool:
    """Whether `directory` is, or could be made, a directory this process writes: it or its
    nearest existing ancestor is a writable directory (nothing is created until JAX writes)."""
    path = os.path.abspath(directory)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)
