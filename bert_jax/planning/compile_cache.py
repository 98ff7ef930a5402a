"""The on-disk cache of TPU compiles: a compiled program's figures (memory, the cost model's
reading, compile time) under a hash of what determines them (`program_key`: the lowered program,
its compiler options, the topology, the compiler's versions and the reader of its figures), so a
second check or `plan` of the same program reads them back instead of compiling for minutes.
Reading an entry (a verdict of "does not fit" or "too large for this host" among them) is
`compile_check`'s; writing is best effort."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

import jax

from bert_jax.planning import cost_model
from bert_jax.runtime import caches
from bert_jax.runtime.topology import TpuTarget

_CACHE_FORMAT = 1  # bump when what a cache entry holds changes


def _versions() -> str:
    """The compiler's versions, and the code that reads its figures (a changed reading of the
    same program must not be served from the cache)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        libtpu = version("libtpu")
    except PackageNotFoundError:
        libtpu = "none"
    with open(cost_model.__file__, "rb") as f:
        reader = hashlib.sha256(f.read()).hexdigest()[:16]
    return f"jax {jax.__version__} libtpu {libtpu} cost_model {reader}"


def program_key(lowered_text: str, compiler_options, target: TpuTarget) -> str:
    """The hash that names a compiled program: its lowered text, the compiler options, the
    topology (and chip configuration) it is compiled for, the compiler's versions and the
    reader of its figures (`cost_model.py`)."""
    digest = hashlib.sha256()
    for part in (
        f"format {_CACHE_FORMAT}",
        _versions(),
        target.topology,
        str(target.generation.tpu.chip_config_name),
        json.dumps(compiler_options or {}, sort_keys=True, default=str),
        lowered_text,
    ):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()


@dataclasses.dataclass(frozen=True)
class CompiledFigures:
    """What a check keeps of one compiled TPU program (cached by `program_key`)."""

    key: str
    memory: cost_model.Memory
    cost: cost_model.ProgramCost
    compile_seconds: float  # of the compile that made the figures
    cached: bool = False


def cache_path(key: str) -> str | None:
    root = caches.cache_root()  # figures go in its `tpu_compiles`
    return os.path.join(root, "tpu_compiles", f"{key}.json") if root else None


def cache_write(key: str, entry: dict) -> None:
    """Best effort: a cache that cannot be written costs only the next compile."""
    path = cache_path(key)
    if path is None:
        return
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        partial = f"{path}.{os.getpid()}.tmp"
        with open(partial, "w", encoding="utf-8") as f:
            json.dump(entry, f)
        os.replace(partial, path)
    except OSError:
        pass
