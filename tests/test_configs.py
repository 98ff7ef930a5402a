"""The experiment configs (bert_jax/configs/paper/): each loads under its name, with and without
`.py` and from a checkout's configs/, passes the config checks, and differs from the paper's
recipe in exactly the settings its docstring names; docs/paper.md runs every one, and every
documented command naming one dry-runs as written."""

from __future__ import annotations

import importlib
import os
import re

import pytest

from bert_jax import cli, configs
from bert_jax.runtime.errors import UserError
from bert_jax.training import config_checks, config_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPERIMENTS = [name for name in configs.names() if name.startswith("paper/")]


def _module(name: str):
    return importlib.import_module("bert_jax.configs." + name.replace("/", "."))


def _rows(name: str) -> list[str]:
    """The rows a config serves (`paper/table8:ROW`), or [""] for a config of one run."""
    return list(getattr(_module(name), "ROWS", [""]))


CASES = [(name, row) for name in EXPERIMENTS for row in _rows(name)]


def _named_settings(name: str) -> set[str]:
    """The settings a config's docstring says it changes: "Changes to the recipe (...): ..."."""
    doc = _module(name).__doc__
    found = re.search(r"Changes to the recipe[^:]*:(.*?)\.\s*$", doc, flags=re.DOTALL)
    assert found, f"{name}: the docstring names no changes"
    return set(re.findall(r"config\.([\w.]+\w)", found.group(1)))


def _differences(config) -> set[str]:
    recipe = dict(config_lib.flat_settings(config_lib.pretraining_config(config.size)))
    return {key for key, value in config_lib.flat_settings(config) if recipe.get(key) != value}


def test_the_paper_folder_holds_the_experiments_the_docs_show():
    assert EXPERIMENTS == [
        "paper/table5_ltr",
        "paper/table5_no_nsp",
        "paper/table6",
        "paper/table8",
    ]


@pytest.mark.parametrize("name, row", CASES, ids=[f"{n}:{r}" for n, r in CASES])
def test_an_experiment_passes_the_checks_and_changes_what_it_says(name, row):
    config = _module(name).get_config(*[row] if row else [])
    assert config.size in ("base", "large")
    config_checks.check_values(config, config_lib.split_phases(config))
    assert _differences(config) <= _named_settings(name)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_the_rows_together_change_exactly_the_named_settings(name):
    changed = set()
    for row in _rows(name):
        changed |= _differences(_module(name).get_config(*[row] if row else []))
    assert changed == _named_settings(name)


def test_a_rows_name_says_its_values():
    for row in _rows("paper/table6"):
        model = _module("paper/table6").get_config(row).model
        shape = (model.num_hidden_layers, model.hidden_size, model.num_attention_heads)
        assert row == "L{}_H{}_A{}".format(*shape)
        assert model.intermediate_size == 4 * model.hidden_size
    for row in _rows("paper/table8"):
        data = _module("paper/table8").get_config(row).data
        shares = (data.mask_share, data.same_share, data.random_share)
        assert row == "_".join(f"{round(100 * share)}" for share in shares)
    # The paper's own rows are the recipe itself.
    assert _differences(_module("paper/table8").get_config("80_10_10")) == set()
    assert _differences(_module("paper/table6").get_config("L24_H1024_A16")) == set()


@pytest.mark.parametrize("spec", ["paper/table8:0_20_80", "paper/table8.py:0_20_80"])
def test_a_name_with_or_without_py_is_the_packaged_file(spec, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert configs.resolve(spec) == os.path.join(configs.FOLDER, "paper", "table8.py:0_20_80")
    assert configs.resolve("paper/table5_ltr") == os.path.join(
        configs.FOLDER, "paper", "table5_ltr.py"
    )


def test_every_packaged_config_has_its_path_spelling_in_a_checkout():
    for name in configs.names():
        thin = os.path.join(REPO, "configs", *name.split("/")) + ".py"
        assert os.path.isfile(thin), f"configs/{name}.py is missing"
        with open(thin, encoding="utf-8") as f:
            assert f"from bert_jax.configs.{name.replace('/', '.')} import get_config" in f.read()


def test_the_checkouts_file_and_the_name_print_one_recipe(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    printed = []
    for spec in ("configs/paper/table6.py:L3_H768_A12", "paper/table6:L3_H768_A12"):
        assert cli.main(["pretrain", "--config", spec, "--workdir", "w", "--dry-run"]) == 0
        printed.append(capsys.readouterr().out)
    assert printed[0] == printed[1]
    assert "model.num_hidden_layers = 3\n" in printed[0]
    assert not os.path.exists(os.path.join(REPO, "w"))


def test_an_unknown_row_is_one_line_naming_the_rows(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["pretrain", "--config", "paper/table8:33_33_33", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert err.endswith(
        "unknown Table 8 row '33_33_33'; choose one of " + ", ".join(_rows("paper/table8"))
    )


def test_a_checkout_path_outside_a_checkout_names_the_packaged_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as error:
        configs.resolve("configs/paper/table5_ltr.py")
    assert str(error.value) == (
        "--config configs/paper/table5_ltr.py: no such file (it ships with bert-jax, named "
        "without a path: --config paper/table5_ltr)"
    )
    with pytest.raises(UserError, match="no such file$"):
        configs.resolve("paper/__init__")


def _documented_runs():
    """Every documented command whose --config is an experiment config (test_docs_commands
    runs one command per set of flags, so most of these only here)."""
    from tests.test_docs_commands import COMMANDS

    return [c for c in COMMANDS if _experiment(c)]


def _experiment(command) -> str:
    """The experiment config a command's --config names (`paper/table8`), or ""."""
    if "--config" not in command.argv:
        return ""
    name = command.argv[command.argv.index("--config") + 1].split(":")[0].removesuffix(".py")
    return name if name in EXPERIMENTS else ""


DOCUMENTED = _documented_runs()


@pytest.mark.parametrize("command", DOCUMENTED, ids=[c.name for c in DOCUMENTED])
def test_a_documented_experiment_dry_runs_as_written(command, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main([*command.argv, "--dry-run"]) == 0, capsys.readouterr().err
    assert os.listdir(tmp_path) == []


def test_docs_paper_runs_every_experiment():
    shown = {_experiment(c) for c in DOCUMENTED if c.page == os.path.join("docs", "paper.md")}
    assert shown == set(EXPERIMENTS)


def test_the_dry_run_says_where_the_lm_head_runs():
    """LTR puts the vocabulary projection at every position (more FLOPs per token); MLM gathers."""
    ltr = config_checks.dry_run_outline(_module("paper/table5_ltr").get_config())
    mlm = config_checks.dry_run_outline(_module("paper/table5_no_nsp").get_config())
    flops = re.compile(r"seq 128, .*?([\d.]+) GFLOP/token \(([^)]*)\)")
    (ltr_flops, ltr_head), (mlm_flops, mlm_head) = (
        flops.search(ltr).groups(),
        flops.search(mlm).groups(),
    )
    assert (
        ltr_head == "LM head at every position" and mlm_head == "MLM head at the gathered positions"
    )
    assert float(ltr_flops) > float(mlm_flops)
