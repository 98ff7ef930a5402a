"""What a GLUE run's scores are read against: the paper's Table 1 rows (GLUE test server), and
the trivial baseline of each dev split (`glue_metrics.constant_baseline`: the majority class;
STS-B a constant), with the warning for a run whose model predicts one thing for every example.
Read by the sweep's reports and plots (`sweep_report`, `sweep_plot`), its log and `bert-jax
finetune`'s summary.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bert_jax.finetune.tasks import glue, glue_metrics, registry


def _paper_rows() -> dict[str, dict[str, float]]:
    """Devlin et al. (2019), Table 1 (GLUE test server): each system's row, from the tasks'
    registered figures, in the table's column order, then its average."""
    rows: dict[str, dict[str, float]] = {}
    for task in registry.table_tasks():
        for system, figures in task.paper:
            rows.setdefault(system, {}).update(figures)
    for system, row in rows.items():
        row["Average"] = glue.PAPER_AVERAGES[system]
    return rows


PAPER_ROWS = _paper_rows()
METRIC_LABELS = {
    "matthews_corr": "Matthews corr.",
    "accuracy": "accuracy",
    "f1": "F1",
    "pearson": "Pearson",
    "spearman": "Spearman",
}
# What results.md and the plots call the trivial baseline (`glue_metrics.constant_baseline`).
BASELINE_LABEL = "majority class (dev; STS-B: a constant)"


def prediction_notes(record: Mapping[str, Any]) -> list[str]:
    """One line per split on which a run predicted one thing for every row: `RTE: every dev
    prediction is 'entailment' (the majority class)`, `RTE test: every prediction is
    'entailment'` (records from before the summary was kept: none)."""
    summary = record.get("prediction_summary") or {}
    baseline = record.get("dev_baseline") or {}
    notes = []
    for report_name, spread in (summary.get("dev") or {}).items():
        single = spread.get("single")
        if single is None:
            continue
        if isinstance(single, str):
            majority = (baseline.get(report_name) or {}).get("prediction")
            which = "the majority class"
            if single != majority:
                which = f"{which} is {majority!r}"
            notes.append(f"{report_name}: every dev prediction is {single!r} ({which})")
        else:
            notes.append(f"{report_name}: every dev prediction {_collapsed(spread)}")
    for split, spread in (summary.get("test") or {}).items():
        single = spread.get("single")
        if single is not None:
            shown = f"is {single!r}" if isinstance(single, str) else _collapsed(spread)
            notes.append(f"{record['task']} {split}: every prediction {shown}")
    return notes


def collapse_phrase(record: Mapping[str, Any]) -> str:
    """What a flagged run does, in words that fit its head: a classifier "predicts one class", a
    regressor (STS-B, whose flagged predictions are numbers) "predicts about one score"."""
    summary = record.get("prediction_summary") or {}
    singles = [
        spread.get("single")
        for split in ("dev", "test")
        for spread in (summary.get(split) or {}).values()
    ]
    if any(isinstance(single, str) for single in singles):
        return "predicts one class"
    return "predicts about one score"


def _collapsed(spread: Mapping[str, Any]) -> str:
    """A collapsed regressor's predictions: nearly, not exactly, one value, so they may still
    rank the pairs (and correlate) while saying nothing about the scores' scale."""
    share = f"{glue_metrics.COLLAPSED_SPREAD:.0%}"
    return (
        f"is about {spread['single']:g} (standard deviation {spread.get('std', 0.0):.2g}, under "
        f"{share} of the training scores')"
    )


def baseline_scores(best: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """The trivial baseline's paper-metric dev score, keyed like `column_scores` (tasks whose
    records predate the baseline are missing)."""
    scores = {}
    for task_name, record in best.items():
        for report_name, baseline in (record.get("dev_baseline") or {}).items():
            scores[report_name] = glue_metrics.paper_score(task_name, baseline["metrics"])
    return scores
