"""Sweep reports: results.json, results.csv, results.md (the paper's Table 1 layout) and plots.

- `results.json`: everything — the settings the trials ran (`protocol.settings`), per task the
  selected trial, its majority-class baseline, per learning rate the seed spread, every trial's
  metrics and how its predictions spread; the Table 1 columns, the paper-style average, the
  official GLUE average, and the trials that predict a single class.
- `results.csv`: one row per (trial, dev evaluation), every official metric in its own column,
  the baseline's score and the one class a trial predicted for every example (if it did).
- `results.md`: Table 1 with the paper's BERT-Base and BERT-Large rows (GLUE test server) beside
  ours (dev set, so the rows are a reference, not a like-for-like comparison) and the majority
  class's, the trials that predict a single class, the official GLUE metrics per task beside the
  baseline's, and the seed spread per learning rate.
- `plots/<TASK>.png` (`sweep_plot`): dev score vs learning rate, with the baseline and the paper.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from bert_jax.finetune.reports.references import (
    BASELINE_LABEL,
    METRIC_LABELS,
    PAPER_ROWS,
    baseline_scores,
    prediction_notes,
)
from bert_jax.finetune.reports.sweep_plot import plot_task
from bert_jax.finetune.reports.trial_groups import by_learning_rate
from bert_jax.finetune.tasks import glue, glue_metrics, registry
from bert_jax.finetune.tuning.settings import DECLARATIONS, SWEPT
from bert_jax.runtime import fs, outputs

CSV_METRICS = ("accuracy", "f1", "matthews_corr", "pearson", "spearman")


def ran_settings(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Each declared setting as the trials ran it: the one value they share, or the list of
    their values in sweep order. A swept setting (learning rate, seed) is always a list."""
    ran: dict[str, Any] = {}
    for name in DECLARATIONS:
        values: list[Any] = []
        for record in records:
            value = (record.get("settings") or {}).get(name)
            if value is not None and value not in values:
                values.append(value)
        ran[name] = values if name in SWEPT or len(values) != 1 else values[0]
    return ran


def _ordered_tasks(names: Sequence[str]) -> list[str]:
    order = registry.sweep_order()
    return sorted(set(names), key=lambda n: order.index(n) if n in order else 99)


