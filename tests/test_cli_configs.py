"""The configs ship with the package: `--config bert:SIZE` and `--config demo` work from any
directory, and `configs/*.py` files in a checkout still do (one definition: they load the
packaged ones)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bert_jax import cli, configs
from bert_jax.runtime.errors import UserError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_packaged_config_runs_from_another_directory(tmp_path):
    script = os.path.join(os.path.dirname(sys.executable), "bert-jax")
    argv = [script, "pretrain", "--config", "bert:tiny", "--dry-run", "--config.total_steps=50"]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "total_steps = 50" in done.stdout
    assert os.listdir(tmp_path) == []  # a dry run writes nothing, not even a __pycache__/


@pytest.mark.parametrize(
    "spec, packaged",
    [
        ("bert:tiny", "bert.py:tiny"),
        ("bert.py:base", "bert.py:base"),
        ("bert", "bert.py"),
        ("demo", "demo.py"),
    ],
)
def test_names_without_a_path_are_the_packaged_configs(spec, packaged, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert configs.resolve(spec) == os.path.join(configs.FOLDER, packaged)


def test_a_file_is_read_as_a_file_before_a_packaged_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "demo").write_text("def get_config():\n    return None\n")
    assert configs.resolve("demo") == "demo"
    monkeypatch.chdir(REPO)
    assert configs.resolve("configs/bert.py:tiny") == "configs/bert.py:tiny"


def test_an_unknown_config_is_one_line_naming_the_packaged_ones(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as error:
        configs.resolve("configs/bert.py:tiny")
    assert str(error.value) == (
        "--config configs/bert.py:tiny: no such file (the configs that ship with bert-jax are "
        "named without a path: bert:SIZE, demo, modernbert:SIZE)"
    )
    with pytest.raises(UserError, match=r"^--config nope\.py: no such file$"):
        configs.resolve("nope.py")
    with pytest.raises(UserError, match="no such file"):
        configs.resolve("__init__")


def test_the_checkouts_files_and_the_packaged_names_give_one_config(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    printed = []
    for spec in ("configs/bert.py:tiny", "bert:tiny", "configs/demo.py", "demo"):
        assert cli.main(["pretrain", "--config", spec, "--dry-run"]) == 0
        printed.append(capsys.readouterr().out)
    assert printed[0] == printed[1] and printed[2] == printed[3]
    assert printed[0] != printed[2]
