"""GLUE metrics as the benchmark defines them, and the two ways to summarise a run.

Per task, the metrics it registers (`Task.metrics`, read through the registry): CoLA Matthews
correlation; STS-B Pearson and Spearman correlation; MRPC and QQP F1 (of the positive class,
label "1") and accuracy; accuracy elsewhere. Scores are reported in percent, as GLUE and the
paper do.

Summaries:
- `paper_score` / `paper_average`: the paper's Table 1 — F1 for QQP and MRPC, Spearman for STS-B,
  Matthews for CoLA, accuracy elsewhere; MNLI-m and MNLI-mm are two columns; WNLI is excluded.
- `glue_score` / `glue_average`: the official GLUE macro-average — a task with two metrics scores
  their mean (MRPC, QQP: F1 and accuracy; STS-B: Pearson and Spearman), MNLI scores the mean of
  matched and mismatched accuracy, and WNLI counts.

The trivial baseline beside every score (`constant_baseline`: the dev split's majority class;
for regression the train mean, which correlates 0) and how a run's predictions spread
(`prediction_summary`, which names the one class a degenerate model predicts).

Plain NumPy (no SciPy or scikit-learn at run time); the tests check agreement with both.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from bert_jax.finetune.tasks import registry
from bert_jax.finetune.tasks.glue import BENCHMARK, SentenceTask
from bert_jax.finetune.tasks.task import Task


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
    if np.ptp(x) == 0 or np.ptp(y) == 0:  # a constant's deviations from its mean would be
        return 0.0  # rounding noise, not zero
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
# Per-task metrics (each task's names are its registered `Task.metrics`, the paper's first)
# ------------------------------------------------------------------------------------------------

FUNCTIONS = {
    "matthews_corr": matthews_corrcoef,
    "accuracy": accuracy,
    "f1": f1,
    "pearson": pearson,
    "spearman": spearman,
}


def _task(task: str | Task) -> Task:
    return registry.get(task) if isinstance(task, str) else task


def task_metrics(task: str | Task, labels: np.ndarray, predictions: np.ndarray) -> dict[str, float]:
    """The task's metrics in percent. Classification takes label indices; regression scores."""
    names = _task(task).metrics
    labels, predictions = np.asarray(labels), np.asarray(predictions)
    if labels.shape != predictions.shape:
        raise ValueError(f"labels {labels.shape} and predictions {predictions.shape} differ")
    return {name: 100.0 * FUNCTIONS[name](labels, predictions) for name in names}


def paper_metric(task: str | Task) -> str:
    """The metric the paper reports for a task (Table 1's for GLUE's)."""
    return _task(task).paper_metric


def paper_score(task: str | Task, metrics: Mapping[str, float]) -> float:
    return float(metrics[paper_metric(task)])


def glue_score(task: str | Task, metrics: Mapping[str, float]) -> float:
    """The official GLUE per-task score: the mean of the task's metrics."""
    return float(np.mean([metrics[name] for name in _task(task).metrics]))


def __getattr__(name: str):
    """`PAPER_COLUMNS` (Table 1's columns, e.g. `MNLI-m`, in its order) and `GLUE_TASKS` (the
    official average's tasks), read from the registry when first asked for."""
    if name == "PAPER_COLUMNS":
        return tuple(column for task in registry.table_tasks() for column in task.report_columns)
    if name == "GLUE_TASKS":
        return tuple(task.name for task in registry.benchmark_tasks(BENCHMARK))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def paper_average(column_scores: Mapping[str, float]) -> float | None:
    """Mean of the Table 1 columns (WNLI is not one); None unless every column is present."""
    values = [column_scores.get(column) for column in __getattr__("PAPER_COLUMNS")]
    if any(v is None for v in values):
        return None
    return float(np.mean(values))


def _task_of_report(report_name: str) -> SentenceTask | None:
    """The sentence task whose dev split is reported as `report_name` (`MNLI-m`: MNLI)."""
    for task in registry.all_tasks():
        if report_name in getattr(task, "dev_splits", {}).values():
            return task  # type: ignore[return-value]
    return None


