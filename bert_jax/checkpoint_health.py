"""What is wrong with a checkpoint or a save: missing files and other shapes found before
reading, Orbax / TensorStore errors as one line, a full disk.

Used by `checkpointing` (resume falls back past a damaged checkpoint) and `model_dir` (a damaged
model directory is one clear error).
"""

from __future__ import annotations

import contextlib
import errno
import gc
import os
import sys
from collections.abc import Iterator
from typing import Any

ITEMS = ("state", "data")  # the items of a pretraining checkpoint (checkpointing.py)


def describe_error(err: BaseException, limit: int = 300) -> str:
    """One line for an error from Orbax / TensorStore: the innermost cause that says something,
    its first line, without TensorStore's dump of its spec."""
    chain, seen = [err], {id(err)}
    while (nxt := chain[-1].__cause__ or chain[-1].__context__) is not None and id(nxt) not in seen:
        chain.append(nxt)
        seen.add(id(nxt))
    for candidate in reversed(chain):
        text = str(candidate).strip().strip("'\"")
        for cut in (" See full TensorStore details", " [tensorstore_spec", "\n"):
            text = text.split(cut, 1)[0]
        text = " ".join(text.split())
        if text:
            return text if len(text) <= limit else text[: limit - 3] + "..."
    return type(err).__name__


def _quiet_unraisable(unraisable) -> None:
    if not isinstance(unraisable.exc_value, RuntimeError):
        sys.__unraisablehook__(unraisable)


@contextlib.contextmanager
def quiet_failed_reads() -> Iterator[None]:
    """Drops the 'Event loop is closed' noise that Orbax's coroutines print on stderr when they
    are collected after a failed read (collected here, while it is dropped)."""
    previous = sys.unraisablehook
    sys.unraisablehook = _quiet_unraisable
    try:
        yield
    finally:
        gc.collect()
        sys.unraisablehook = previous


def missing_file(step_dir: str) -> str | None:
    """What a complete checkpoint directory lacks (before trying to read it), or None."""
    for item in ITEMS:
        item_dir = os.path.join(step_dir, item)
        if not os.path.isdir(item_dir):
            return f"{item}/ is missing"
        if not os.path.isfile(os.path.join(item_dir, "_METADATA")):
            return f"{item}/_METADATA is missing"
        ocdbt = any(name.startswith("ocdbt.process_") for name in os.listdir(item_dir))
        if ocdbt and not os.path.isfile(os.path.join(item_dir, "manifest.ocdbt")):
            return f"{item}/manifest.ocdbt is missing"
    return None


def shape_problem(state_dir: str, abstract_state: Any) -> str | None:
    """Params stored with other shapes than the run's model (or absent), or None."""
    import orbax.checkpoint as ocp
    from flax import traverse_util

    with ocp.StandardCheckpointer() as reader:
        metadata = reader.metadata(state_dir)
    tree = getattr(metadata, "item_metadata", metadata)
    stored = traverse_util.flatten_dict(dict(getattr(tree, "tree", tree))["params"], sep="/")
    wanted = traverse_util.flatten_dict(abstract_state.params, sep="/")
    for name, leaf in wanted.items():
        if name not in stored:
            return f"parameter {name} is missing"
        if tuple(stored[name].shape) != tuple(leaf.shape):
            return (
                f"parameter {name} has shape {tuple(stored[name].shape)}, the run's model "
                f"{tuple(leaf.shape)}"
            )
    extra = sorted(set(stored) - set(wanted))
    return f"unexpected parameter {extra[0]}" if extra else None


def disk_full(err: BaseException) -> OSError | None:
    """The ENOSPC OSError in `err`'s chain (or a TensorStore error that says so), else None."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno == errno.ENOSPC:
            return current
        if "No space left on device" in str(current):
            return OSError(errno.ENOSPC, "No space left on device")
        current = current.__cause__ or current.__context__
    return None


def tree_bytes(path: str) -> int:
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(folder, name))
            except OSError:
                pass
    return total
