"""GLUE metrics as the benchmark defines them, and the two ways to summarise a run.

Per task: CoLA Matthews correlation; STS-B Pearson and Spearman correlation; MRPC and QQP F1 (of
the positive class, label "1") and accuracy; accuracy elsewhere. Scores are reported in percent,
as GLUE and the paper do.

Summaries:
- `paper_score` / `paper_average`: the paper's Table 1 — F1 for QQP and MRPC, Spearman for STS-B,
  Matthews for CoLA, accuracy elsewhere; MNLI-m and MNLI-mm are two columns; WNLI is excluded.
- `glue_score` / `glue_average`: the official GLUE macro-average — a task with two metrics scores
  their mean (MRPC, QQP: F1 and accuracy; STS-B: Pearson and Spearman), MNLI scores the mean of
  matched and mismatched accuracy, and WNLI counts.

Plain NumPy (no SciPy or scikit-learn at run time); the tests check agreement with both.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np


def accuracy(labels: np.ndarray, predictions: np.ndarray) -> float:
    labels, predictions = np.asarray(labels), np.asarray(predictions)
    if labels.size == 0:
        raise ValueError("accuracy of zero examples")
    return float(np.mean(labels == predictions))


def f1(labels: np.ndarray, predictions: np.ndarray, positive: int = 1) -> float:
    """Binary F1 of the `positive` class; 0.0 when there are no true positives."""
    truth, guess = np.asarray(labels) == positive, np.asarray(predictions) == positive
    true_positive = float(np.sum(truth & guess))
    denominator = float(np.sum(truth) + np.sum(guess))
    return 0.0 if true_positive == 0 else 2.0 * true_positive / denominator


def matthews_corrcoef(labels: np.ndarray, predictions: np.ndarray) -> float:
    """Matthews correlation from the confusion matrix (multi-class form); 0.0 when undefined."""
    labels, predictions = np.asarray(labels), np.asarray(predictions)
    classes = np.union1d(labels, predictions)
    label_index = np.searchsorted(classes, labels)
    prediction_index = np.searchsorted(classes, predictions)
    confusion = np.zeros((classes.size, classes.size), np.float64)
    np.add.at(confusion, (label_index, prediction_index), 1.0)
    samples = confusion.sum()
    correct = np.trace(confusion)
    true_totals, predicted_totals = confusion.sum(axis=1), confusion.sum(axis=0)
    covariance = correct * samples - np.dot(true_totals, predicted_totals)
    true_spread = samples**2 - np.dot(true_totals, true_totals)
    predicted_spread = samples**2 - np.dot(predicted_totals, predicted_totals)
    if true_spread == 0 or predicted_spread == 0:
        return 0.0
    return float(covariance / math.sqrt(true_spread * predicted_spread))


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson correlation; 0.0 when undefined (a constant input, e.g. a collapsed regressor),
    as `matthews_corrcoef` does, so that summaries and selection stay numbers (SciPy: NaN)."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    x, y = x - x.mean(), y - y.mean()
    denominator = math.sqrt(float(np.dot(x, x)) * float(np.dot(y, y)))
    return 0.0 if denominator == 0 else float(np.dot(x, y) / denominator)


def average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties sharing the mean of their ranks (SciPy's `rankdata(method='average')`)."""
    values = np.asarray(values)
    order = np.argsort(values, kind="mergesort")
    sorted_values = values[order]
    # Start of each run of equal values, in sorted order.
    starts = np.concatenate([[True], sorted_values[1:] != sorted_values[:-1]])
    run_id = np.cumsum(starts) - 1
    run_starts = np.flatnonzero(starts)
    run_ends = np.concatenate([run_starts[1:], [values.size]])
    mean_rank = (run_starts + run_ends + 1) / 2.0  # mean of ranks start+1 .. end
    ranks = np.empty(values.size, np.float64)
    ranks[order] = mean_rank[run_id]
    return ranks


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    return pearson(average_ranks(x), average_ranks(y))


