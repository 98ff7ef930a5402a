"""The one file-system layer: every path a user gives may be local or a ``gs://bucket/...`` URL.

Both go through fsspec (``url_to_fs``: its local file system, or gcsfs, which retries Cloud
Storage's 408/429/5xx and dropped connections with backoff). Added here only what fsspec does not
do: a Cloud Storage failure as one line naming the URL (``StorageError``: a missing bucket, no
credentials, a permission refused, an outage past the retries; "missing" and "exists" stay
FileNotFoundError and FileExistsError, and a local OSError stays as it is, see
`errors.user_path`), create-if-absent, and copies and renames that land whole or not at all.

A bucket has objects, not directories: ``makedirs`` only checks the bucket, ``rename`` is
copy-then-delete (not atomic: whole-or-nothing callers write a marker last, data/files.py) and
``create_exclusive`` an upload on the precondition ``ifGenerationMatch=0`` (atomic). Credentials:
Application Default Credentials; none with ``STORAGE_EMULATOR_HOST`` (the tests' emulator). Orbax
reaches buckets through etils.epath (set here to this gcsfs) and TensorStore, tf.data through
TensorFlow's own GCS file system; TensorFlow is never imported here.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import gzip
import io
import os
import shutil
import uuid
from collections.abc import Iterator
from typing import IO, Any

import fsspec

from bert_jax.errors import UserError

# Orbax's paths (etils.epath) take the gcsfs backend for gs:// rather than tf.io.gfile: one
# client and one set of retries for every Python-side access, and no TensorFlow import for it.
os.environ.setdefault("EPATH_USE_TF", "false")
# gcsfs's experimental zonal-bucket support asks the Storage Control API about every bucket
# first; the regional/multi-regional buckets of a pod job need the plain client.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

SCHEME = "gs://"


class StorageError(UserError):
    """Cloud Storage refused or could not do an operation; the message names the URL."""


# --- Path arithmetic: os.path for local paths (relative ones stay relative), never I/O ---


def is_remote(path: str | os.PathLike) -> bool:
    return os.fspath(path).startswith(SCHEME)


def bucket(url: str) -> str:
    return url[len(SCHEME) :].split("/", 1)[0]


def join(path: str | os.PathLike, *parts: str) -> str:
    path = os.fspath(path)
    if not is_remote(path):
        return os.path.join(path, *parts)
    for part in parts:
        path = part if is_remote(part) else path.rstrip("/") + "/" + part.lstrip("/")
    return path


def abspath(path: str | os.PathLike) -> str:
    """A local path made absolute; a URL without a trailing slash."""
    path = os.fspath(path)
    if not is_remote(path):
        return os.path.abspath(path)
    return path.rstrip("/") if len(path.rstrip("/")) > len(SCHEME) else path


def dirname(path: str | os.PathLike) -> str:
    path = os.fspath(path)
    if not is_remote(path):
        return os.path.dirname(path)
    head = path.rstrip("/").rsplit("/", 1)[0]
    return head if len(head) > len(SCHEME) else path


def basename(path: str | os.PathLike) -> str:
    path = os.fspath(path)
    return path.rstrip("/").rsplit("/", 1)[-1] if is_remote(path) else os.path.basename(path)


# --- The file system behind a path, and its errors ---


@contextlib.contextmanager
def _on(path: str | os.PathLike, check: bool = True) -> Iterator[tuple[Any, str]]:
    """(fsspec file system, its name for `path`: absolute, or the URL less gs://); in a bucket,
    that it exists (`check`) and its failures as StorageError naming `path`."""
    path = os.fspath(path)
    if not path:  # fsspec would take "" for the working directory
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
    emulator, options = os.environ.get("STORAGE_EMULATOR_HOST"), {}
    if is_remote(path):  # the emulator takes no credentials, a bucket ADC (never anonymous)
        token = "anon" if emulator else "google_default"
        options = {"token": token, "endpoint_url": emulator, "use_listings_cache": False}
    with _remote_errors(path):
        filesystem, name = fsspec.core.url_to_fs(path, **options)
        if check and is_remote(path):
            _bucket_exists(bucket(path), emulator)
        yield filesystem, name.rstrip("/") or name


@functools.lru_cache(maxsize=64)
def _bucket_exists(name: str, emulator: str | None) -> None:
    """One request per bucket (and emulator) and run: a missing bucket is a StorageError."""
    with _on(SCHEME + name, check=False) as (filesystem, _):
        try:
            filesystem.info(name)
        except FileNotFoundError:
            raise StorageError(f"{SCHEME}{name}: the bucket does not exist") from None


@contextlib.contextmanager
def _remote_errors(url: str) -> Iterator[None]:
    """Cloud Storage failures as StorageError naming `url`; missing/exists pass through, and so
    does any error on a local path."""
    try:
        yield
    except (FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError):
        raise
    except Exception as err:
        if not is_remote(url) or isinstance(err, StorageError):
            raise
        raise StorageError(_why(err, url)) from None


def _why(err: BaseException, url: str) -> str:
    """One line: what Cloud Storage said about `url`."""
    name = type(err).__name__
    text = " ".join(str(err).split()) or name
    if "DefaultCredentialsError" in name or "credentials were not found" in text:
        return (
            f"no Google Cloud credentials for {url}: run `gcloud auth application-default "
            "login`, or set GOOGLE_APPLICATION_CREDENTIALS to a service account key (on a TPU "
            "VM the VM's service account is used)"
        )
    if text.startswith("Forbidden") or getattr(err, "code", None) in (401, 403):
        return f"permission denied on {url}: the account in use may not access bucket " + (
            f"gs://{bucket(url)} ({text[:200]})"
        )
    if "bucket does not exist" in text.lower() or "notfound" in text.lower():
        return f"{url}: the bucket gs://{bucket(url)} does not exist"
    return f"Cloud Storage failed on {url} after retries: {text[:300]}"


def _call(path: str | os.PathLike, method: str, *args: Any, **kwargs: Any) -> Any:
    with _on(path) as (filesystem, name):
        return getattr(filesystem, method)(name, *args, **kwargs)


def _as_given(given: str, name: str, found: str) -> str:
    """`found`, listed under `name` (`given` as the file system names it), spelled as `given`
    is: a relative path stays relative, a URL keeps its scheme."""
    given = given.rstrip("/") or given
    same = len(os.path.commonprefix([given[::-1], name[::-1]]))
    head = name[: len(name) - same]
    return given[: len(given) - same] + found[len(head) :] if found.startswith(head) else found


# --- Queries ---


def exists(path: str | os.PathLike) -> bool:
    return bool(os.fspath(path)) and _call(path, "exists")


def isdir(path: str | os.PathLike) -> bool:
    return bool(os.fspath(path)) and _call(path, "isdir")


def isfile(path: str | os.PathLike) -> bool:
    return bool(os.fspath(path)) and _call(path, "isfile")


def getsize(path: str | os.PathLike) -> int:
    return int(_call(path, "size"))


def getmtime(path: str | os.PathLike) -> float:
    return _call(path, "modified").timestamp()


def disk_free(path: str | os.PathLike) -> int | None:
    """Free bytes on the local file system holding `path`; None for a bucket."""
    return None if is_remote(path) else shutil.disk_usage(path).free


def listdir(path: str | os.PathLike) -> list[str]:
    """Names of the entries directly under `path`, sorted. In a bucket, which has no empty
    directories, a prefix with nothing under it (or a file) lists as empty."""
    with _on(path) as (filesystem, name):
        try:
            entries = filesystem.ls(name, detail=False)
        except FileNotFoundError:
            if not is_remote(path):
                raise
            return []
        if entries == [name] and not is_remote(path) and not filesystem.isdir(name):
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), os.fspath(path))
    return sorted({e.rstrip("/").rsplit("/", 1)[-1] for e in entries if e.rstrip("/") != name})


def glob(pattern: str) -> list[str]:
    """The paths matching `pattern`, sorted; as Python's glob, a wildcard skips dot names."""
    with _on(pattern) as (filesystem, name):
        found = [_as_given(pattern, name, p) for p in filesystem.glob(name)]
    magic = min((pattern.find(c) for c in "*?[" if c in pattern), default=len(pattern))
    head = pattern.rfind("/", 0, magic) + 1
    if "/." not in "/" + pattern[head:]:
        found = [p for p in found if "/." not in "/" + p[head:]]
    return sorted(found)


def walk_files(path: str | os.PathLike) -> Iterator[str]:
    """Every file under `path`, recursively."""
    with _on(path) as (filesystem, name):
        found = filesystem.find(name)
    yield from (_as_given(os.fspath(path), name, file) for file in found)


# --- Reading and writing ---


def open(path: str | os.PathLike, mode: str = "r", encoding: str | None = None) -> IO[Any]:  # noqa: A001
    """A file object; on Cloud Storage a write becomes visible (whole) when it is closed."""
    text = {} if "b" in mode else {"encoding": encoding or "utf-8"}
    f = _call(path, "open", mode, **text)
    if mode == "rb" and isinstance(f, fsspec.spec.AbstractBufferedFile):
        return io.BufferedReader(f, buffer_size=1 << 20)  # readline(limit), peek, ...
    return f


def open_gzip(path: str | os.PathLike) -> IO[bytes]:
    """A gzip file opened for reading (closing it closes the underlying file too)."""
    stream = gzip.GzipFile(fileobj=open(path, "rb"))
    stream.myfileobj = stream.fileobj  # GzipFile closes the file it was given only through this
    return stream


def read_bytes(path: str | os.PathLike) -> bytes:
    return _call(path, "cat_file")


def read_text(path: str | os.PathLike) -> str:
    with open(path, "r") as f:
        return f.read()


def read_range(path: str | os.PathLike, start: int, end: int) -> bytes:
    """Bytes [start, end) of a file (fewer at its end); one ranged request on Cloud Storage."""
    return _call(path, "cat_file", start=start, end=end)


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    _call(path, "pipe_file", data)


def write_text(path: str | os.PathLike, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def create_exclusive(path: str | os.PathLike, data: bytes) -> bool:
    """Writes `path` only if no file of that name exists, atomically; False when one does.

    Locally mode "xb" (O_CREAT | O_EXCL; fsspec's local ``pipe_file(mode="create")`` checks, then
    writes). In a bucket gcsfs's ``pipe_file(mode="create")``: one upload with
    ``ifGenerationMatch=0``, refused (412) while a live object of that name exists, so of two
    writers one wins (its "xb" file is a resumable upload, whose precondition the emulator skips).
    """
    with _on(path) as (filesystem, name):
        try:
            if is_remote(path):
                filesystem.pipe_file(name, data, mode="create")
                return True
            with filesystem.open(name, "xb") as f:
                f.write(data)
        except FileExistsError:
            return False
    return True


def copy_to_local(path: str | os.PathLike, local: str) -> str:
    """`path` (a file or a directory tree) copied to the local path `local`, whole or nothing:
    into a hidden sibling, then renamed. A tree never replaces one; returns `local`."""
    parent, base = os.path.split(os.path.abspath(local))
    tmp = os.path.join(parent, f".{base}.tmp-{uuid.uuid4().hex[:8]}")
    with _on(path) as (filesystem, name):
        tree = filesystem.isdir(name)
        if tree and os.path.lexists(local):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), local)
        try:
            filesystem.get(name + "/" * tree, tmp + "/" * tree, recursive=tree)
            os.rename(tmp, local)
        finally:
            rmtree(tmp, ignore_errors=True)
    return local


