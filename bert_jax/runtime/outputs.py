"""Atomic writes, and the one rule for replacing an output directory: only one bert-jax wrote.

Files: a hidden temporary name in the same directory, then a rename. A reader (or a resumed job)
never sees a half-written file under its final name. The temporary name is unique per host,
process and call, so several machines preparing into one shared directory cannot collide.

Directories (``atomic_output_dir``, used by ``convert``, model exports and ``data prepare``): the
new output is written into a hidden sibling and renamed into place; an existing one is moved
aside only once the new one is complete. ``check_replaceable`` is the rule every command that
replaces output goes through: it replaces only a directory carrying its kind's marker (an
``OutputKind``) and holding nothing but that kind's entries, and never the current directory, the
home directory, ``/`` or a pretraining workdir (each refused as a ``UserError`` naming it).

In a Cloud Storage bucket (``gs://``) there is no rename: an object upload is atomic by itself,
so files are written under their final name. A directory is still filled under the hidden
sibling; it is then copied into place (server-side copies) with its kind's marker file copied
last, after any old output was removed: a reader that goes by the marker (every bert-jax reader
does) never takes a half-copied directory for a complete one. Not atomic like a rename: between
the removal and the last copy the output is absent (the complete new one is in the hidden
sibling, which is removed only after the copy).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import socket
import tempfile
import uuid
from collections.abc import Callable, Iterator

from bert_jax.runtime import fs
from bert_jax.runtime.errors import UserError, user_path


def temporary_name(path: str) -> str:
    """A hidden sibling of ``path`` that no other writer can be using."""
    directory, name = os.path.dirname(fs.abspath(path)), os.path.basename(path)
    unique = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    return os.path.join(directory, f".{name}.tmp-{unique}")


def write_bytes_atomic(path: str, data: bytes) -> None:
    if fs.is_remote(path):  # one upload: the object appears whole or not at all
        fs.write_bytes(path, data)
        return
    tmp = temporary_name(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_json_atomic(path: str, payload: dict) -> None:
    text = json.dumps(payload, indent=2, sort_keys=True) + "\n"
    write_bytes_atomic(path, text.encode("utf-8"))


@contextlib.contextmanager
def local_then_place(path: str, suffix: str = "") -> Iterator[str]:
    """A local file name for a writer that takes only local paths (matplotlib's savefig) to
    write `path`'s content under; when the block ends it is renamed into place, or uploaded
    (one upload: whole or nothing) when `path` is in a bucket. `suffix`: the name's ending."""
    if fs.is_remote(path):
        with tempfile.TemporaryDirectory(prefix="bert-jax-") as directory:
            local = os.path.join(directory, "upload" + suffix)
            yield local
            fs.upload(local, path)
        return
    tmp = temporary_name(path) + suffix
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


# --- Replacing output directories ---


class OutputInTheWayError(UserError):
    """An existing path that bert-jax will not replace: it did not write it (or cannot tell)."""


@dataclasses.dataclass(frozen=True)
class OutputKind:
    """What bert-jax writes as one output directory: how to recognise it, what it may hold.

    ``is_own(path)``: the directory carries this kind's marker. ``holds(name)``: an entry name
    this kind writes (hidden ``.NAME.tmp-*`` leftovers of a killed writer are always allowed).
    """

    name: str  # "model directory"
    marker: str  # what carries it, for the message: "config.json with a bert_jax block"
    is_own: Callable[[str], bool]
    holds: Callable[[str], bool]
    marker_file: str = ""  # the file that completes it: copied last into a bucket


def _is_leftover(name: str) -> bool:
    return name.startswith(".") and (".tmp-" in name or ".old-" in name)


def _protected(path: str) -> str | None:
    """Why `path` may never be replaced, or None."""
    if fs.is_remote(path):
        if "/" not in path[len(fs.SCHEME) :].strip("/"):
            return "a whole bucket"
        if fs.isdir(os.path.join(path, "checkpoints")):
            return "a pretraining workdir (it holds checkpoints/)"
        return None
    home = os.path.abspath(os.path.expanduser("~"))
    cwd = os.path.abspath(os.getcwd())
    if path == os.path.dirname(path):
        return "the root directory"
    if path == home:
        return "the home directory"
    if path == cwd:
        return "the current directory"
    if cwd.startswith(path + os.sep):
        return "a parent of the current directory"
    if home.startswith(path + os.sep):
        return "a parent of the home directory"
    if os.path.isdir(os.path.join(path, "checkpoints")):
        return "a pretraining workdir (it holds checkpoints/)"
    return None


def check_replaceable(path: str | os.PathLike, kind: OutputKind, action: str = "replace") -> None:
    """Refuses (``OutputInTheWayError``, one line naming `path`) to replace anything but an
    empty directory or one of `kind` holding only its own entries. A missing path passes.
    `action` words the refusal ("write into" for commands that replace files inside)."""
    path = fs.abspath(os.fspath(path))
    remote = fs.is_remote(path)
    if not (fs.exists(path) if remote else os.path.lexists(path)):
        return
    why = _protected(path)
    if why is None and (not remote and os.path.islink(path) or not fs.isdir(path)):
        why = "not a directory"
    if why is None:
        entries = sorted(fs.listdir(path))
        if not entries:
            return
        if not kind.is_own(path):
            why = f"not a bert-jax {kind.name} (no {kind.marker})"
        else:
            foreign = [e for e in entries if not (kind.holds(e) or _is_leftover(e))]
            if foreign:
                shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
                why = f"it holds files a bert-jax {kind.name} does not ({shown})"
    if why is not None:
        raise OutputInTheWayError(
            f"refusing to {action} {path}: {why}; choose a new output path or remove it yourself"
        )


@contextlib.contextmanager
def atomic_output_dir(
    path: str | os.PathLike, kind: OutputKind, overwrite: bool = False, what: str = "output"
) -> Iterator[str]:
    """Yields a fresh hidden sibling of `path` to fill; renames it to `path` on success.

    On any exception the sibling is removed and `path` is untouched. An existing `path` is
    refused unless `overwrite` and ``check_replaceable(path, kind)`` passes; it is then replaced
    only after the new one is complete (moved aside, the new one renamed in, the old one removed).
    A place the user cannot write (permissions, a full or read-only disk, a file in the way) is a
    `UserError` naming `what` (the flag) and the file.
    """
    path = fs.abspath(os.fspath(path))
    with user_path(path, what, writing=True):
        if fs.is_remote(path):
            with _bucket_output_dir(path, kind, overwrite) as tmp:
                yield tmp
        else:
            with _local_output_dir(path, kind, overwrite) as tmp:
                yield tmp


@contextlib.contextmanager
def _local_output_dir(path: str, kind: OutputKind, overwrite: bool) -> Iterator[str]:
    """`atomic_output_dir` on a local disk: a hidden sibling renamed into place."""
    if os.path.lexists(path):
        if not overwrite:
            raise UserError(f"{path} already exists (pass --overwrite to replace it)")
        check_replaceable(path, kind)
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(path)}.tmp-{uuid.uuid4().hex[:8]}")
    os.makedirs(tmp)
    try:
        yield tmp
        if os.path.exists(path):
            old = os.path.join(parent, f".{os.path.basename(path)}.old-{uuid.uuid4().hex[:8]}")
            os.rename(path, old)
            os.rename(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextlib.contextmanager
def _bucket_output_dir(path: str, kind: OutputKind, overwrite: bool) -> Iterator[str]:
    """`atomic_output_dir` in a bucket: filled under a hidden sibling prefix, then copied into
    place with the marker file last (see the module docstring)."""
    if fs.exists(path):
        if not overwrite:
            raise UserError(f"{path} already exists (pass --overwrite to replace it)")
        check_replaceable(path, kind)
    tmp = os.path.join(
        os.path.dirname(path), f".{os.path.basename(path)}.tmp-{uuid.uuid4().hex[:8]}"
    )
    try:
        yield tmp
        written = sorted(fs.walk_files(tmp))
        if fs.exists(path):
            fs.rmtree(path)
        marker = [
            f for f in written if kind.marker_file and f == os.path.join(tmp, kind.marker_file)
        ]
        for source in [f for f in written if f not in marker] + marker:
            fs.rename(source, path + source[len(tmp) :])
    finally:
        fs.rmtree(tmp, ignore_errors=True)
