"""The one file-system layer: every path a user gives may be local or a ``gs://bucket/...`` URL.

Local paths go to ``os`` / ``shutil``; ``gs://`` URLs to gcsfs (Cloud Storage's JSON API, retried
with backoff on 408/429/5xx and dropped connections). The other readers and writers of the bucket
reach it natively: Orbax through etils.epath (pointed here at the same gcsfs backend) with
TensorStore for the arrays, tf.data, ``tf.io.TFRecordWriter`` and TF1 checkpoint reading
(``convert --from tf1``) through TensorFlow's own GCS file system. TensorFlow is never
imported here.

Cloud Storage has objects, not directories: a "directory" is a name prefix, ``makedirs`` is a
no-op, ``rename`` is copy-then-delete (not atomic) and ``create_exclusive`` is an upload with the
precondition "no live object of that name" (``ifGenerationMatch=0``), which is atomic. Callers
that need "whole or nothing" on a bucket commit by writing a marker last (data/files.py).

Errors: a failure that is not the caller's "missing"/"exists" case (a missing bucket, no
credentials, a permission refused, the service unreachable after its retries) raises
``StorageError``, a user error whose one line names the URL.

Credentials: Application Default Credentials (``gcloud auth application-default login``, a TPU
VM's service account, ``GOOGLE_APPLICATION_CREDENTIALS``). With ``STORAGE_EMULATOR_HOST`` set (a
local Cloud Storage emulator, as the tests use) none are needed.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import shutil
import time
from collections.abc import Iterator
from typing import IO, Any

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


def is_remote(path: str | os.PathLike) -> bool:
    return os.fspath(path).startswith(SCHEME)


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
    if is_remote(path):
        return path.rstrip("/") if len(path.rstrip("/")) > len(SCHEME) else path
    return os.path.abspath(path)


def dirname(path: str | os.PathLike) -> str:
    path = os.fspath(path)
    if not is_remote(path):
        return os.path.dirname(path)
    head = path.rstrip("/").rsplit("/", 1)[0]
    return head if len(head) > len(SCHEME) else path


def basename(path: str | os.PathLike) -> str:
    path = os.fspath(path)
    return path.rstrip("/").rsplit("/", 1)[-1] if is_remote(path) else os.path.basename(path)


def bucket(url: str) -> str:
    return url[len(SCHEME) :].split("/", 1)[0]


@functools.lru_cache(maxsize=1)
def _client_for(emulator: str | None):
    import gcsfs

    # The emulator takes no credentials; real buckets take Application Default Credentials
    # and fail with DefaultCredentialsError when there are none (never anonymous access).
    return gcsfs.GCSFileSystem(
        token="anon" if emulator else "google_default", use_listings_cache=False
    )


def _client():
    try:
        return _client_for(os.environ.get("STORAGE_EMULATOR_HOST"))
    except Exception as err:  # google.auth's DefaultCredentialsError and kin
        raise StorageError(_why(err, "")) from None


def _why(err: BaseException, url: str) -> str:
    """One line: what Cloud Storage said about `url`."""
    name = type(err).__name__
    text = " ".join(str(err).split()) or name
    if "DefaultCredentialsError" in name or "credentials were not found" in text:
        return (
            f"no Google Cloud credentials for {url or 'Cloud Storage'}: run `gcloud auth "
            "application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS to a service "
            "account key (on a TPU VM the VM's service account is used)"
        )
    if text.startswith("Forbidden") or getattr(err, "code", None) in (401, 403):
        return f"permission denied on {url}: the account in use may not access bucket " + (
            f"gs://{bucket(url)} ({text[:200]})"
        )
    if "bucket does not exist" in text.lower() or "notfound" in text.lower():
        return f"{url}: the bucket gs://{bucket(url)} does not exist"
    return f"Cloud Storage failed on {url} after retries: {text[:300]}"


@contextlib.contextmanager
def _remote_errors(url: str) -> Iterator[None]:
    """Cloud Storage failures as StorageError naming `url`; missing/exists pass through."""
    try:
        yield
    except (FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError):
        raise
    except StorageError:
        raise
    except Exception as err:
        raise StorageError(_why(err, url)) from None


def _key(url: str) -> str:
    return url[len(SCHEME) :].rstrip("/")


def _check_bucket(url: str) -> None:
    """FileNotFoundError-free check that the bucket exists (one request, cached per run)."""
    _bucket_exists(bucket(url), os.environ.get("STORAGE_EMULATOR_HOST"))


@functools.lru_cache(maxsize=64)
def _bucket_exists(name: str, emulator: str | None) -> None:
    del emulator  # part of the cache key only
    url = SCHEME + name
    with _remote_errors(url):
        try:
            _client().info(name)
        except FileNotFoundError:
            raise StorageError(f"{url}: the bucket gs://{name} does not exist") from None


# --- Queries ---


def _query(path: str | os.PathLike, local: Any, remote: str) -> bool:
    """`local(path)` on this machine; the gcsfs method named `remote` in a bucket."""
    path = os.fspath(path)
    if not is_remote(path):
        return local(path)
    _check_bucket(path)
    with _remote_errors(path):
        return getattr(_client(), remote)(_key(path))


def exists(path: str | os.PathLike) -> bool:
    return _query(path, os.path.exists, "exists")


def isdir(path: str | os.PathLike) -> bool:
    return _query(path, os.path.isdir, "isdir")


def isfile(path: str | os.PathLike) -> bool:
    return _query(path, os.path.isfile, "isfile")


def listdir(path: str | os.PathLike) -> list[str]:
    """Names of the entries directly under `path`. In a bucket, which has no empty directories,
    a prefix with nothing under it lists as empty."""
    path = os.fspath(path)
    if not is_remote(path):
        return os.listdir(path)
    _check_bucket(path)
    with _remote_errors(path):
        try:
            entries = _client().ls(_key(path), detail=False)
        except FileNotFoundError:
            return []
    own = _key(path)
    return sorted({e.rstrip("/").rsplit("/", 1)[-1] for e in entries if e.rstrip("/") != own})


def glob(pattern: str) -> list[str]:
    if not is_remote(pattern):
        import glob as glob_lib

        return sorted(glob_lib.glob(pattern))
    _check_bucket(pattern)
    with _remote_errors(pattern):
        return sorted(SCHEME + p for p in _client().glob(_key(pattern)))


def getsize(path: str | os.PathLike) -> int:
    path = os.fspath(path)
    if not is_remote(path):
        return os.path.getsize(path)
    with _remote_errors(path):
        return int(_client().info(_key(path))["size"])


def getmtime(path: str | os.PathLike) -> float:
    path = os.fspath(path)
    if not is_remote(path):
        return os.path.getmtime(path)
    with _remote_errors(path):
        modified = _client().modified(_key(path))
    return modified.timestamp()


def walk_files(path: str | os.PathLike) -> Iterator[str]:
    """Every file under `path`, recursively."""
    path = os.fspath(path)
    if not is_remote(path):
        for folder, _, files in os.walk(path):
            for name in files:
                yield os.path.join(folder, name)
        return
    with _remote_errors(path):
        for key in _client().find(_key(path)):
            yield SCHEME + key


# --- Reading and writing ---


def open(path: str | os.PathLike, mode: str = "r", encoding: str | None = None) -> IO[Any]:  # noqa: A001
    """A file object; on Cloud Storage a write becomes visible (whole) when it is closed."""
    path = os.fspath(path)
    if "b" not in mode and encoding is None:
        encoding = "utf-8"
    if not is_remote(path):
        import builtins

        return builtins.open(path, mode, encoding=encoding)
    if "w" in mode or "a" in mode or "x" in mode:
        _check_bucket(path)
    with _remote_errors(path):
        if mode == "rb":  # the full binary-file interface (readline(limit), peek, ...)
            return io.BufferedReader(_client().open(_key(path), "rb"), buffer_size=1 << 20)
        return _client().open(_key(path), mode, encoding=encoding)


def open_gzip(path: str | os.PathLike) -> IO[bytes]:
    """A gzip file opened for reading (closing it closes the underlying file too)."""
    import gzip

    path = os.fspath(path)
    if not is_remote(path):
        return gzip.open(path, "rb")
    raw = open(path, "rb")
    stream = gzip.GzipFile(fileobj=raw)
    stream.myfileobj = raw  # GzipFile closes the file it was given only through this field
    return stream


def read_bytes(path: str | os.PathLike) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def read_range(path: str | os.PathLike, start: int, end: int) -> bytes:
    """Bytes [start, end) of a file (fewer at its end); one ranged request on Cloud Storage."""
    path = os.fspath(path)
    if not is_remote(path):
        with open(path, "rb") as f:
            f.seek(start)
            return f.read(end - start)
    with _remote_errors(path):
        return _client().cat_file(_key(path), start=start, end=end)


def read_text(path: str | os.PathLike) -> str:
    with open(path, "r") as f:
        return f.read()


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    path = os.fspath(path)
    if not is_remote(path):
        with open(path, "wb") as f:
            f.write(data)
        return
    _check_bucket(path)
    with _remote_errors(path):
        _client().pipe_file(_key(path), data)


def write_text(path: str | os.PathLike, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def create_exclusive(path: str | os.PathLike, data: bytes) -> bool:
    """Writes `path` only if no file of that name exists, atomically; False when one does.

    Local: O_CREAT | O_EXCL. Cloud Storage: an upload with ``ifGenerationMatch=0``, which the
    service refuses (412) when a live object of that name exists, so of two writers one wins.
    """
    path = os.fspath(path)
    if not is_remote(path):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return True
    _check_bucket(path)
    with _remote_errors(path):
        try:
            _client().pipe_file(_key(path), data, mode="create")
        except FileExistsError:
            return False
    return True


def copy_to_local(path: str | os.PathLike, local: str) -> str:
    """`path` (a file or a directory tree) copied to the local path `local`; returns `local`."""
    path = os.fspath(path)
    if not is_remote(path):
        if os.path.isdir(path):
            shutil.copytree(path, local)
        else:
            shutil.copyfile(path, local)
        return local
    with _remote_errors(path):
        client = _client()
        if client.isdir(_key(path)):
            client.get(_key(path) + "/", local.rstrip("/") + "/", recursive=True)
        else:
            client.get_file(_key(path), local)
    return local


def upload(local: str, path: str | os.PathLike) -> None:
    """A local file or directory tree copied to `path` (a local path or a URL)."""
    path = os.fspath(path)
    if not is_remote(path):
        if os.path.isdir(local):
            shutil.copytree(local, path)
        else:
            shutil.copyfile(local, path)
        return
    _check_bucket(path)
    with _remote_errors(path):
        if os.path.isdir(local):
            _client().put(local.rstrip("/") + "/", _key(path) + "/", recursive=True)
        else:
            _client().put_file(local, _key(path))


# --- Changing the tree ---


def makedirs(path: str | os.PathLike, exist_ok: bool = False) -> None:
    """Creates a local directory; on Cloud Storage (no directories) checks the bucket only."""
    path = os.fspath(path)
    if not is_remote(path):
        os.makedirs(path, exist_ok=exist_ok)
        return
    _check_bucket(path)


def remove(path: str | os.PathLike) -> None:
    path = os.fspath(path)
    if not is_remote(path):
        os.remove(path)
        return
    with _remote_errors(path):
        _client().rm_file(_key(path))


def rmtree(path: str | os.PathLike, ignore_errors: bool = False) -> None:
    path = os.fspath(path)
    if not is_remote(path):
        shutil.rmtree(path, ignore_errors=ignore_errors)
        return
    try:
        with _remote_errors(path):
            _client().rm(_key(path), recursive=True)
    except (FileNotFoundError, StorageError):
        if not ignore_errors:
            raise


def rename(source: str | os.PathLike, target: str | os.PathLike) -> None:
    """Local: an atomic rename. Cloud Storage: copy every object, then delete the source (not
    atomic: a reader may see both, or a part of the target while it is copied)."""
    source, target = os.fspath(source), os.fspath(target)
    if not is_remote(source) and not is_remote(target):
        os.rename(source, target)
        return
    if not (is_remote(source) and is_remote(target)):
        raise ValueError(f"cannot rename {source} to {target}: one is local, one in a bucket")
    with _remote_errors(source):
        client = _client()
        keys = client.find(_key(source)) if client.isdir(_key(source)) else [_key(source)]
        for key in keys:  # server-side copies (rewriteTo), then the deletes
            client.cp_file(key, _key(target) + key[len(_key(source)) :])
        for key in keys:
            client.rm_file(key)


def disk_free(path: str | os.PathLike) -> int | None:
    """Free bytes on the local file system holding `path`; None for a bucket."""
    path = os.fspath(path)
    return None if is_remote(path) else shutil.disk_usage(path).free


def age_seconds(path: str | os.PathLike) -> float:
    return time.time() - getmtime(path)