def upload(local: str, path: str | os.PathLike) -> None:
    """A local file or directory tree copied to `path`: a local path whole or nothing, in a
    bucket each object visible once written."""
    if not is_remote(path):
        copy_to_local(local, os.fspath(path))
        return
    tree = os.path.isdir(local)
    with _on(path) as (filesystem, name):
        filesystem.put(local.rstrip("/") + "/" * tree, name + "/" * tree, recursive=tree)


# --- Changing the tree ---


def makedirs(path: str | os.PathLike, exist_ok: bool = False) -> None:
    """Creates a local directory; in a bucket (no directories) checks the bucket only (gcsfs's
    makedirs would create a missing bucket)."""
    with _on(path) as (filesystem, name):
        if not is_remote(path):
            filesystem.makedirs(name, exist_ok=exist_ok)


def remove(path: str | os.PathLike) -> None:
    _call(path, "rm_file")


def rmtree(path: str | os.PathLike, ignore_errors: bool = False) -> None:
    try:
        _call(path, "rm", recursive=True)
    except (OSError, StorageError):
        if not ignore_errors:
            raise


def rename(source: str | os.PathLike, target: str | os.PathLike) -> None:
    """Local: an atomic rename (fsspec's ``mv`` is ``shutil.move``, which moves into an existing
    directory). In a bucket: every object copied, then the source deleted; a failed copy takes
    back the copies made, so the target is whole or absent."""
    source, target = os.fspath(source), os.fspath(target)
    if is_remote(source) != is_remote(target):  # callers rename within a directory: a bug
        raise ValueError(f"cannot rename {source} to {target}: one is local, one in a bucket")
    with _on(source) as (filesystem, old), _on(target) as (_, new):
        if not is_remote(source):
            os.rename(old, new)
            return
        keys = filesystem.find(old) if filesystem.isdir(old) else [old]
        copies, done = [new + key[len(old) :] for key in keys], 0
        try:
            for key, copy in zip(keys, copies):  # server-side copies (rewriteTo), then deletes
                filesystem.cp_file(key, copy)
                done += 1
        except BaseException:
            for copy in copies[:done]:
                with contextlib.suppress(Exception):
                    filesystem.rm_file(copy)
            raise
        for key in keys:
            filesystem.rm_file(key)
