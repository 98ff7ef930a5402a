"""User errors and exit statuses: what the user must change (one line) versus a bug (a traceback).

`bert-jax` (`bert_jax.cli`) prints a `UserError` (or a subclass) as one line on stderr,
`bert-jax COMMAND: error: <message>`, and exits with status 2. Nothing else is a user error: a
plain `ValueError`, `KeyError` or `OSError` that escapes a command is a bug in bert-jax and keeps
its traceback (exit 1). So a user error is raised where the code knows what the user did wrong,
and its message names the file (and line), the flag or the setting, and what to do.

An OS error on a path the user gave (missing, in the way, unreadable) becomes a `UserError` at the
place that opens it, through `user_path`; the same error on a file bert-jax wrote itself a moment
ago stays an OSError and is reported as the bug it is.

`UserError` derives from `ValueError` so that library callers that catch `ValueError` around a
settings check keep working; the CLI catches `UserError` only.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator

# What `bert-jax` exits with; README, docs/faults.md and `bert-jax --help` list them, a
# supervisor relies on them.
EXIT_OK = 0
EXIT_BUG = 1
EXIT_USER_ERROR = 2
EXIT_DIVERGED = 3  # the loss stayed non-finite: running again repeats it; the message says more
EXIT_DOES_NOT_FIT = 4
EXIT_INTERRUPTED = 130  # 128 + SIGINT: Ctrl-C; the command said what was done and how to go on
EXIT_STOPPED = 143  # 128 + SIGTERM: stopped after saving a checkpoint; run again to resume.

EXIT_STATUSES_HELP = """exit statuses:
  0    done
  1    a bug in bert-jax (with its traceback)
  2    a user error (one line naming the file, flag or setting to change)
  3    pretraining stopped: the loss or gradients stayed non-finite (the message names the last
       good checkpoint; running again unchanged repeats it)
  4    does not fit (compile check: a phase needs more memory than the devices have)
  130  interrupted by Ctrl-C (`plan` says what it did and how to go on)
  143  stopped by SIGTERM after saving a checkpoint (run the same command again to resume)"""

# Set to 1 to see the traceback of a user error too.
DEBUG_ENV = "BERT_JAX_DEBUG"


class UserError(ValueError):
    """The user's input, file or setting is wrong; the message names it and says what to do."""


_OS_ERROR_WORDS = {
    errno.ENOENT: "does not exist",
    errno.EISDIR: "is a directory, not a file",
    errno.EEXIST: "already exists",
    errno.EACCES: "is not accessible (permission denied)",
    errno.EPERM: "is not accessible (operation not permitted)",
    errno.ENOSPC: "cannot be written: the disk is full",
    errno.EDQUOT: "cannot be written: the disk quota is exceeded",
    errno.EROFS: "cannot be written: read-only file system",
    errno.ENAMETOOLONG: "has a name that is too long",
}
# What writing an output the user named can meet that is the user's to fix (a place bert-jax may
# not write, a full disk, a file in the way); a file missing under bert-jax's own output while it
# writes it (ENOENT) is not among them: that is a bug.
_WRITE_ERRNOS = frozenset(
    {
        errno.EACCES,
        errno.EPERM,
        errno.ENOSPC,
        errno.EDQUOT,
        errno.EROFS,
        errno.ENOTDIR,
        errno.EISDIR,
        errno.EEXIST,
        errno.ENAMETOOLONG,
    }
)


def describe_os_error(err: OSError, path: str | os.PathLike | None = None) -> str:
    """What is wrong, in words: `<file> does not exist`, `<file> is a regular file, not a
    directory`, ... `err.filename` is named when it has one, else `path`."""
    filename = os.fspath(err.filename) if err.filename else None
    where = filename or (os.fspath(path) if path is not None else "the path")
    if err.errno == errno.ENOTDIR:
        blocker = _first_file_on_the_way(where)
        if blocker:
            return f"{blocker} is a regular file, not a directory"
    words = _OS_ERROR_WORDS.get(err.errno or -1)
    return f"{where} {words}" if words else f"{where}: {err.strerror or err}"


def _first_file_on_the_way(path: str) -> str | None:
    """The first ancestor of `path` (or `path` itself) that exists and is not a directory."""
    if "://" in path:
        return None
    parts = os.path.abspath(path).split(os.sep)
    for end in range(2, len(parts) + 1):
        prefix = os.sep.join(parts[:end])
        if os.path.lexists(prefix) and not os.path.isdir(prefix):
            return prefix
    return None


@contextlib.contextmanager
def user_path(path: str | os.PathLike, what: str, writing: bool = False) -> Iterator[None]:
    """Turn an OSError on a path the user gave into a one-line `UserError`.

    `what` names the flag or setting the path came from (`--input`, `--workdir`,
    `config.init_from`); the message reads `<what> <path>: <what is wrong>`. With `writing`, only
    the errors a user fixes (permissions, a full or read-only disk, a file in the way) are
    translated: a file that vanishes under bert-jax's own output while it writes is a bug.
    """
    try:
        yield
    except UserError:
        raise
    except OSError as err:
        if writing and err.errno not in _WRITE_ERRNOS:
            raise
        path, problem = os.fspath(path), describe_os_error(err, path)
        if problem.startswith(f"{path} "):  # the path itself: say it once
            raise UserError(f"{what} {problem}") from err
        raise UserError(f"{what} {path}: {problem}") from err
