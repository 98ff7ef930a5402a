"""Local paths and ``gs://bucket/...`` URLs, both through fsspec (gcsfs retries with backoff).

Added only what fsspec does not do: a Cloud Storage failure as one line naming the URL
(``StorageError``; a local OSError stays as the OS raised it, see `errors.user_path`), an atomic
create-if-absent, renames and copies whole or not at all, listings spelled as the path was given,
reads of a byte range that fetch exactly it and count what they fetched (``RangeFile``).
Credentials: ADC; none with ``STORAGE_EMULATOR_HOST`` (the tests' emulator, read by gcsfs).
"""

from __future__ import annotations

import builtins
import contextlib
import datetime
import errno
import functools
import gzip
import io
import os
import uuid
from collections.abc import Callable, Iterator
from typing import IO, Any

import fsspec

from bert_jax.runtime.errors import UserError

# Orbax (etils.epath) takes gcsfs, not tf.io.gfile; gcsfs asks nothing about zonal buckets.
os.environ.setdefault("EPATH_USE_TF", "false")
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
# Every gcsfs client (Orbax's too) lists afresh: a remembered listing made Orbax delete a step
# that bert-jax had set aside (FileNotFoundError in its save).
fsspec.config.conf.setdefault("gcs", {}).setdefault("use_listings_cache", False)

SCHEME = "gs://"
AnyPath = str | os.PathLike


class StorageError(UserError):
    """Cloud Storage refused or could not do an operation; the message names the URL."""


# --- Paths, never I/O ---


def is_remote(path: AnyPath) -> bool:
    return os.fspath(path).startswith(SCHEME)


def bucket(url: str) -> str:
    return url[len(SCHEME) :].split("/", 1)[0]


def abspath(path: AnyPath) -> str:
    """A local path made absolute; a URL without a trailing slash (os.path's functions then
    suit both, as a URL's slashes are a path's)."""
    path = os.fspath(path)
    if not is_remote(path):
        return os.path.abspath(path)
    return path.rstrip("/") if len(path.rstrip("/")) > len(SCHEME) else path


# --- The file system behind a path, and its errors ---


@contextlib.contextmanager
def _on(path: AnyPath, check: bool = True) -> Iterator[tuple[Any, str]]:
    """(fsspec file system, its name for `path`); in a bucket, that the bucket exists (`check`),
    and failures as StorageError naming `path`."""
    path = os.fspath(path)
    if not path:  # fsspec would take "" for the working directory
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
    emulator = os.environ.get("STORAGE_EMULATOR_HOST")
    # The emulator takes no credentials, a bucket ADC (never anonymous).
    options = {"token": "anon" if emulator else "google_default"} if is_remote(path) else {}
    with _remote_errors(path):
        filesystem, name = fsspec.core.url_to_fs(path, **options)
        if check and is_remote(path):
            _bucket_exists(bucket(path), emulator)
        yield filesystem, name.rstrip("/") or name


@functools.lru_cache(maxsize=64)
def _bucket_exists(name: str, emulator: str | None) -> None:
    """One request per bucket (and emulator) and run."""
    with _on(SCHEME + name, check=False) as (filesystem, _):
        if not filesystem.exists(name):
            raise StorageError(f"{SCHEME}{name}: the bucket does not exist")


@contextlib.contextmanager
def _remote_errors(url: str) -> Iterator[None]:
    """A bucket's failures as one StorageError line naming `url`; "missing", "exists" and any
    error on a local path pass through."""
    try:
        yield
    except (FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError):
        raise
    except Exception as err:
        if not is_remote(url) or isinstance(err, StorageError):
            raise
        kind, text = type(err).__name__, " ".join(str(err).split()) or type(err).__name__
        if "DefaultCredentialsError" in kind or "credentials were not found" in text:
            why = (
                f"no Google Cloud credentials for {url}: run `gcloud auth application-default "
                "login` or set GOOGLE_APPLICATION_CREDENTIALS (a TPU VM uses its service account)"
            )
        elif text.startswith("Forbidden") or getattr(err, "code", None) in (401, 403):
            why = f"permission denied on {url}: the account in use may not access bucket "
            why += f"{SCHEME}{bucket(url)} ({text[:200]})"
        elif "bucket does not exist" in text.lower() or "notfound" in text.lower():
            why = f"{url}: the bucket {SCHEME}{bucket(url)} does not exist"
        else:
            why = f"Cloud Storage failed on {url} after retries: {text[:300]}"
        raise StorageError(why) from None


