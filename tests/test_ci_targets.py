"""Every test runs in CI: each mark that `make test` leaves out (pyproject.toml's addopts) is
selected by a Makefile target that `.ci/run` runs."""

from __future__ import annotations

import os
import re
import shlex

import tomllib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(name: str) -> str:
    with open(os.path.join(REPO, name), encoding="utf-8") as f:
        return f.read()


def _marks_left_out() -> set[str]:
    addopts = tomllib.loads(_read("pyproject.toml"))["tool"]["pytest"]["ini_options"]["addopts"]
    expression = shlex.split(addopts)[shlex.split(addopts).index("-m") + 1]
    return set(re.findall(r"not (\w+)", expression))


def _targets_by_mark() -> dict[str, str]:
    """Mark -> the Makefile target whose pytest line selects it with `-m MARK`."""
    found, target = {}, None
    for line in _read("Makefile").splitlines():
        if re.match(r"^[\w-]+:", line):
            target = line.split(":", 1)[0]
        elif line.startswith("\t") and " pytest " in line:
            words = shlex.split(line)
            after = words[words.index("pytest") + 1 :]
            if "-m" in after:
                found[after[after.index("-m") + 1]] = target
    return found


def test_every_mark_make_test_leaves_out_runs_in_ci():
    ci = set(re.findall(r"^make ([\w-]+)$", _read(".ci/run"), flags=re.MULTILINE))
    marks = _marks_left_out()
    assert {"slow_e2e", "gcs", "launch", "tpu_compile", "beam"} <= marks
    targets = _targets_by_mark()
    for mark in marks:
        assert mark in targets, f"no Makefile target runs pytest -m {mark}"
        assert targets[mark] in ci, f".ci/run does not run make {targets[mark]} (-m {mark})"
    assert "test" in ci
