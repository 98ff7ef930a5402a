"""A sweep's plot of one task (`plots/<TASK>.png`): the dev score against the learning rate,
one point per seed, the mean as a line and the min-max range shaded, the selected trial starred,
the majority-class baseline and the paper's test scores as lines.

matplotlib is imported lazily, with the Agg canvas (no display needed).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from bert_jax.finetune.reports.references import BASELINE_LABEL, METRIC_LABELS, PAPER_ROWS
from bert_jax.finetune.reports.trial_groups import by_learning_rate
from bert_jax.finetune.tasks import glue_metrics
from bert_jax.runtime import outputs


def plot_task(
    path: str,
    task_name: str,
    records: Sequence[Mapping[str, Any]],
    selected: Mapping[str, Any],
) -> None:
    """Dev score vs learning rate for one task (its trials in `records`, grouped by
    `trial_groups.by_learning_rate`): seeds as points, mean line, min-max band, the
    majority-class baseline (dash-dot) and the paper's test scores (dashed, dotted)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8.0, 4.0), dpi=110)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    metric = glue_metrics.paper_metric(task_name)
    report_names = list(selected["dev_metrics"])
    colors = ("tab:blue", "tab:orange")
    groups = by_learning_rate(records).get(task_name, {})
    lrs = np.asarray(sorted(groups))
    for color, report_name in zip(colors, report_names):
        scores = [np.asarray(groups[lr].scores(report_name)) for lr in lrs]
        for lr, values in zip(lrs, scores):
            axes.scatter(np.full(values.shape, lr), values, s=14, color=color, alpha=0.6)
        means = np.asarray([v.mean() for v in scores])
        axes.plot(lrs, means, color=color, marker="o", label=f"{report_name} (dev, mean)")
        axes.fill_between(
            lrs,
            [v.min() for v in scores],
            [v.max() for v in scores],
            color=color,
            alpha=0.15,
            label="min-max over seeds" if color == colors[0] else None,
        )
        axes.scatter(
            [selected["learning_rate"]],
            [selected["dev_metrics"][report_name][metric]],
            marker="*",
            s=160,
            color=color,
            edgecolor="black",
            zorder=5,
            label="selected" if color == colors[0] else None,
        )
        baseline = (selected.get("dev_baseline") or {}).get(report_name)
        if baseline is not None:
            axes.axhline(
                baseline["metrics"][metric],
                color=color,
                linestyle="-.",
                linewidth=1,
                alpha=0.7,
                label=f"{report_name} {BASELINE_LABEL}",
            )
        for (paper_name, row), style in zip(PAPER_ROWS.items(), ("--", ":")):
            if report_name in row:
                axes.axhline(
                    row[report_name],
                    color=color,
                    linestyle=style,
                    linewidth=1,
                    label=f"{paper_name} {report_name} (paper, test)",
                )
    axes.set_xscale("log")
    all_lrs = sorted({r["learning_rate"] for r in records})
    axes.set_xticks(all_lrs)
    axes.set_xticklabels([f"{lr:g}" for lr in all_lrs])
    axes.minorticks_off()
    axes.set_xlabel("learning rate")
    axes.set_ylabel(f"{METRIC_LABELS[metric]} (%)")
    seeds = sorted({r["seed"] for r in records})
    axes.set_title(
        f"{task_name}: dev {METRIC_LABELS[metric]} vs learning rate ({len(seeds)} seeds)"
    )
    axes.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    with outputs.local_then_place(path, ".png") as local:  # uploaded when `path` is in a bucket
        figure.savefig(local, bbox_inches="tight")