def glue_task_scores(
    split_metrics: Mapping[str, Mapping[str, float]],
) -> dict[str, float]:
    """Official per-task scores from metrics keyed by report name (`MNLI-m`, `MNLI-mm`, `CoLA`…).

    A task of several dev splits (MNLI) scores the mean of their scores, when all are present.
    """
    scores: dict[str, float] = {}
    single = []
    for name in split_metrics:
        task = _task_of_report(name)
        if task is None or len(task.dev_splits) == 1:
            single.append(name)
        elif task.name not in scores:
            reports = list(task.dev_splits.values())
            if all(report in split_metrics for report in reports):
                values = [glue_score(task, split_metrics[report]) for report in reports]
                scores[task.name] = float(np.mean(values))
    for name in single:
        scores[name] = glue_score(name, split_metrics[name])
    return scores


def glue_average(
    task_scores: Mapping[str, float], tasks: Sequence[str] | None = None
) -> float | None:
    """The GLUE macro-average over `tasks` (default: the nine); None unless each has a score."""
    names = __getattr__("GLUE_TASKS") if tasks is None else tasks
    values = [task_scores.get(task) for task in names]
    if any(v is None for v in values):
        return None
    return float(np.mean(values))


# ------------------------------------------------------------------------------------------------
# The trivial baseline, and a model that predicts one thing
# ------------------------------------------------------------------------------------------------

# A regressor "predicts one thing" when its predictions spread less than this share of the
# training labels' standard deviation (a collapsed regressor's outputs are never exactly equal).
COLLAPSED_SPREAD = 0.01


def constant_baseline(
    task: SentenceTask, labels: np.ndarray, train_labels: np.ndarray | None = None
) -> dict[str, object]:
    """What predicting one thing for every row scores on `labels` (a dev split): for
    classification the majority class of `labels` (ties: the first label); for regression the
    mean of `train_labels` (of `labels` without them), whose correlations are 0 (undefined for a
    constant, as `pearson` says). `{"prediction": label string or score, "metrics": {...}}`."""
    labels = np.asarray(labels)
    if task.is_regression:
        value = float(np.mean(labels if train_labels is None else train_labels))
        constant = np.full(labels.shape, value)
        prediction: object = round(value, 4)
    else:
        assert task.labels is not None
        counts = np.bincount(labels.astype(np.int64), minlength=len(task.labels))
        majority = int(np.argmax(counts))
        constant = np.full(labels.shape, majority)
        prediction = task.labels[majority]
    return {"prediction": prediction, "metrics": task_metrics(task, labels, constant)}


def prediction_summary(
    task: SentenceTask, predictions: np.ndarray, train_labels: np.ndarray | None = None
) -> dict[str, object]:
    """How a split's predictions spread. Classification: `counts` per label and `single`, the
    one label every row got (None when there are several). Regression: `mean`, `std` and
    `single`, their mean rounded when they spread less than `COLLAPSED_SPREAD` of the training
    labels' standard deviation (None otherwise, and without `train_labels`)."""
    predictions = np.asarray(predictions)
    if task.is_regression:
        spread = float(np.std(predictions)) if predictions.size else 0.0
        scale = None if train_labels is None else float(np.std(train_labels))
        collapsed = scale is not None and predictions.size > 1 and spread < COLLAPSED_SPREAD * scale
        mean = float(np.mean(predictions)) if predictions.size else 0.0
        return {"mean": mean, "std": spread, "single": round(mean, 4) if collapsed else None}
    assert task.labels is not None
    return class_summary(predictions, task.labels)


def class_summary(predictions: np.ndarray, names: Sequence[str]) -> dict[str, object]:
    """Class predictions (indices into `names`) counted by name, and `single`: the one class
    every row got (None when there are several, or fewer than two rows)."""
    predictions = np.asarray(predictions).astype(np.int64)
    counts = np.bincount(predictions, minlength=len(names))
    used = np.flatnonzero(counts)
    return {
        "counts": {name: int(count) for name, count in zip(names, counts)},
        "single": names[int(used[0])] if used.size == 1 and predictions.size > 1 else None,
    }
