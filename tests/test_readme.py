"""Every `bert-jax` command line in the code blocks of README.md and of the manual (docs/*.md) is
accepted by today's CLI: the arguments parse and config overrides name real settings (nothing is
run here; tests/test_docs_commands.py runs them)."""

from __future__ import annotations

import os

import pytest

from bert_jax import cli
from bert_jax.cli import config_flags
from tests.test_docs_commands import COMMANDS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# The same extraction as the test that runs them (continuations joined, comments dropped, a
# `.venv/bin/` prefix allowed, a shell loop's body with its first value).
EXAMPLES = [list(command.argv) for command in COMMANDS]


def test_the_pages_have_examples_of_every_command():
    commands = {argv[0] for argv in EXAMPLES}
    expected = {"tokenizer", "data", "pretrain", "plan", "convert", "encode", "finetune", "glue"}
    expected.add("bench")
    assert expected | {"launch"} <= commands, commands


@pytest.mark.parametrize("argv", EXAMPLES, ids=[" ".join(a)[:60] for a in EXAMPLES])
def test_a_readme_command_line_parses(argv, monkeypatch):
    monkeypatch.chdir(REPO)  # config paths in the README are relative to the repository
    config_commands = {
        c.name: c for c in (cli.pretrain.COMMAND, cli.plan.COMMAND, cli.bench.COMMAND)
    }
    if argv[0] in config_commands:
        flags = config_flags.parse(config_commands[argv[0]], argv[1:])
        assert flags.config is not None
    else:
        args = cli.build_parser().parse_args(argv)
        assert callable(args.run)