def _fsspec(method: str, empty: Any = None, **fixed: Any) -> Callable[..., Any]:
    """fsspec's `method` on the path's file system, through `_on`; `empty` for "" if given."""

    def call(path: AnyPath, *args: Any, **kwargs: Any) -> Any:
        if empty is not None and not os.fspath(path):
            return empty
        with _on(path) as (filesystem, name):
            return getattr(filesystem, method)(name, *args, **fixed, **kwargs)

    return call


# --- fsspec's own operations, under the names of os.path ---

exists: Callable[[AnyPath], bool] = _fsspec("exists", empty=False)
isdir: Callable[[AnyPath], bool] = _fsspec("isdir", empty=False)
isfile: Callable[[AnyPath], bool] = _fsspec("isfile", empty=False)
getsize: Callable[[AnyPath], int] = _fsspec("size")
modified: Callable[[AnyPath], datetime.datetime] = _fsspec("modified")
info: Callable[[AnyPath], dict[str, Any]] = _fsspec("info")  # a bucket object's metadata too
# (path, start=None, end=None): the bytes [start, end), one ranged request in a bucket.
read_bytes: Callable[..., bytes] = _fsspec("cat_file")
write_bytes: Callable[[AnyPath, bytes], None] = _fsspec("pipe_file")
read_text: Callable[[AnyPath], str] = _fsspec("read_text", encoding="utf-8")
write_text: Callable[[AnyPath, str], None] = _fsspec("write_text", encoding="utf-8")
remove: Callable[[AnyPath], None] = _fsspec("rm_file")


def rmtree(path: AnyPath, ignore_errors: bool = False) -> None:
    with contextlib.suppress(*((OSError, StorageError) if ignore_errors else ())):
        _fsspec("rm")(path, recursive=True)


def makedirs(path: AnyPath, exist_ok: bool = False) -> None:
    """A local directory; in a bucket only the bucket's check (gcsfs would create a bucket)."""
    with _on(path) as (filesystem, name):
        if not is_remote(path):
            filesystem.makedirs(name, exist_ok=exist_ok)


def open(path: AnyPath, mode: str = "r", encoding: str | None = None) -> IO[Any]:  # noqa: A001
    """A file object; in a bucket a write becomes visible (whole) when it is closed."""
    text = {} if "b" in mode else {"encoding": encoding or "utf-8"}
    f = _fsspec("open")(path, mode, **text)
    if mode == "rb" and isinstance(f, fsspec.spec.AbstractBufferedFile):
        return io.BufferedReader(f, buffer_size=1 << 20)  # readline(limit), peek, ...
    return f


class RangeFile(io.RawIOBase):
    """The bytes ``[start, stop)`` of a file (``stop`` None: to its end), seekable within them,
    read exactly as asked (in a bucket, one ranged request per read; no read-ahead past
    ``stop``), counting in ``bytes_read`` every byte fetched from storage. Positions are the
    file's own; ``size`` is the file's (given, or asked of storage). Wrap it in
    ``io.BufferedReader`` for ``readline``."""

    def __init__(
        self, path: AnyPath, start: int = 0, stop: int | None = None, size: int | None = None
    ):
        self.path, self.start, self.bytes_read = os.fspath(path), start, 0
        self.position = start
        self._local = None if is_remote(path) else builtins.open(self.path, "rb")  # noqa: SIM115
        if size is None:  # the caller may know it: one request fewer in a bucket
            local = self._local
            size = getsize(self.path) if local is None else os.fstat(local.fileno()).st_size
        self.size, self.stop = size, size if stop is None else min(stop, size)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.stop}[whence]
        self.position = base + offset
        return self.position

    def tell(self) -> int:
        return self.position

    def readinto(self, buffer) -> int:
        size = max(0, min(len(buffer), self.stop - self.position))
        if size == 0:
            return 0
        if self._local is not None:
            self._local.seek(self.position)
            size = self._local.readinto(memoryview(buffer)[:size])
        else:
            data = read_bytes(self.path, self.position, self.position + size)
            size = len(data)
            buffer[:size] = data
        self.position += size
        self.bytes_read += size
        return size

    def close(self) -> None:
        if self._local is not None:
            self._local.close()
        super().close()


