"""Sweep reports: results.json, results.csv, results.md (the paper's Table 1 layout) and plots.

- `results.json`: everything — per task the selected trial, per learning rate the seed spread, every
  trial's metrics; the Table 1 columns, the paper-style average and the official GLUE average.
- `results.csv`: one row per (trial, dev evaluation), every official metric in its own column.
- `results.md`: Table 1 with the paper's BERT-Base and BERT-Large rows (GLUE test server) beside
  ours (dev set, so the rows are a reference, not a like-for-like comparison), the official GLUE
  metrics per task, and the seed spread per learning rate.
- `plots/<TASK>.png`: dev score vs learning rate, one point per seed, the mean as a line and the
  min-max range shaded, the selected trial starred, the paper's test scores as dashed lines.

matplotlib is imported lazily, with the Agg canvas (no display needed).
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from bert_jax.finetune.tasks import glue, glue_metrics, registry
from bert_jax.runtime import fs, outputs


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
CSV_METRICS = ("accuracy", "f1", "matthews_corr", "pearson", "spearman")


def _ordered_tasks(names: Sequence[str]) -> list[str]:
    order = registry.sweep_order()
    return sorted(set(names), key=lambda n: order.index(n) if n in order else 99)


def column_scores(best: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """The paper-metric dev score of each selected trial, keyed by Table 1 column (and WNLI)."""
    scores = {}
    for task_name, record in best.items():
        for report_name, values in record["dev_metrics"].items():
            scores[report_name] = glue_metrics.paper_score(task_name, values)
    return scores


def seed_spread(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per task and learning rate: every seed's score (by report name and for selection)."""
    spread: dict[str, dict[str, dict[str, Any]]] = {}
    for record in records:
        entry = spread.setdefault(record["task"], {}).setdefault(
            f"{record['learning_rate']:g}",
            {"learning_rate": record["learning_rate"], "seeds": [], "selection": [], "by_eval": {}},
        )
        entry["seeds"].append(record["seed"])
        entry["selection"].append(record["selection_score"])
        for report_name, values in record["dev_metrics"].items():
            entry["by_eval"].setdefault(report_name, []).append(
                glue_metrics.paper_score(record["task"], values)
            )
    for by_lr in spread.values():
        for entry in by_lr.values():
            values = np.asarray(entry["selection"], np.float64)
            entry.update(
                mean=float(values.mean()),
                std=float(values.std(ddof=1)) if values.size > 1 else 0.0,
                min=float(values.min()),
                max=float(values.max()),
            )
    return spread


def mean_at_selected_lr(
    records: Sequence[Mapping[str, Any]], best: Mapping[str, Mapping[str, Any]]
) -> dict[str, float]:
    """Per Table 1 column, the mean over seeds at each task's selected learning rate."""
    means: dict[str, list[float]] = {}
    for record in records:
        chosen = best[record["task"]]
        if record["learning_rate"] != chosen["learning_rate"]:
            continue
        for report_name, values in record["dev_metrics"].items():
            means.setdefault(report_name, []).append(
                glue_metrics.paper_score(record["task"], values)
            )
    return {name: float(np.mean(values)) for name, values in means.items()}


def summary(
    records: Sequence[Mapping[str, Any]], best: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    columns = column_scores(best)
    split_metrics = {
        report_name: values
        for record in best.values()
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
        "mean_over_seeds_at_selected_lr": mean_at_selected_lr(records, best),
    }


# ------------------------------------------------------------------------------------------------
# Writers
# ------------------------------------------------------------------------------------------------


def _write_text_atomic(path: str, text: str) -> None:
    outputs.write_bytes_atomic(path, text.encode("utf-8"))


def results_json(
    records: Sequence[Mapping[str, Any]],
    best: Mapping[str, Mapping[str, Any]],
    protocol: Mapping[str, Any],
) -> dict[str, Any]:
    spread = seed_spread(records)
    tasks = {}
    for task_name in _ordered_tasks([r["task"] for r in records]):
        chosen = best[task_name]
        tasks[task_name] = {
            "selected": {
                key: chosen[key]
                for key in ("trial", "learning_rate", "seed", "dev_metrics", "selection_score")
            },
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
                for r in records
                if r["task"] == task_name
            ],
        }
    return {
        "protocol": dict(protocol),
        "summary": summary(records, best),
        "tasks": tasks,
        "paper": {"rows": PAPER_ROWS, "note": "GLUE test server, Devlin et al. (2019) Table 1"},
    }


