"""`bert-jax finetune` as `glue` behaves: a finished workdir is reused (and says so) unless
`--overwrite`, one writer per workdir (pretraining's lock), figures printed rounded and
labelled."""

from __future__ import annotations

import json
import os
import re
import socket

import pytest

from bert_jax import cli
from bert_jax.cli import finetune as finetune_cli
from bert_jax.convert.model_dir import save_model_dir
from bert_jax.finetune.runs import workdir as finetune_workdir
from bert_jax.training.workdir import LOCK_NAME
from tests.glue_fixtures.tiny import GLUE_DIR, fixture_tokenizer, tiny_encoder

SMALL = ["--epochs", "1", "--batch-size", "8", "--eval-batch-size", "8", "--max-seq-length", "32"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    config, params = tiny_encoder()
    path = tmp_path_factory.mktemp("models") / "tiny"
    return save_model_dir(path, config, params, fixture_tokenizer())


def _argv(model_dir, workdir, *extra) -> list[str]:
    argv = ["finetune", "--model", model_dir, "--task", "glue/RTE", "--data", GLUE_DIR]
    return [*argv, "--workdir", str(workdir), *SMALL, *extra]


def _run_id(workdir) -> str:
    with open(os.path.join(workdir, "result.json"), encoding="utf-8") as f:
        return json.load(f)["run_id"]


def test_a_rerun_reuses_the_finished_result_unless_overwrite(model_dir, tmp_path, capsys):
    workdir = tmp_path / "rte"
    assert cli.main(_argv(model_dir, workdir)) == 0
    out = capsys.readouterr().out
    # Progress as pretraining prints it (plain lines, no time stamps), then the summary.
    lines = out.splitlines()
    assert re.fullmatch(r"RTE step 1/1 loss \d\.\d{4} lr 2e-05 .* ETA 0m00s", lines[0]), out
    assert re.fullmatch(r"RTE step 1 dev: accuracy \d+\.\d\d", lines[1]), out
    summary = [line for line in lines if line.startswith("RTE dev: ")]
    assert re.fullmatch(rf"RTE dev: accuracy \d+\.\d\d -> {workdir}/result.json", summary[0])
    assert re.search(r"^RTE majority class on dev \('\w+' for every example\): accuracy", out, re.M)
    first = _run_id(workdir)

    assert cli.main(_argv(model_dir, workdir)) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{workdir} holds this run, finished earlier: its result is reused")
    assert "RTE dev: accuracy " in out and _run_id(workdir) == first

    assert cli.main(_argv(model_dir, workdir, "--overwrite")) == 0
    assert "reused" not in capsys.readouterr().out and _run_id(workdir) != first
    assert LOCK_NAME not in os.listdir(workdir)  # let go when the run ended


def test_a_finished_run_with_other_settings_is_refused_naming_them(model_dir, tmp_path, capsys):
    workdir = tmp_path / "rte"
    assert cli.main(_argv(model_dir, workdir)) == 0
    capsys.readouterr()
    assert cli.main(_argv(model_dir, workdir, "--learning-rate", "3e-5")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "learning_rate: saved 2e-05, now 3e-05" in err
    assert "--overwrite" in err
    argv = _argv(model_dir, workdir)
    argv[argv.index("glue/RTE")] = "glue/MRPC"
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "task: saved 'RTE', now 'glue/MRPC'" in err and "--overwrite" in err


def test_a_second_run_on_a_workdir_in_use_is_refused(model_dir, tmp_path, capsys):
    workdir = tmp_path / "rte"
    finetune_workdir.open_workdir(str(workdir), "finetune")
    holder = {"host": socket.gethostname(), "pid": os.getppid(), "started": "2026-01-01"}
    (workdir / LOCK_NAME).write_text(json.dumps(holder) + "\n")  # a live process holds it
    assert cli.main(_argv(model_dir, workdir)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is in use by another run" in err, err
    assert f"pid {os.getppid()}" in err
    assert sorted(os.listdir(workdir)) == [LOCK_NAME, finetune_workdir.MARKER]


def test_a_sweep_on_a_workdir_in_use_is_refused(model_dir, tmp_path, capsys):
    workdir = tmp_path / "sweep"
    finetune_workdir.open_workdir(str(workdir), "glue")
    holder = {"host": socket.gethostname(), "pid": os.getppid(), "started": "2026-01-01"}
    (workdir / LOCK_NAME).write_text(json.dumps(holder) + "\n")
    argv = ["glue", "--model", model_dir, "--data", GLUE_DIR, "--workdir", str(workdir)]
    assert cli.main([*argv, "--tasks", "RTE", *SMALL]) == 2
    assert "is in use by another run" in capsys.readouterr().err
    assert sorted(os.listdir(workdir)) == [LOCK_NAME, finetune_workdir.MARKER]


def test_a_failed_run_leaves_no_new_workdir(model_dir, tmp_path, capsys):
    workdir = tmp_path / "new"
    argv = _argv(model_dir, workdir)
    argv[argv.index(GLUE_DIR)] = str(tmp_path / "no-glue-here")
    assert cli.main(argv) == 2
    assert not workdir.exists()


def test_figures_are_labelled_and_rounded():
    assert finetune_cli.figures({"RTE": {"accuracy": 42.857142857142854}}, "RTE") == (
        "accuracy 42.86"
    )
    glue = {"MNLI-m": {"accuracy": 84.123}, "MNLI-mm": {"accuracy": 83.5}}
    assert finetune_cli.figures(glue, "MNLI") == "MNLI-m accuracy 84.12, MNLI-mm accuracy 83.50"
    squad = {"exact_match": 80.81, "f1": 88.456, "total": 10570, "HasAns": {"f1": 90.0}}
    assert finetune_cli.figures(squad, "squad/v1.1") == (
        "exact_match 80.81, f1 88.46, total 10570, HasAns f1 90.00"
    )
