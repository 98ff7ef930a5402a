"""docs/paper.md lists every table of the paper with commands today's CLI accepts (parsed, not
run), as test_readme does for README.md."""

from __future__ import annotations

import os
import re
import shlex

import pytest

from tests import test_readme

PAGE = os.path.join(test_readme.REPO, "docs", "paper.md")


def _text() -> str:
    with open(PAGE, encoding="utf-8") as f:
        return f.read()


def _examples() -> list[list[str]]:
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", _text(), flags=re.MULTILINE | re.DOTALL)
    lines = [line.strip() for block in blocks for line in block.replace("\\\n", " ").splitlines()]
    return [shlex.split(line, comments=True)[1:] for line in lines if line.startswith("bert-jax ")]


EXAMPLES = _examples()


def test_every_table_and_figure_5_has_a_section():
    headings = re.findall(r"^## (Table \d|Figure 5)", _text(), flags=re.MULTILINE)
    assert headings == [f"Table {i}" for i in range(1, 9)] + ["Figure 5"]


@pytest.mark.parametrize("argv", EXAMPLES, ids=[" ".join(a)[:60] for a in EXAMPLES])
def test_a_command_line_of_the_page_parses(argv, monkeypatch):
    test_readme.test_a_readme_command_line_parses(argv, monkeypatch)
