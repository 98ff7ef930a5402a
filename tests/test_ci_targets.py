"""Every test runs in CI: each mark that `make test` leaves out (pyproject.toml's addopts) is
selected by a Makefile target that `.ci/run` runs, and the table of slow end-to-end tests names
tests that exist."""

from __future__ import annotations

import ast
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


def _slow_end_to_end() -> dict[str, str]:
    """tests/conftest.py's SLOW_END_TO_END, read from its source (importing conftest a second
    time, as tests.conftest, would run its setup again)."""
    for node in ast.parse(_read("tests/conftest.py")).body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if [getattr(t, "id", None) for t in targets] == ["SLOW_END_TO_END"]:
            return ast.literal_eval(node.value)
    raise AssertionError("tests/conftest.py has no SLOW_END_TO_END")


def test_each_slow_end_to_end_test_exists_and_says_why():
    """A renamed or removed test would otherwise leave its key behind, and a renamed one would
    run in `make test` again unnoticed."""
    table = _slow_end_to_end()
    assert len(table) >= 20
    for key, reason in table.items():
        path, name = key.split("::")
        assert reason, key
        assert os.path.exists(os.path.join(REPO, path)), key
        tree = ast.parse(_read(path))
        defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
        name = name.split("[", 1)[0]  # a parametrised case: its test's name
        assert name in defined, f"tests/conftest.py SLOW_END_TO_END: {key} names no test"
