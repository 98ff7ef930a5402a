"""GLUE metrics agree with scikit-learn and SciPy; the summaries reproduce the paper's averages."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats
from sklearn import metrics as sk

from bert_jax.finetune.reports.sweep_report import PAPER_ROWS
from bert_jax.finetune.tasks import glue_metrics as metrics


@pytest.mark.parametrize("seed", range(5))
def test_classification_metrics_agree_with_sklearn(seed):
    rng = np.random.default_rng(seed)
    size = int(rng.integers(20, 300))
    labels = rng.integers(0, 2, size)
    # Predictions that agree with the labels more often than chance, as a fine-tuned model's do.
    predictions = np.where(rng.random(size) < 0.7, labels, rng.integers(0, 2, size))
    assert metrics.accuracy(labels, predictions) == pytest.approx(
        sk.accuracy_score(labels, predictions), abs=1e-12
    )
    assert metrics.f1(labels, predictions) == pytest.approx(
        sk.f1_score(labels, predictions), abs=1e-12
    )
    assert metrics.matthews_corrcoef(labels, predictions) == pytest.approx(
        sk.matthews_corrcoef(labels, predictions), abs=1e-12
    )
    three_class_labels = rng.integers(0, 3, size)
    three_class_predictions = rng.integers(0, 3, size)
    assert metrics.matthews_corrcoef(three_class_labels, three_class_predictions) == pytest.approx(
        sk.matthews_corrcoef(three_class_labels, three_class_predictions), abs=1e-12
    )


@pytest.mark.parametrize("seed", range(5))
def test_correlations_agree_with_scipy(seed):
    rng = np.random.default_rng(seed)
    size = int(rng.integers(10, 300))
    gold = rng.uniform(0, 5, size)
    predicted = gold + rng.normal(0, 1.5, size)
    assert metrics.pearson(gold, predicted) == pytest.approx(
        stats.pearsonr(gold, predicted)[0], abs=1e-10
    )
    assert metrics.spearman(gold, predicted) == pytest.approx(
        stats.spearmanr(gold, predicted)[0], abs=1e-10
    )
    # STS-B gold scores have many ties (multiples of 0.2): ranks must be averaged as SciPy does.
    tied_gold = np.round(gold * 5) / 5
    tied_predicted = np.round(predicted, 1)
    np.testing.assert_allclose(metrics.average_ranks(tied_gold), stats.rankdata(tied_gold))
    assert metrics.spearman(tied_gold, tied_predicted) == pytest.approx(
        stats.spearmanr(tied_gold, tied_predicted)[0], abs=1e-10
    )


def test_degenerate_inputs_give_zero_like_sklearn():
    labels = np.array([0, 1, 1, 0])
    all_negative = np.zeros(4, int)
    assert metrics.f1(labels, all_negative) == sk.f1_score(labels, all_negative, zero_division=0)
    assert metrics.matthews_corrcoef(labels, all_negative) == sk.matthews_corrcoef(
        labels, all_negative
    )
    # A collapsed regressor (constant output) has no correlation; 0.0 keeps summaries numeric.
    assert metrics.pearson([1.0, 2.0, 3.0], [2.0, 2.0, 2.0]) == 0.0
    assert metrics.spearman([1.0, 2.0, 3.0], [2.0, 2.0, 2.0]) == 0.0


def test_task_metrics_names_and_percent():
    labels = np.array([1, 0, 1, 1])
    predictions = np.array([1, 0, 0, 1])
    assert metrics.task_metrics("MRPC", labels, predictions) == pytest.approx(
        {"f1": 100 * 0.8, "accuracy": 75.0}
    )
    assert set(metrics.task_metrics("CoLA", labels, predictions)) == {"matthews_corr"}
    sts = metrics.task_metrics("STS-B", np.array([0.0, 1.0, 4.0]), np.array([0.5, 1.5, 3.0]))
    assert set(sts) == {"pearson", "spearman"} and sts["spearman"] == pytest.approx(100.0)
    with pytest.raises(ValueError, match="differ"):
        metrics.task_metrics("RTE", labels, predictions[:2])


def test_summaries_reproduce_the_papers_averages():
    for name, row in PAPER_ROWS.items():
        columns = {column: row[column] for column in metrics.PAPER_COLUMNS}
        assert round(metrics.paper_average(columns), 1) == row["Average"], name
    assert metrics.paper_average({"CoLA": 50.0}) is None


def test_official_glue_averaging_averages_metric_pairs_and_mnli():
    split_metrics = {
        "MRPC": {"f1": 90.0, "accuracy": 86.0},
        "STS-B": {"spearman": 88.0, "pearson": 89.0},
        "MNLI-m": {"accuracy": 84.0},
        "MNLI-mm": {"accuracy": 83.0},
        "CoLA": {"matthews_corr": 55.0},
    }
    scores = metrics.glue_task_scores(split_metrics)
    assert scores == pytest.approx({"MRPC": 88.0, "STS-B": 88.5, "MNLI": 83.5, "CoLA": 55.0})
    assert metrics.glue_average(scores) is None  # not all nine tasks
    assert metrics.glue_average(scores, ("MRPC", "STS-B")) == pytest.approx(88.25)
