"""The trivial baseline beside every GLUE dev score, and a model that predicts one class flagged:
the baseline's figures against scikit-learn and SciPy, and a degenerate model (one class for
every example) run through `bert-jax glue` and `bert-jax finetune`, flagged in results.md,
results.json, results.csv, the plots and the printed summary."""

from __future__ import annotations

import csv
import functools
import json

import numpy as np
import pytest
from scipy import stats
from sklearn import metrics as sk

from bert_jax import cli
from bert_jax.convert.model_dir import save_model_dir
from bert_jax.finetune.reports import references
from bert_jax.finetune.tasks import glue
from bert_jax.finetune.tasks import glue_metrics as metrics
from bert_jax.finetune.tuning import sentence_tuning as loop
from tests.glue_fixtures.tiny import GLUE_DIR, fixture_tokenizer, tiny_encoder

SMALL = ["--epochs", "1", "--batch-size", "8", "--eval-batch-size", "8", "--max-seq-length", "32"]


@pytest.mark.parametrize("seed", range(3))
def test_the_majority_class_baseline_agrees_with_sklearn(seed):
    rng = np.random.default_rng(seed)
    size = int(rng.integers(20, 200))
    for name in ("RTE", "MRPC", "QQP", "CoLA", "MNLI"):
        task = glue.get_task(name)
        share = rng.uniform(0.2, 0.8)  # the majority is either class, in turn
        labels = (rng.random(size) < share).astype(np.int32)
        if len(task.labels) == 3:
            labels = rng.choice(3, size, p=[0.2, 0.5, 0.3]).astype(np.int32)
        baseline = metrics.constant_baseline(task, labels)
        majority = int(np.bincount(labels).argmax())
        assert baseline["prediction"] == task.labels[majority]
        constant = np.full(size, majority)
        figures = baseline["metrics"]
        expected = {
            "accuracy": sk.accuracy_score,
            "f1": functools.partial(sk.f1_score, zero_division=0.0),
            "matthews_corr": sk.matthews_corrcoef,
        }
        for metric, value in figures.items():
            reference = 100 * expected[metric](labels, constant)
            assert value == pytest.approx(reference, abs=1e-9), (name, metric)
        if name == "CoLA":
            assert figures["matthews_corr"] == 0.0  # a constant correlates with nothing
        if name == "MRPC" and majority == 1:  # always "paraphrase": F1 = 2p / (1 + p)
            p = float(np.mean(labels))
            assert figures["f1"] == pytest.approx(100 * 2 * p / (1 + p))


def test_the_regression_baseline_predicts_the_train_mean_and_correlates_zero():
    task = glue.get_task("STS-B")
    rng = np.random.default_rng(0)
    dev, train = rng.uniform(0, 5, 50), rng.uniform(0, 5, 200)
    baseline = metrics.constant_baseline(task, dev, train)
    assert baseline["prediction"] == pytest.approx(float(np.mean(train)), abs=1e-4)
    assert baseline["metrics"] == {"pearson": 0.0, "spearman": 0.0}
    # SciPy leaves a constant's correlation undefined (NaN); GLUE's summaries need a number.
    with pytest.warns(stats.ConstantInputWarning):
        assert np.isnan(stats.pearsonr(dev, np.full(50, np.mean(train)))[0])


def test_a_split_predicted_as_one_thing_is_named():
    rte, stsb = glue.get_task("RTE"), glue.get_task("STS-B")
    one = metrics.prediction_summary(rte, np.zeros(9, np.int64))
    assert one == {"counts": {"entailment": 9, "not_entailment": 0}, "single": "entailment"}
    assert metrics.prediction_summary(rte, np.array([0, 1, 0]))["single"] is None
    train = np.linspace(0, 5, 40)
    collapsed = metrics.prediction_summary(stsb, 2.5 + 1e-4 * np.arange(10), train)
    assert collapsed["single"] == pytest.approx(2.5005, abs=1e-3)
    assert metrics.prediction_summary(stsb, np.linspace(1, 4, 10), train)["single"] is None
    record = {
        "task": "RTE",
        "dev_baseline": {"RTE": {"prediction": "not_entailment", "metrics": {"accuracy": 60.0}}},
        "prediction_summary": {"dev": {"RTE": one}, "test": {"test": one}},
    }
    assert references.prediction_notes(record) == [
        "RTE: every dev prediction is 'entailment' (the majority class is 'not_entailment')",
        "RTE test: every prediction is 'entailment'",
    ]
    record["dev_baseline"]["RTE"]["prediction"] = "entailment"
    assert references.prediction_notes(record)[0] == (
        "RTE: every dev prediction is 'entailment' (the majority class)"
    )
    assert references.prediction_notes({"task": "RTE"}) == []  # a record from before


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    config, params = tiny_encoder()
    path = tmp_path_factory.mktemp("models") / "tiny"
    return save_model_dir(path, config, params, fixture_tokenizer())


@pytest.fixture
def degenerate(monkeypatch):
    """A model whose outputs are the same for every example: class 0 ('entailment' for RTE)
    wins every row, and a regressor gives every pair 2.0."""

    def constant_outputs(tuner, params, split, eval_batch_size, buckets=None):
        outputs = np.zeros((len(split), tuner.num_labels), np.float32)
        outputs[:, 0] = 2.0
        return outputs

    monkeypatch.setattr(loop, "predict_split", constant_outputs)


