"""The `bert-jax` entry point: every subcommand of the design is registered exactly once."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bert_jax import cli

DESIGNED = ("tokenizer", "data", "pretrain", "convert", "encode", "finetune", "glue")


def test_help_lists_every_designed_subcommand(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for name in DESIGNED:
        assert f"\n    {name}" in out, name


def test_console_script_runs():
    script = os.path.join(os.path.dirname(sys.executable), "bert-jax")
    proc = subprocess.run([script, "pretrain", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "--config" in proc.stdout and "--workdir" in proc.stdout


def test_pretrain_without_config_is_a_clear_error():
    with pytest.raises(SystemExit, match="--config is required"):
        cli.main(["pretrain", "--workdir", "/tmp/x"])


def test_config_overrides_work_in_process(capsys):
    config = os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs", "bert.py")
    argv = ["pretrain", "--config", f"{config}:tiny", "--config.total_steps=1234", "--dry-run"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "total_steps = 1234" in out
    assert "steps 0..1110 (1111), seq 128" in out