# ------------------------------------------------------------------------------------------------
# Per-task metrics
# ------------------------------------------------------------------------------------------------

# Name of each task's metrics, in the order they are reported; the first is the paper's.
TASK_METRICS: dict[str, tuple[str, ...]] = {
    "CoLA": ("matthews_corr",),
    "SST-2": ("accuracy",),
    "MRPC": ("f1", "accuracy"),
    "QQP": ("f1", "accuracy"),
    "STS-B": ("spearman", "pearson"),
    "MNLI": ("accuracy",),
    "QNLI": ("accuracy",),
    "RTE": ("accuracy",),
    "WNLI": ("accuracy",),
}


def task_metrics(task_name: str, labels: np.ndarray, predictions: np.ndarray) -> dict[str, float]:
    """The task's GLUE metrics in percent. Classification takes label indices; STS-B scores."""
    if task_name not in TASK_METRICS:
        raise ValueError(f"no metrics for task {task_name!r}")
    labels, predictions = np.asarray(labels), np.asarray(predictions)
    if labels.shape != predictions.shape:
        raise ValueError(f"labels {labels.shape} and predictions {predictions.shape} differ")
    functions = {
        "matthews_corr": matthews_corrcoef,
        "accuracy": accuracy,
        "f1": f1,
        "pearson": pearson,
        "spearman": spearman,
    }
    return {name: 100.0 * functions[name](labels, predictions) for name in TASK_METRICS[task_name]}


def paper_metric(task_name: str) -> str:
    """The metric the paper's Table 1 reports for a task."""
    return TASK_METRICS[task_name][0]


def paper_score(task_name: str, metrics: Mapping[str, float]) -> float:
    return float(metrics[paper_metric(task_name)])


def glue_score(task_name: str, metrics: Mapping[str, float]) -> float:
    """The official GLUE per-task score: the mean of the task's metrics."""
    return float(np.mean([metrics[name] for name in TASK_METRICS[task_name]]))


# Report columns of the paper's Table 1, each with its task and evaluation split's report name.
PAPER_COLUMNS: tuple[str, ...] = (
    "MNLI-m",
    "MNLI-mm",
    "QQP",
    "QNLI",
    "SST-2",
    "CoLA",
    "STS-B",
    "MRPC",
    "RTE",
)


def column_task(column: str) -> str:
    return "MNLI" if column.startswith("MNLI") else column


def paper_average(column_scores: Mapping[str, float]) -> float | None:
    """Mean of the nine Table 1 columns (WNLI excluded); None unless all nine are present."""
    values = [column_scores.get(column) for column in PAPER_COLUMNS]
    if any(v is None for v in values):
        return None
    return float(np.mean(values))


def glue_task_scores(
    split_metrics: Mapping[str, Mapping[str, float]],
) -> dict[str, float]:
    """Official per-task scores from metrics keyed by report name (`MNLI-m`, `MNLI-mm`, `CoLA`…).

    MNLI's score is the mean of its matched and mismatched scores.
    """
    scores: dict[str, float] = {}
    mnli = [split_metrics[k] for k in ("MNLI-m", "MNLI-mm") if k in split_metrics]
    if len(mnli) == 2:
        scores["MNLI"] = float(np.mean([glue_score("MNLI", m) for m in mnli]))
    for name, metrics in split_metrics.items():
        if not name.startswith("MNLI"):
            scores[name] = glue_score(name, metrics)
    return scores


GLUE_TASKS: tuple[str, ...] = (
    "CoLA",
    "SST-2",
    "MRPC",
    "STS-B",
    "QQP",
    "MNLI",
    "QNLI",
    "RTE",
    "WNLI",
)


def glue_average(
    task_scores: Mapping[str, float], tasks: Sequence[str] = GLUE_TASKS
) -> float | None:
    """The GLUE macro-average over `tasks`; None unless every one of them has a score."""
    values = [task_scores.get(task) for task in tasks]
    if any(v is None for v in values):
        return None
    return float(np.mean(values))