def open_range(path: AnyPath, start: int = 0, stop: int | None = None) -> io.BufferedReader:
    """``RangeFile(path, start, stop)`` buffered (``.raw.bytes_read`` counts what was read)."""
    return io.BufferedReader(RangeFile(path, start, stop), buffer_size=1 << 20)


def open_gzip(path: AnyPath) -> IO[bytes]:
    """A gzip file opened for reading; closing it closes the file under it too."""
    stream = gzip.GzipFile(fileobj=open(path, "rb"))
    stream.myfileobj = stream.fileobj  # the one file GzipFile closes
    return stream


# --- Listings, spelled as the path or pattern was given ---


def _as_given(given: str, name: str, found: str) -> str:
    """`found`, listed under `name` (`given` as fsspec names it), spelled as `given` is: a
    relative path stays relative, a URL keeps its scheme."""
    given = given.rstrip("/") or given
    same = len(os.path.commonprefix([given[::-1], name[::-1]]))
    head = name[: len(name) - same]
    return given[: len(given) - same] + found[len(head) :] if found.startswith(head) else found


def listdir(path: AnyPath) -> list[str]:
    """The names directly under `path`, sorted; in a bucket a prefix with nothing under it lists
    as empty."""
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
    hidden = "/." in "/" + pattern[head:]
    return sorted(p for p in found if hidden or "/." not in "/" + p[head:])


def walk_files(path: AnyPath) -> Iterator[str]:
    """Every file under `path`, recursively."""
    with _on(path) as (filesystem, name):
        found = filesystem.find(name)
    yield from (_as_given(os.fspath(path), name, file) for file in found)


# --- Whole or nothing ---


def create_exclusive(path: AnyPath, data: bytes) -> bool:
    """Writes `path` only if no file of that name exists, atomically; False when one does.
    Locally "xb" (O_EXCL; fsspec's ``mode="create"`` checks, then writes); in a bucket one upload
    on ``ifGenerationMatch=0`` (gcsfs's "xb" is a resumable upload, whose precondition the
    emulator skips)."""
    with _on(path) as (filesystem, name), contextlib.suppress(FileExistsError):
        if is_remote(path):
            filesystem.pipe_file(name, data, mode="create")
        else:
            with filesystem.open(name, "xb") as f:
                f.write(data)
        return True
    return False


def copy_to_local(path: AnyPath, local: str) -> str:
    """`path` (a file or a tree) copied to `local` on this disk into a hidden sibling, then
    renamed; a tree never replaces one. Returns `local`."""
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
            rmtree(tmp, ignore_errors=True)  # a file or a tree
    return local


def upload(local: str, path: AnyPath) -> None:
    """A local file or tree copied to `path`: whole or nothing on a disk, in a bucket each
    object visible once written."""
    if not is_remote(path):
        copy_to_local(local, os.fspath(path))
        return
    tree = os.path.isdir(local)
    with _on(path) as (filesystem, name):
        filesystem.put(local.rstrip("/") + "/" * tree, name + "/" * tree, recursive=tree)


def rename(source: AnyPath, target: AnyPath) -> None:
    """Locally os.rename (atomic; fsspec's ``mv`` would move into an existing directory). In a
    bucket every object copied server-side, then the source deleted; a failed copy takes back
    the copies made, so the target is whole or absent."""
    source, target = os.fspath(source), os.fspath(target)
    if is_remote(source) != is_remote(target):  # callers rename within a directory: a bug
        raise ValueError(f"cannot rename {source} to {target}: one is local, one in a bucket")
    if not is_remote(source):
        return os.rename(source, target)
    with _on(source) as (filesystem, old), _on(target) as (_, new):
        keys = filesystem.find(old) if filesystem.isdir(old) else [old]
        copies = [new + key[len(old) :] for key in keys]
        for done, (key, copy) in enumerate(zip(keys, copies)):
            try:
                filesystem.cp_file(key, copy)
            except BaseException:
                with contextlib.suppress(Exception):
                    filesystem.rm(copies[:done])
                raise
        filesystem.rm(keys)
