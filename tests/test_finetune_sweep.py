"""The GLUE sweep end to end on GLUE-format fixtures with a tiny model directory: every task, the
reports, the submission files, resuming after an interruption, and the two CLI commands."""

from __future__ import annotations

import csv
import json
import os
import shutil

import pytest

from bert_jax import cli
from bert_jax.convert.model_dir import save_model_dir
from bert_jax.finetune.runs import sweep
from bert_jax.finetune.tasks import glue as tasks
from bert_jax.finetune.tasks import glue_metrics as metrics
from bert_jax.finetune.tasks import registry
from bert_jax.finetune.tuning.settings import FinetuneSettings
from tests.glue_fixtures.tiny import GLUE_DIR, fixture_tokenizer, tiny_encoder

SMALL = FinetuneSettings(epochs=1, batch_size=8, eval_batch_size=8, max_seq_length=32)
SMALL_FLAGS = ["--epochs", "1", "--batch-size", "8", "--eval-batch-size", "8"]
SMALL_FLAGS += ["--max-seq-length", "32"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    config, params = tiny_encoder()
    path = tmp_path_factory.mktemp("models") / "tiny"
    return save_model_dir(path, config, params, fixture_tokenizer())


class Interrupted(Exception):
    """Stands in for a preemption in the middle of a sweep."""


def _results(workdir) -> dict[str, dict]:
    records = {}
    for path in workdir.glob("trials/*/*/result.json"):
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
        records[record["trial"]] = record
    return records


def _tsv_rows(path) -> list[list[str]]:
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n").split("\t") for line in f]


@pytest.mark.slow
def test_sweep_runs_every_task_writes_reports_and_resumes(model_dir, tmp_path):
    workdir = tmp_path / "glue"
    finished: list[str] = []

    def stop_after_six(record):
        finished.append(record["trial"])
        if len(finished) == 6:
            raise Interrupted

    with pytest.raises(Interrupted):
        sweep.run_sweep(
            model_dir,
            GLUE_DIR,
            str(workdir),
            learning_rates=(5e-5,),
            seeds=(0, 1),
            settings=SMALL,
            on_trial_end=stop_after_six,
        )
    first_run = _results(workdir)
    assert sorted(first_run) == sorted(finished)
    assert not (workdir / "results.json").exists()
    # Lose one finished trial: it must run again; the other five must not.
    lost = finished[0]
    os.remove(workdir / "trials" / lost.split("/")[0] / lost.split("/")[1] / "result.json")
    kept = {name: record for name, record in first_run.items() if name != lost}

    status = cli.main(
        ["glue", "--model", model_dir, "--data", GLUE_DIR, "--workdir", str(workdir)]
        + ["--learning-rates", "5e-5", "--seeds", "0", "1", *SMALL_FLAGS]
    )
    assert status == 0
    records = _results(workdir)
    assert len(records) == 9 * 1 * 2
    resumed_run = {r["run_id"] for name, r in records.items() if name not in kept}
    assert len(resumed_run) == 1 and resumed_run.isdisjoint({r["run_id"] for r in kept.values()})
    for name, record in kept.items():
        assert records[name] == record  # untouched, not redone
    assert lost in {name for name, r in records.items() if r["run_id"] in resumed_run}
    # A finished sweep run again trains nothing (and reads no weights); it rewrites the reports.
    again = sweep.run_sweep(
        model_dir, GLUE_DIR, str(workdir), learning_rates=(5e-5,), seeds=(0, 1), settings=SMALL
    )
    assert again.ran == [] and len(again.reused) == 18

    # results.json: the selected trial per task is its best on dev; summaries over all nine.
    with open(workdir / "results.json", encoding="utf-8") as f:
        results = json.load(f)
    assert set(results["tasks"]) == set(registry.sweep_order())
    for entry in results["tasks"].values():
        scores = [t["selection_score"] for t in entry["trials"]]
        assert len(scores) == 2 and entry["selected"]["selection_score"] == max(scores)
        assert {lr: len(v["seeds"]) for lr, v in entry["by_learning_rate"].items()} == {"5e-05": 2}
    summary = results["summary"]
    assert set(summary["columns"]) == {*metrics.PAPER_COLUMNS, "WNLI"}
    assert summary["paper_average"] == pytest.approx(
        sum(summary["columns"][c] for c in metrics.PAPER_COLUMNS) / 9
    )
    assert summary["glue_average"] is not None
    # The model is named with its family and shape, read from its config (no weights here).
    assert results["protocol"]["model_label"].startswith("BERT ")

    # results.csv: one row per trial and dev evaluation (MNLI has two).
    with open(workdir / "results.csv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 18 + 2
    assert {row["eval"] for row in rows if row["task"] == "MNLI"} == {"MNLI-m", "MNLI-mm"}
    assert all(row["f1"] and row["accuracy"] for row in rows if row["task"] in ("QQP", "MRPC"))

    # results.md: the paper's Table 1 layout with its two rows beside ours.
    table = (workdir / "results.md").read_text(encoding="utf-8")
    assert table.startswith(f"# GLUE results: {results['protocol']['model']} (BERT ")
    assert "| System | MNLI-m/mm | QQP | QNLI | SST-2 | CoLA | STS-B | MRPC | RTE | Average |" in (
        table
    )
    assert "| BERT-Base (paper, test) | 84.6/83.4 | 71.2 | 90.5 | 93.5 | 52.1 | 85.8 | 88.9 |" in (
        table
    )
    assert "| BERT-Large (paper, test) | 86.7/85.9 |" in table
    assert "| Ours (dev, selected trial) |" in table and "mean of 2 seeds" in table

    for task_name in registry.sweep_order():
        with open(workdir / "plots" / f"{task_name}.png", "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"

    # Submission: the selected trial's test predictions in the GLUE server's format.
    submission = workdir / "submission"
    expected_files = {
        "CoLA.tsv": ("CoLA", "test"),
        "SST-2.tsv": ("SST-2", "test"),
        "MRPC.tsv": ("MRPC", "test"),
        "QQP.tsv": ("QQP", "test"),
        "STS-B.tsv": ("STS-B", "test"),
        "MNLI-m.tsv": ("MNLI", "test_matched"),
        "MNLI-mm.tsv": ("MNLI", "test_mismatched"),
        "AX.tsv": ("MNLI", "diagnostic"),
        "QNLI.tsv": ("QNLI", "test"),
        "RTE.tsv": ("RTE", "test"),
        "WNLI.tsv": ("WNLI", "test"),
    }
    assert set(os.listdir(submission)) == set(expected_files)
    for name, (task_name, split) in expected_files.items():
        spec = tasks.get_task(task_name)
        rows = _tsv_rows(submission / name)
        test_rows = tasks.read_split(GLUE_DIR, spec, split)
        assert rows[0] == ["index", "prediction"]
        assert [row[0] for row in rows[1:]] == [e.guid for e in test_rows]
        for _, prediction in rows[1:]:
            if spec.is_regression:
                assert 0.0 <= float(prediction) <= 5.0
            else:
                assert prediction in spec.labels
        selected = results["tasks"][task_name]["selected"]["trial"]
        source = workdir / "trials" / selected.split("/")[0] / selected.split("/")[1] / name
        assert (submission / name).read_bytes() == source.read_bytes()


def test_finetune_command_runs_one_setting(model_dir, tmp_path, capsys):
    workdir = tmp_path / "rte"
    status = cli.main(
        ["finetune", "--model", model_dir, "--task", "glue/RTE", "--data", GLUE_DIR]
        + ["--workdir", str(workdir), "--learning-rate", "3e-5", "--seed", "2", *SMALL_FLAGS]
    )
    assert status == 0
    with open(workdir / "result.json", encoding="utf-8") as f:
        record = json.load(f)
    assert (record["task"], record["learning_rate"], record["seed"]) == ("RTE", 3e-5, 2)
    assert record["settings"]["epochs"] == 1 and record["num_train_steps"] == 1
    assert set(record["dev_metrics"]["RTE"]) == {"accuracy"}
    rows = _tsv_rows(workdir / "RTE.tsv")
    assert rows[0] == ["index", "prediction"] and len(rows) == 3
    assert all(row[1] in ("entailment", "not_entailment") for row in rows[1:])
    assert "RTE dev:" in capsys.readouterr().out


def test_commands_report_bad_data_with_file_and_line(model_dir, tmp_path, capsys):
    data = tmp_path / "glue"
    shutil.copytree(GLUE_DIR, data, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    path = data / "WNLI" / "dev.tsv"
    lines = path.read_text(encoding="utf-8").split("\n")
    lines[2] = lines[2].rsplit("\t", 1)[0] + "\t2"
    path.write_text("\n".join(lines), encoding="utf-8")
    args = ["--model", model_dir, "--data", str(data), "--workdir", str(tmp_path / "out")]
    assert cli.main(["glue", *args, "--tasks", "WNLI", *SMALL_FLAGS]) == 2
    error = capsys.readouterr().err
    assert "bert-jax glue: error:" in error and "WNLI/dev.tsv:3: label '2'" in error
    os.remove(data / "CoLA" / "train.tsv")
    assert cli.main(["finetune", *args, "--task", "glue/cola"]) == 2
    assert "CoLA/train.tsv" in capsys.readouterr().err


def test_finished_trial_with_other_settings_is_refused(tmp_path):
    trial = sweep.trials_for(["MRPC"], [2e-5], [0])[0]
    directory = trial.directory(str(tmp_path))
    os.makedirs(directory)
    sweep.write_json_atomic(
        os.path.join(directory, sweep.RESULT_NAME),
        {"settings": FinetuneSettings(epochs=3).to_dict(), "model": "/models/base"},
    )
    assert sweep.load_finished(trial, str(tmp_path), FinetuneSettings(), "/models/base")
    with pytest.raises(ValueError, match=r"result\.json is a finished trial .*epochs: saved 3"):
        sweep.load_finished(trial, str(tmp_path), FinetuneSettings(epochs=2), "/models/base")
    with pytest.raises(ValueError, match="model: saved '/models/base'"):
        sweep.load_finished(trial, str(tmp_path), FinetuneSettings(), "/models/large")
    other = sweep.trials_for(["MRPC"], [3e-5], [0])[0]
    assert sweep.load_finished(other, str(tmp_path), FinetuneSettings(), "/models/base") is None


def test_sweep_options_defaults_config_files_and_flags(tmp_path):
    options = sweep.sweep_options()
    assert options["learning_rates"] == (5e-5, 4e-5, 3e-5, 2e-5)
    assert options["tasks"] == registry.sweep_order() and options["seeds"] == (0,)
    assert (options["settings"].batch_size, options["settings"].epochs) == (32, 3.0)
    config = tmp_path / "small_tasks.py"
    config.write_text(
        "def get_config():\n"
        "    return {'tasks': ['RTE', 'MRPC'], 'seeds': [0, 1, 2], 'epochs': 4}\n",
        encoding="utf-8",
    )
    options = sweep.sweep_options(str(config), {"epochs": 2.0, "seeds": None})
    assert options["tasks"] == ("RTE", "MRPC") and options["seeds"] == (0, 1, 2)
    assert options["settings"].epochs == 2.0  # the flag wins over the file
    config = tmp_path / "typo.json"
    config.write_text(json.dumps({"learning_rate_list": [1e-5]}), encoding="utf-8")
    with pytest.raises(ValueError, match=r"unknown sweep option\(s\) \['learning_rate_list'\]"):
        sweep.sweep_options(str(config))
    with pytest.raises(ValueError, match="listed twice"):
        sweep.trials_for(["rte", "RTE"], [2e-5], [0])


def test_best_on_dev_prefers_the_earlier_trial_on_ties():
    records = [
        {"task": "RTE", "trial": "RTE/a", "selection_score": 60.0},
        {"task": "RTE", "trial": "RTE/b", "selection_score": 70.0},
        {"task": "RTE", "trial": "RTE/c", "selection_score": 70.0},
        {"task": "CoLA", "trial": "CoLA/a", "selection_score": -5.0},
    ]
    selected = sweep.select_trials(records)
    assert selected["RTE"]["trial"] == "RTE/b" and selected["CoLA"]["trial"] == "CoLA/a"