def results_csv(records: Sequence[Mapping[str, Any]], best: Mapping[str, Mapping[str, Any]]) -> str:
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
        ]
    )
    for record in records:
        selected = best[record["task"]]["trial"] == record["trial"]
        for report_name, values in record["dev_metrics"].items():
            writer.writerow(
                [
                    record["task"],
                    report_name,
                    f"{record['learning_rate']:g}",
                    record["seed"],
                    int(selected),
                    f"{glue_metrics.paper_score(record['task'], values):.4f}",
                    f"{glue_metrics.glue_score(record['task'], values):.4f}",
                    *[f"{values[m]:.4f}" if m in values else "" for m in CSV_METRICS],
                    f"{record['train_loss']:.6f}",
                    record["num_train_steps"],
                    f"{record['seconds']:.1f}",
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


def results_markdown(
    records: Sequence[Mapping[str, Any]],
    best: Mapping[str, Mapping[str, Any]],
    protocol: Mapping[str, Any],
) -> str:
    stats = summary(records, best)
    seeds = protocol["seeds"]
    lrs = ", ".join(f"{lr:g}" for lr in protocol["learning_rates"])
    lines = [
        f"# GLUE results: {protocol['model']}",
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
        "paper. — marks a task not in this sweep (the average needs all nine).",
        "",
        "## Official GLUE metrics (dev, selected trial)",
        "",
        "| Task | Metrics | GLUE score | Selected lr | Seed | Train examples |",
        "|---|---|---|---|---|---|",
    ]
    for task_name in _ordered_tasks(best):
        record = best[task_name]
        shown = "; ".join(
            (f"{report_name}: " if len(record["dev_metrics"]) > 1 else "")
            + ", ".join(f"{METRIC_LABELS[m]} {v:.1f}" for m, v in values.items())
            for report_name, values in record["dev_metrics"].items()
        )
        lines.append(
            f"| {task_name} | {shown} | {_fmt(stats['glue_task_scores'].get(task_name))} | "
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


def plot_task(
    path: str,
    task_name: str,
    records: Sequence[Mapping[str, Any]],
    selected: Mapping[str, Any],
) -> None:
    """Dev score vs learning rate for one task: seeds as points, mean line, min-max band."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8.0, 4.0), dpi=110)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    metric = glue_metrics.paper_metric(task_name)
    report_names = list(selected["dev_metrics"])
    colors = ("tab:blue", "tab:orange")
    for color, report_name in zip(colors, report_names):
        by_lr: dict[float, list[float]] = {}
        for record in records:
            by_lr.setdefault(record["learning_rate"], []).append(
                record["dev_metrics"][report_name][metric]
            )
        lrs = np.asarray(sorted(by_lr))
        scores = [np.asarray(by_lr[lr]) for lr in lrs]
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


def write_reports(
    workdir: str,
    records: Sequence[Mapping[str, Any]],
    best: Mapping[str, Mapping[str, Any]],
    *,
    model: str,
    data: str,
    learning_rates: Sequence[float],
    seeds: Sequence[int],
    settings: Any,
) -> list[str]:
    """Write results.json, results.csv, results.md and plots/<TASK>.png; returns their paths."""
    protocol = {
        "model": model,
        "data": data,
        "learning_rates": [float(lr) for lr in learning_rates],
        "seeds": [int(s) for s in seeds],
        "epochs": settings.epochs,
        "batch_size": settings.batch_size,
        "max_seq_length": settings.max_seq_length,
        "settings": settings.to_dict(),
        "selection": "best dev score in the paper's metric per task (MNLI: mean of m and mm)",
    }
    written = []
    path = os.path.join(workdir, "results.json")
    _write_text_atomic(path, json.dumps(results_json(records, best, protocol), indent=2) + "\n")
    written.append(path)
    path = os.path.join(workdir, "results.csv")
    _write_text_atomic(path, results_csv(records, best))
    written.append(path)
    path = os.path.join(workdir, "results.md")
    _write_text_atomic(path, results_markdown(records, best, protocol))
    written.append(path)
    plots = os.path.join(workdir, "plots")
    fs.makedirs(plots, exist_ok=True)
    for task_name in _ordered_tasks(best):
        path = os.path.join(plots, f"{glue.get_task(task_name).name}.png")
        plot_task(path, task_name, [r for r in records if r["task"] == task_name], best[task_name])
        written.append(path)
    return written
