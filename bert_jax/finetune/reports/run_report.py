"""One run's report beside the paper (SQuAD, CoNLL-2003 fine-tuned or feature-based, SWAG):
results.md, the run's dev figures against the registered task's `paper` rows and, where the run
records one (SWAG), the majority-class baseline and the warning for a model that predicts one
class; and the plot of its dev figures after each evaluation (`plots/<task>.png`).

matplotlib is imported lazily, with the Agg canvas (no display needed).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bert_jax.finetune.reports import references
from bert_jax.finetune.tasks import registry
from bert_jax.finetune.tasks.task import SPANS, TAGS, Task
from bert_jax.runtime import outputs as files


def _shown(task: Task) -> list[str]:
    """The dev figures a plot draws: SQuAD's exact match and F1, the paper's metric otherwise."""
    return [task.metrics[1], task.metrics[0]] if task.family == SPANS else [task.paper_metric]


def load_plotting() -> None:
    """Imports what `plot_history` draws with (matplotlib's figure and Agg canvas: 0.3-0.6 s
    of Python). A run that plots calls it while its first step compiles (`run_steps`'
    `while_compiling`), where a core would otherwise wait, instead of after training."""
    from matplotlib import figure  # noqa: F401
    from matplotlib.backends import backend_agg  # noqa: F401


def plot_history(path: str, result: Mapping[str, Any]) -> None:
    """Dev EM and F1 (SQuAD), span F1 (CoNLL-2003) or accuracy (SWAG) after each evaluation,
    with the paper's dev figures as lines (evaluations after every epoch with
    --eval-every-epoch)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    task = registry.get(result["task"])
    figure = Figure(figsize=(7.0, 3.6), dpi=110)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    epochs = [entry["epoch"] for entry in result["history"]]
    for name, color in zip(_shown(task), ("tab:blue", "tab:orange")):
        axes.plot(
            epochs,
            [e["dev"][name] for e in result["history"]],
            "o-",
            color=color,
            label=f"this run, dev {name}",
        )
        for (paper, values), style in zip(task.paper, ("--", ":")):
            value = values.get("dev f1" if task.family == TAGS else name)
            if value is not None and "test" not in paper:
                axes.axhline(
                    value, color=color, linestyle=style, linewidth=1, label=f"{paper} {name}"
                )
    axes.set_xlabel("epoch")
    axes.set_ylabel("%")
    axes.set_title(f"{result['task']}: dev figures during fine-tuning")
    axes.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    with files.local_then_place(path, ".png") as local:  # uploaded when `path` is in a bucket
        figure.savefig(local, bbox_inches="tight")


def results_markdown(result: Mapping[str, Any]) -> str:
    """The run's dev figures beside the paper's, as a Markdown table (CoNLL-2003: dev and test
    F1, as the paper's fine-tuning rows give them)."""
    task = registry.get(result["task"])
    reference = task.paper
    columns = list(reference[0][1])
    ours = dict(result["dev_metrics"])
    if task.family == TAGS:
        ours = {"dev f1": ours.get("f1"), "test f1": result.get("test_metrics", {}).get("f1")}
    lines = [
        f"# {result['task']}",
        "",
        f"Model: `{result.get('model', '')}`; data: `{result.get('data', '')}`.",
        "",
        "| | " + " | ".join(columns) + " |",
        "|---" * (len(columns) + 1) + "|",
    ]

    def cell(value):
        return "–" if value is None else f"{float(value):.1f}"

    lines.append("| this run | " + " | ".join(cell(ours.get(c)) for c in columns) + " |")
    for baseline in (result.get("dev_baseline") or {}).values():
        trivial = baseline["metrics"]
        label = f"majority class (dev: {baseline['prediction']} for every example)"
        lines.append(f"| {label} | " + " | ".join(cell(trivial.get(c)) for c in columns) + " |")
    for name, values in reference:
        lines.append(f"| {name} | " + " | ".join(cell(values.get(c)) for c in columns) + " |")
    extra = {k: v for k, v in result["dev_metrics"].items() if k not in columns}
    if extra and task.family != TAGS:
        lines += ["", "All dev figures: " + ", ".join(f"{k} {v:.4g}" for k, v in extra.items())]
    notes = references.prediction_notes(result)
    if notes:
        lines += [
            "",
            f"**This model {references.collapse_phrase(result)}**, whatever its score: "
            + "; ".join(notes),
        ]
    return "\n".join(lines) + "\n"


def feature_line(result: Mapping[str, Any]) -> str:
    """The feature-based run's line under its table: its dev F1 beside Table 7's for the variant."""
    variant = result["features"]
    (system, figures), *_ = registry.get(result["task"], feature_based=True).paper
    return (
        f"\nFeature-based (BERT frozen, `{variant}` into a two-layer BiLSTM): this run's dev F1 "
        f"{result['dev_metrics']['f1']:.1f}; the paper's BERT-Base dev F1 for this variant "
        f"{figures[variant]:.1f} (Table 7; the rows above are fine-tuning's).\n"
    )
