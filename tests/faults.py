"""What every fault and bad-input case checks (tests/test_faults_*.py): the exit status, a one-line
message naming the file or setting, and that nothing that existed before was changed."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

from bert_jax import cli


def tree_digest(path: str | os.PathLike) -> dict[str, str]:
    """Relative path -> SHA-256 of every file under `path` (a file: itself), links as their target.
    Equal digests before and after a command mean it changed nothing there."""
    path = os.fspath(path)
    if not os.path.exists(path):
        return {}
    if os.path.isfile(path):
        with open(path, "rb") as f:
            return {".": hashlib.sha256(f.read()).hexdigest()}
    found = {}
    for folder, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files) + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
            full = os.path.join(folder, name)
            key = os.path.relpath(full, path)
            if os.path.islink(full):
                found[key] = "link:" + os.readlink(full)
            else:
                with open(full, "rb") as f:
                    found[key] = hashlib.sha256(f.read()).hexdigest()
        for name in dirs:
            found.setdefault(os.path.relpath(os.path.join(folder, name), path) + "/", "dir")
    return found


@dataclass
class Outcome:
    code: int
    message: str  # the one stderr line without its "bert-jax COMMAND: error: " prefix
    err: str


def run_cli(capsys, argv: list[str]) -> Outcome:
    """Runs `bert-jax argv` in this process; the message is stderr's last line after the prefix."""
    capsys.readouterr()
    code = cli.main(list(argv))
    err = capsys.readouterr().err
    last = err.rstrip("\n").rsplit("\n", 1)[-1]
    message = last.split(": error: ", 1)[1] if ": error: " in last else last
    _record(code, message)
    return Outcome(code, message, err)


def _record(code: int, message: str) -> None:
    """With BERT_JAX_FAULT_LOG=FILE, each case's exit status and message are appended to FILE
    (the list of cases and what they print, for the battery's documentation)."""
    path = os.environ.get("BERT_JAX_FAULT_LOG")
    if path:
        case = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{case}\t{code}\t{message}\n")


def assert_user_error(outcome: Outcome, *named: str, only_line: bool = True) -> None:
    """Exit 2, one error line naming each of `named` (a path, a setting, a step); with
    `only_line`, nothing else on stderr (commands that log progress first pass False)."""
    assert outcome.code == 2, outcome.err[-3000:]
    assert "Traceback" not in outcome.err, outcome.err[-3000:]
    if only_line:
        assert outcome.err.count("\n") == 1, outcome.err[-3000:]
    for name in named:
        assert str(name) in outcome.message, (name, outcome.message)