def column_scores(selected: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """The paper-metric dev score of each selected trial, keyed by Table 1 column (and WNLI)."""
    scores = {}
    for task_name, record in selected.items():
        for report_name, values in record["dev_metrics"].items():
            scores[report_name] = glue_metrics.paper_score(task_name, values)
    return scores


def seed_spread(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per task and learning rate (written as `%g`): every seed's score (by report name and for
    selection) and the selection scores' spread, from `trial_groups.by_learning_rate`."""
    return {
        task: {
            f"{lr:g}": {
                "learning_rate": lr,
                "seeds": group.seeds,
                "selection": group.selection_scores,
                "by_eval": {name: group.scores(name) for name in group.report_names},
                **group.spread(),
            }
            for lr, group in rates.items()
        }
        for task, rates in by_learning_rate(records).items()
    }


def mean_at_selected_lr(
    records: Sequence[Mapping[str, Any]], selected: Mapping[str, Mapping[str, Any]]
) -> dict[str, float]:
    """Per Table 1 column, the mean over seeds at each task's selected learning rate."""
    means = {}
    for task, rates in by_learning_rate(records).items():
        group = rates[selected[task]["learning_rate"]]
        for name in group.report_names:
            means[name] = float(np.mean(group.scores(name)))
    return means


def summary(
    records: Sequence[Mapping[str, Any]], selected: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    columns = column_scores(selected)
    split_metrics = {
        report_name: values
        for record in selected.values()
        for report_name, values in record["dev_metrics"].items()
    }
    task_scores = glue_metrics.glue_task_scores(split_metrics)
    return {
        "columns": columns,
        "paper_average": glue_metrics.paper_average(columns),
        "glue_task_scores": task_scores,
        "glue_average": glue_metrics.glue_average(task_scores),
        "glue_average_without_wnli": glue_metrics.glue_average(
            task_scores,
            tuple(t.name for t in registry.benchmark_tasks(glue.BENCHMARK) if t.report_columns),
        ),
        "mean_over_seeds_at_selected_lr": mean_at_selected_lr(records, selected),
        "baseline_columns": baseline_scores(selected),
        "single_prediction": {
            record["trial"]: notes for record in records if (notes := prediction_notes(record))
        },
    }


# ------------------------------------------------------------------------------------------------
# Writers
# ------------------------------------------------------------------------------------------------


def _write_text_atomic(path: str, text: str) -> None:
    outputs.write_bytes_atomic(path, text.encode("utf-8"))


def results_json(
    records: Sequence[Mapping[str, Any]],
    selected: Mapping[str, Mapping[str, Any]],
    protocol: Mapping[str, Any],
) -> dict[str, Any]:
    spread = seed_spread(records)
    tasks = {}
    for task_name in _ordered_tasks([r["task"] for r in records]):
        chosen = selected[task_name]
        tasks[task_name] = {
            "selected": {
                key: chosen[key]
                for key in ("trial", "learning_rate", "seed", "dev_metrics", "selection_score")
            },
            "baseline": chosen.get("dev_baseline"),
            "by_learning_rate": spread[task_name],
            "trials": [
                {
                    key: r[key]
                    for key in (
                        "trial",
                        "learning_rate",
                        "seed",
                        "dev_metrics",
                        "selection_score",
                        "train_loss",
                        "num_train_steps",
                        "seconds",
                    )
                }
                | {
                    "prediction_summary": r.get("prediction_summary"),
                    "single_prediction": prediction_notes(r),
                }
                for r in records
                if r["task"] == task_name
            ],
        }
    return {
        "protocol": dict(protocol),
        "summary": summary(records, selected),
        "tasks": tasks,
        "paper": {"rows": PAPER_ROWS, "note": "GLUE test server, Devlin et al. (2019) Table 1"},
    }


def results_csv(
    records: Sequence[Mapping[str, Any]], selected: Mapping[str, Mapping[str, Any]]
) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(
        [
            "task",
            "eval",
            "learning_rate",
            "seed",
            "selected",
            "paper_score",
            "glue_score",
            *CSV_METRICS,
            "train_loss",
            "num_train_steps",
            "seconds",
            "baseline_paper_score",
            "single_dev_prediction",
        ]
    )
    for record in records:
        is_selected = selected[record["task"]]["trial"] == record["trial"]
        baseline = record.get("dev_baseline") or {}
        spread = (record.get("prediction_summary") or {}).get("dev") or {}
        for report_name, values in record["dev_metrics"].items():
            trivial = baseline.get(report_name)
            single = (spread.get(report_name) or {}).get("single")
            writer.writerow(
                [
                    record["task"],
                    report_name,
                    f"{record['learning_rate']:g}",
                    record["seed"],
                    int(is_selected),
                    f"{glue_metrics.paper_score(record['task'], values):.4f}",
                    f"{glue_metrics.glue_score(record['task'], values):.4f}",
                    *[f"{values[m]:.4f}" if m in values else "" for m in CSV_METRICS],
                    f"{record['train_loss']:.6f}",
                    record["num_train_steps"],
                    f"{record['seconds']:.1f}",
                    ""
                    if trivial is None
                    else f"{glue_metrics.paper_score(record['task'], trivial['metrics']):.4f}",
                    "" if single is None else single,
                ]
            )
    return out.getvalue()


def _fmt(value: float | None) -> str:
    return "—" if value is None or not np.isfinite(value) else f"{value:.1f}"


def _table_row(label: str, scores: Mapping[str, float | None], average: float | None) -> str:
    """A row of Table 1: a task of several columns (MNLI-m/mm) in one cell, as the paper does."""
    cells = [
        "/".join(_fmt(scores.get(column)) for column in task.report_columns)
        for task in registry.table_tasks()
    ]
    return f"| {label} | " + " | ".join(cells) + f" | {_fmt(average)} |"


def _table_header() -> list[str]:
    tasks = registry.table_tasks()
    names = [  # MNLI-m/mm
        "/".join([task.report_columns[0]] + [c.rsplit("-", 1)[1] for c in task.report_columns[1:]])
        for task in tasks
    ]
    return [
        "| System | " + " | ".join(names) + " | Average |",
        "|---" * (len(names) + 2) + "|",
        "| train size | " + " | ".join(task.train_size or "" for task in tasks) + " | |",
    ]


def _single_prediction_lines(
    records: Sequence[Mapping[str, Any]], selected: Mapping[str, Mapping[str, Any]]
) -> list[str]:
    """results.md's warning about trials that predict one thing (none: no section)."""
    chosen = {record["trial"] for record in selected.values()}
    flagged = [(record, prediction_notes(record)) for record in records]
    flagged = [(record, notes) for record, notes in flagged if notes]
    if not flagged:
        return []
    lines = [
        "## Trials that predict a single class",
        "",
        "These trials put every example of a split in one class (or gave every example one "
        "score): whatever their dev score, the model has learnt nothing to tell the examples "
        "apart (other learning rates, seeds or more epochs may help).",
        "",
    ]
    for record, notes in flagged:
        mark = " (selected)" if record["trial"] in chosen else ""
        lines += [f"- **{record['trial']}**{mark}: " + "; ".join(notes)]
    return [*lines, ""]


def results_markdown(
    records: Sequence[Mapping[str, Any]],
    selected: Mapping[str, Mapping[str, Any]],
    protocol: Mapping[str, Any],
) -> str:
    stats = summary(records, selected)
    seeds = protocol["seeds"]
    lrs = ", ".join(f"{lr:g}" for lr in protocol["learning_rates"])
    lines = [
        f"# GLUE results: {protocol['model']} ({protocol.get('model_label', 'model')})",
        "",
        f"Ours: **dev** set; per task the best of learning rates {{{lrs}}} x seeds "
        f"{list(seeds)} on dev; batch {protocol['batch_size']}, epochs {protocol['epochs']:g}, "
        f"max sequence length {protocol['max_seq_length']}. Paper rows: **test** set (GLUE "
        "server), Devlin et al. (2019) Table 1 — a reference point, not a like-for-like "
        "comparison.",
        "",
        *_table_header(),
    ]
    for name, row in PAPER_ROWS.items():
        lines.append(_table_row(f"{name} (paper, test)", row, row["Average"]))
    lines.append(_table_row("Ours (dev, selected trial)", stats["columns"], stats["paper_average"]))
    baselines = stats["baseline_columns"]
    if baselines:
        lines.append(
            _table_row(
                f"{BASELINE_LABEL[0].upper()}{BASELINE_LABEL[1:]}",
                baselines,
                glue_metrics.paper_average(baselines),
            )
        )
    if len(seeds) > 1:
        means = stats["mean_over_seeds_at_selected_lr"]
        lines.append(
            _table_row(
                f"Ours (dev, mean of {len(seeds)} seeds at the selected lr)",
                means,
                glue_metrics.paper_average(means),
            )
        )
    lines += [
        "",
        "F1 for QQP and MRPC, Spearman correlation for STS-B, Matthews correlation for CoLA, "
        "accuracy elsewhere; the average is over the nine columns (WNLI excluded), as in the "
        "paper. — marks a task not in this sweep (the average needs all nine). The majority-class "
        "row predicts each dev split's most frequent label for every example (STS-B: the train "
        "mean, whose correlations are 0): a score near it has learnt little.",
        "",
        *_single_prediction_lines(records, selected),
        "## Official GLUE metrics (dev, selected trial)",
        "",
        "| Task | Metrics | Majority class | GLUE score | Selected lr | Seed | Train examples |",
        "|---|---|---|---|---|---|---|",
    ]
    for task_name in _ordered_tasks(selected):
        record = selected[task_name]
        shown = "; ".join(
            (f"{report_name}: " if len(record["dev_metrics"]) > 1 else "")
            + ", ".join(f"{METRIC_LABELS[m]} {v:.1f}" for m, v in values.items())
            for report_name, values in record["dev_metrics"].items()
        )
        trivial = "; ".join(
            (f"{report_name}: " if len(record["dev_metrics"]) > 1 else "")
            + f"{baseline['prediction']!r}: "
            + ", ".join(f"{METRIC_LABELS[m]} {v:.1f}" for m, v in baseline["metrics"].items())
            for report_name, baseline in (record.get("dev_baseline") or {}).items()
        )
        lines.append(
            f"| {task_name} | {shown} | {trivial or '—'} | "
            f"{_fmt(stats['glue_task_scores'].get(task_name))} | "
            f"{record['learning_rate']:g} | {record['seed']} | {record['num_train_examples']} |"
        )
    lines += [
        "",
        f"GLUE average (official: pairs of metrics averaged, MNLI-m/mm averaged, all nine tasks "
        f"with WNLI): **{_fmt(stats['glue_average'])}**; without WNLI: "
        f"{_fmt(stats['glue_average_without_wnli'])}. Paper-style average (Table 1 columns): "
        f"**{_fmt(stats['paper_average'])}**.",
        "",
        "## Seed spread per learning rate (dev, selection score)",
        "",
        "| Task | lr | Seeds | Mean | Std | Min | Max |",
        "|---|---|---|---|---|---|---|",
    ]
    spread = seed_spread(records)
    for task_name in _ordered_tasks(spread):
        for lr_key, entry in spread[task_name].items():
            lines.append(
                f"| {task_name} | {lr_key} | {len(entry['seeds'])} | {entry['mean']:.1f} | "
                f"{entry['std']:.1f} | {entry['min']:.1f} | {entry['max']:.1f} |"
            )
    lines.append("")
    return "\n".join(lines)


def write_reports(
    workdir: str,
    records: Sequence[Mapping[str, Any]],
    selected: Mapping[str, Mapping[str, Any]],
    *,
    model: str,
    model_label: str,
    data: str,
    learning_rates: Sequence[float],
    seeds: Sequence[int],
    settings: Any,
) -> list[str]:
    """Write results.json, results.csv, results.md and plots/<TASK>.png; returns their paths.

    The protocol's `settings` are those the trials ran (`ran_settings`: the swept learning
    rates and seeds as lists); `settings` (this invocation's) fills in for records without."""
    ran = {**settings.to_dict(), **{k: v for k, v in ran_settings(records).items() if v != []}}
    protocol = {
        "model": model,
        "model_label": model_label,
        "data": data,
        "learning_rates": [float(lr) for lr in learning_rates],
        "seeds": [int(s) for s in seeds],
        "epochs": ran["epochs"],
        "batch_size": ran["batch_size"],
        "max_seq_length": ran["max_seq_length"],
        "settings": ran,
        "selection": "best dev score in the paper's metric per task (MNLI: mean of m and mm)",
    }
    written = []
    path = os.path.join(workdir, "results.json")
    _write_text_atomic(path, json.dumps(results_json(records, selected, protocol), indent=2) + "\n")
    written.append(path)
    path = os.path.join(workdir, "results.csv")
    _write_text_atomic(path, results_csv(records, selected))
    written.append(path)
    path = os.path.join(workdir, "results.md")
    _write_text_atomic(path, results_markdown(records, selected, protocol))
    written.append(path)
    plots = os.path.join(workdir, "plots")
    fs.makedirs(plots, exist_ok=True)
    for task_name in _ordered_tasks(selected):
        path = os.path.join(plots, f"{glue.get_task(task_name).name}.png")
        plot_task(
            path, task_name, [r for r in records if r["task"] == task_name], selected[task_name]
        )
        written.append(path)
    return written
