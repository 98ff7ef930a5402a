"""A sweep's trials grouped by task and learning rate: what every report of a sweep reads (the
seed spread of results.json and results.md, Table 1's mean at the selected rate, the per-task
plot), so that "the trials at one learning rate" and "their score" are said once.

A trial here is a record of the sweep (`runs/sweep.py`): its `task`, `learning_rate`, `seed`,
`selection_score` and `dev_metrics` (report name -> metrics). Its score on a dev evaluation is the
paper's metric for its task (`glue_metrics.paper_score`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from bert_jax.finetune.tasks import glue_metrics


@dataclasses.dataclass(frozen=True)
class LearningRateGroup:
    """The trials of one task at one learning rate (a seed each), in sweep order."""

    task: str
    learning_rate: float
    trials: tuple[Mapping[str, Any], ...]

    @property
    def seeds(self) -> list[int]:
        return [trial["seed"] for trial in self.trials]

    @property
    def selection_scores(self) -> list[float]:
        return [trial["selection_score"] for trial in self.trials]

    @property
    def report_names(self) -> list[str]:
        """The dev evaluations the trials report (MNLI-m and MNLI-mm for MNLI), in order."""
        return list(dict.fromkeys(name for t in self.trials for name in t["dev_metrics"]))

    def scores(self, report_name: str) -> list[float]:
        """Each trial's paper-metric score on the dev evaluation `report_name`."""
        return [
            glue_metrics.paper_score(self.task, trial["dev_metrics"][report_name])
            for trial in self.trials
            if report_name in trial["dev_metrics"]
        ]

    def spread(self) -> dict[str, float]:
        """Mean, sample standard deviation (0 for one seed), min and max of the selection
        scores."""
        values = np.asarray(self.selection_scores, np.float64)
        return {
            "mean": float(values.mean()),
            "std": float(values.std(ddof=1)) if values.size > 1 else 0.0,
            "min": float(values.min()),
            "max": float(values.max()),
        }


def by_learning_rate(
    records: Sequence[Mapping[str, Any]],
) -> dict[str, dict[float, LearningRateGroup]]:
    """task -> learning rate -> its trials, tasks and rates in the order the sweep ran them."""
    grouped: dict[str, dict[float, list[Mapping[str, Any]]]] = {}
    for record in records:
        grouped.setdefault(record["task"], {}).setdefault(record["learning_rate"], []).append(
            record
        )
    return {
        task: {lr: LearningRateGroup(task, lr, tuple(trials)) for lr, trials in rates.items()}
        for task, rates in grouped.items()
    }
