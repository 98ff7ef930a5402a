"""What is wrong with a checkpoint or a save: missing files and other shapes found before
reading, Orbax / TensorStore errors as one line, a full disk.

Used by `training.checkpointing` (resume falls back past a damaged checkpoint) and
`convert.model_dir` (a damaged model directory is one clear error). It needs only the file-system
layer (and Orbax), so it stands in runtime/, below both.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from bert_jax.runtime import fs

ITEMS = ("state", "data")  # the items of a pretraining checkpoint (checkpointing.py)


def describe_error(err: BaseException, limit: int = 300) -> str:
    """One line for an error from Orbax / TensorStore: the innermost cause that says something,
    its first line, without TensorStore's dump of its spec."""
    chain, seen = [err], {id(err)}
    while (nxt := chain[-1].__cause__ or chain[-1].__context__) is not None and id(nxt) not in seen:
        chain.append(nxt)
        seen.add(id(nxt))
    for candidate in reversed(chain):
        text = str(candidate).strip()
        if len(text) > 1 and text[0] == text[-1] and text[0] in "'\"":  # a KeyError's repr
            text = text[1:-1]
        for cut in (" See full TensorStore details", " [tensorstore_spec", "\n"):
            text = text.split(cut, 1)[0]
        text = " ".join(text.split())
        if text:
            return text if len(text) <= limit else text[: limit - 3] + "..."
    return type(err).__name__


def _is_read_noise(unraisable) -> bool:
    """An Orbax read coroutine of a failed restore, collected after its event loop closed."""
    name = getattr(unraisable.object, "__qualname__", "")
    closed = isinstance(unraisable.exc_value, RuntimeError) and "loop is closed" in str(
        unraisable.exc_value
    )
    return name == "_read_array_index_and_device_put" or closed


def _drop_read_noise(unraisable) -> None:
    if not _is_read_noise(unraisable):
        _previous_hook(unraisable)


_previous_hook = sys.unraisablehook


@contextlib.contextmanager
def _stderr_to(file) -> Iterator[None]:
    """Sends stderr (Python's and the process's file descriptor 2) to `file` meanwhile."""
    sys.stderr.flush()
    saved_fd, saved = os.dup(2), sys.stderr
    os.dup2(file.fileno(), 2)
    sys.stderr = open(os.dup(file.fileno()), "w", buffering=1, encoding="utf-8")  # noqa: SIM115
    try:
        yield
    finally:
        sys.stderr.close()
        sys.stderr = saved
        os.dup2(saved_fd, 2)
        os.close(saved_fd)


def read_or_problem(read: Callable[[], Any]) -> tuple[Any, str | None]:
    """(read(), None), or (None, the failure in one line) when reading raised.

    A failed Orbax read leaves its other reads running: they print tracebacks (hundreds of
    lines) on stderr as they end and as they are collected. What the read prints is held back:
    shown when it succeeds, dropped when it fails (after a moment for the stragglers). The
    coroutines of failed reads collected later are dropped from then on (only those).
    """
    global _previous_hook
    result, problem = None, None
    with tempfile.TemporaryFile(mode="w+", encoding="utf-8") as held:
        with _stderr_to(held):
            try:
                result = read()
            except Exception as err:  # any failure to read: the caller names what it read
                problem = describe_error(err)
            if problem is not None:
                if sys.unraisablehook is not _drop_read_noise:
                    _previous_hook, sys.unraisablehook = sys.unraisablehook, _drop_read_noise
                time.sleep(0.3)
                gc.collect()
        if problem is None:
            held.seek(0)
            sys.stderr.write(held.read())
    return result, problem


def missing_file(step_dir: str) -> str | None:
    """What a complete checkpoint directory lacks (before trying to read it), or None."""
    for item in ITEMS:
        item_dir = os.path.join(step_dir, item)
        if not fs.isdir(item_dir):
            return f"{item}/ is missing"
        if not fs.isfile(os.path.join(item_dir, "_METADATA")):
            return f"{item}/_METADATA is missing"
        ocdbt = any(name.startswith("ocdbt.process_") for name in fs.listdir(item_dir))
        if ocdbt and not fs.isfile(os.path.join(item_dir, "manifest.ocdbt")):
            return f"{item}/manifest.ocdbt is missing"
    return None


def tree_metadata(metadata: Any) -> dict[str, Any]:
    """The tree of an Orbax pytree save's metadata (leaves with shape and dtype); ValueError
    when its files are missing or damaged."""
    tree = getattr(metadata, "item_metadata", metadata)
    tree = getattr(tree, "tree", tree)
    if not isinstance(tree, Mapping):
        raise ValueError("no readable tree metadata (_METADATA or d/ missing or damaged)")
    return dict(tree)


def param_problems(stored: Mapping[str, Any], wanted: Mapping[str, tuple], source: str) -> list:
    """How stored params (flat name -> metadata with a shape) differ from the shapes that
    `source` (e.g. 'config.json') implies."""
    problems = [f"missing parameter {p} {s}" for p, s in wanted.items() if p not in stored]
    problems += [f"unexpected parameter {p}" for p in stored if p not in wanted]
    problems += [
        f"parameter {p} has shape {tuple(stored[p].shape)} but {source} implies {s}"
        for p, s in wanted.items()
        if p in stored and tuple(stored[p].shape) != s
    ]
    return problems


def stored_tree(directory: str) -> dict[str, Any]:
    """The tree metadata (shapes, dtypes) of a saved pytree: `_METADATA` and `d/`, no arrays.

    Read by the item's handler: a checkpointer would also look for `_CHECKPOINT_METADATA` in
    the item's directory, which a checkpoint manager writes one level up (warning on every
    resume that it does not exist).
    """
    import orbax.checkpoint as ocp
    from etils import epath

    try:
        metadata = ocp.StandardCheckpointHandler().metadata(epath.Path(directory))
    except (FileNotFoundError, ValueError, TypeError):  # what a checkpointer reads as "none"
        metadata = None
    return tree_metadata(metadata)


def shape_problem(state_dir: str, abstract_state: Any) -> str | None:
    """Params stored with other shapes than the run's model (or absent), or None."""
    from flax import traverse_util

    tree = stored_tree(state_dir)
    if "params" not in tree:
        return "state/ holds no params"
    stored = traverse_util.flatten_dict(tree["params"], sep="/")
    wanted = traverse_util.flatten_dict(abstract_state.params, sep="/")
    wanted = {name: tuple(leaf.shape) for name, leaf in wanted.items()}
    problems = param_problems(stored, wanted, "the run's config")
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return problems[0] + more if problems else None


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
    for name in fs.walk_files(path):
        try:
            total += fs.getsize(name)
        except OSError:
            pass
    return total