def _majority(task_name: str, split: str = "dev") -> str:
    task = glue.get_task(task_name)
    labels = [example.label for example in glue.read_split(GLUE_DIR, task, split)]
    return max(task.labels, key=labels.count)


def test_a_degenerate_model_is_flagged_in_every_report(model_dir, tmp_path, capsys, degenerate):
    workdir = tmp_path / "glue"
    argv = ["glue", "--model", model_dir, "--data", GLUE_DIR, "--workdir", str(workdir)]
    assert cli.main([*argv, "--tasks", "RTE", "STS-B", "--learning-rates", "5e-5", *SMALL]) == 0
    out = capsys.readouterr().out
    majority = _majority("RTE")
    which = "the majority class" + ("" if majority == "entailment" else f" is {majority!r}")
    note = f"RTE: every dev prediction is 'entailment' ({which})"
    # The printed summary: the selected trial of each task, and how many trials.
    assert f"RTE: the selected trial (RTE/lr=5e-05_seed=0) predicts one class: {note}" in out
    assert "STS-B: every dev prediction is about 2 (standard deviation 0, under 1% of the" in out
    # A regressor is not said to predict a class.
    assert "STS-B: the selected trial (STS-B/lr=5e-05_seed=0) predicts about one score: " in out
    assert "(STS-B/lr=5e-05_seed=0) predicts one class" not in out
    assert "2 of 2 trials predict a single class on dev or test" in out

    results = json.loads((workdir / "results.json").read_text(encoding="utf-8"))
    rte = results["tasks"]["RTE"]
    assert rte["baseline"]["RTE"]["prediction"] == majority
    share = [e.label for e in glue.read_split(GLUE_DIR, glue.get_task("RTE"), "dev")]
    accuracy = 100 * share.count(majority) / len(share)
    assert rte["baseline"]["RTE"]["metrics"]["accuracy"] == pytest.approx(accuracy)
    assert results["summary"]["baseline_columns"]["RTE"] == pytest.approx(accuracy)
    assert results["summary"]["baseline_columns"]["STS-B"] == 0.0
    assert note in rte["trials"][0]["single_prediction"]
    assert rte["trials"][0]["prediction_summary"]["dev"]["RTE"]["single"] == "entailment"
    assert (
        "RTE test: every prediction is 'entailment'"
        in results["summary"]["single_prediction"]["RTE/lr=5e-05_seed=0"]
    )
    if majority == "entailment":  # the degenerate model scores exactly the baseline
        assert rte["selected"]["selection_score"] == pytest.approx(accuracy)

    table = (workdir / "results.md").read_text(encoding="utf-8")
    assert "| Majority class (dev; STS-B: a constant) |" in table
    assert "## Trials that predict a single class" in table
    assert f"- **RTE/lr=5e-05_seed=0** (selected): {note}" in table
    assert "| RTE | accuracy " in table and f"'{majority}': accuracy {accuracy:.1f}" in table

    with open(workdir / "results.csv", encoding="utf-8") as f:
        rows = {row["task"]: row for row in csv.DictReader(f)}
    assert float(rows["RTE"]["baseline_paper_score"]) == pytest.approx(accuracy, abs=1e-4)
    assert rows["RTE"]["single_dev_prediction"] == "entailment"
    assert float(rows["STS-B"]["baseline_paper_score"]) == 0.0
    for name in ("RTE", "STS-B"):
        assert (workdir / "plots" / f"{name}.png").read_bytes()[:4] == b"\x89PNG"


def test_the_finetune_summary_shows_the_baseline_and_the_warning(
    model_dir, tmp_path, capsys, degenerate
):
    argv = ["finetune", "--model", model_dir, "--task", "glue/RTE", "--data", GLUE_DIR]
    assert cli.main([*argv, "--workdir", str(tmp_path / "rte"), *SMALL]) == 0
    lines = capsys.readouterr().out.splitlines()
    majority = _majority("RTE")
    assert any(
        line.startswith(f"RTE majority class on dev ('{majority}' for every example): accuracy ")
        for line in lines
    ), lines
    assert lines[-2].startswith("warning: RTE: every dev prediction is 'entailment'")
    assert lines[-1] == "warning: RTE test: every prediction is 'entailment'"
    record = json.loads((tmp_path / "rte" / "result.json").read_text(encoding="utf-8"))
    assert record["dev_baseline"]["RTE"]["prediction"] == majority


def test_a_swag_run_that_picks_one_ending_is_flagged_in_its_report():
    from bert_jax.finetune.reports import run_report

    one = metrics.class_summary(np.full(20, 2), ("ending0", "ending1", "ending2", "ending3"))
    result = {
        "task": "swag",
        "dev_metrics": {"accuracy": 30.0},
        "dev_baseline": {"swag": {"prediction": "ending2", "metrics": {"accuracy": 30.0}}},
        "prediction_summary": {"dev": {"swag": one}},
    }
    report = run_report.results_markdown(result)
    assert "| this run | 30.0 |" in report
    assert "| majority class (dev: ending2 for every example) | 30.0 |" in report
    assert "every dev prediction is 'ending2' (the majority class)" in report
    assert "**This model predicts one class**, whatever its score" in report
    stsb = {"prediction_summary": {"dev": {"STS-B": {"mean": 2.5, "std": 0.001, "single": 2.5}}}}
    assert references.collapse_phrase(stsb) == "predicts about one score"
