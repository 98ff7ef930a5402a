"""docs/paper.md lists every table of the paper and Figure 5; its command lines are parsed with
every other page's by test_readme and run by test_docs_commands."""

from __future__ import annotations

import os
import re

from tests import test_docs_commands, test_readme

PAGE = os.path.join(test_readme.REPO, "docs", "paper.md")


def test_every_table_and_figure_5_has_a_section():
    with open(PAGE, encoding="utf-8") as f:
        text = f.read()
    headings = re.findall(r"^## (Table \d|Figure 5)", text, flags=re.MULTILINE)
    assert headings == [f"Table {i}" for i in range(1, 9)] + ["Figure 5"]
    assert any("docs/paper.md" in page for page in test_docs_commands.PAGES)
