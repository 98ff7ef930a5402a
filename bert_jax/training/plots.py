"""The pretraining picture: `<workdir>/plots/pretraining.png` from the run's metrics.jsonl.

Four panels over the steps: the training loss (total, MLM, NSP) with the held-out loss, MLM
accuracy (training, held-out, and the held-out most-frequent-token baseline), NSP accuracy
(training, held-out, the held-out majority-label baseline, a cross where the model predicts one
class) and the learning rate. Only what the run measured is drawn: a
run without evaluation has no held-out lines or baseline in the plot or its legends. The loop
writes it at the end and at an evaluation when the last drawing is `REDRAW_SECONDS` old (a
drawing costs about 0.6 CPU-s, the first in a process 1.1 with matplotlib's import: a short run
evaluating every few steps drew it at each); a resume that trains no step (the run was finished)
keeps the plot it finds, drawn from the same rows. matplotlib's Agg canvas needs no display.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from bert_jax.runtime import fs, outputs
from bert_jax.training import metric_writers

PLOT_NAME = os.path.join("plots", "pretraining.png")
# The least time between two drawings of a run's plot at its evaluations.
REDRAW_SECONDS = 60.0


def due(drawn_at: float) -> bool:
    """Whether the plot last drawn at `drawn_at` (time.monotonic) is due to be drawn again."""
    return time.monotonic() - drawn_at >= REDRAW_SECONDS


def _series(rows: Sequence[Mapping[str, Any]], key: str) -> tuple[list[int], list[float]]:
    points = [(int(r["step"]), float(r[key])) for r in rows if key in r]
    return [s for s, _ in points], [v for _, v in points]


def write_plot(jsonl_path: str, path: str) -> bool:
    """Draws the run's curves from `jsonl_path` into `path` (replaced whole); False when there
    is nothing to draw yet."""
    if not fs.exists(jsonl_path):
        return False
    train = metric_writers.read_jsonl(jsonl_path, "train")
    evals = metric_writers.read_jsonl(jsonl_path, "eval")
    if not train and not evals:
        return False
    figure = draw(train, evals, f"pretraining: {os.path.dirname(os.path.dirname(path)) or '.'}")
    fs.makedirs(os.path.dirname(path), exist_ok=True)
    with outputs.local_then_place(path, suffix=".png") as local:
        figure.savefig(local)
    return True


def draw(train: Sequence[Mapping[str, Any]], evals: Sequence[Mapping[str, Any]], title: str):
    """The figure of the training rows `train` and eval rows `evals`: a line for each metric the
    rows hold, none for one they lack."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11.0, 7.0), dpi=100)
    FigureCanvasAgg(figure)
    loss, mlm, nsp, rate = figure.subplots(2, 2).ravel()

    def line(axes, rows, key, *style, **kwargs):
        if any(key in row for row in rows):
            axes.plot(*_series(rows, key), *style, **kwargs)

    line(loss, train, "loss", label="train loss")
    line(loss, train, "mlm_loss", label="train MLM loss")
    line(loss, train, "nsp_loss", label="train NSP loss")
    line(loss, evals, "loss", "o-", label="held-out loss")
    loss.set_title("loss")

    line(mlm, train, "mlm_accuracy", label="train")
    line(mlm, evals, "mlm_accuracy", "o-", label="held-out")
    line(mlm, evals, "mlm_baseline_accuracy", "k--", label="most frequent token")
    mlm.set_title("MLM accuracy" if evals else "MLM accuracy (no held-out eval in this run)")

    if any("nsp_accuracy" in r for r in [*train, *evals]):
        line(nsp, train, "nsp_accuracy", label="train")
        line(nsp, evals, "nsp_accuracy", "o-", label="held-out")
        line(nsp, evals, "nsp_baseline_accuracy", "k--", label="majority label (held-out)")
        one_class = [r for r in evals if r.get("nsp_one_class")]
        if one_class:  # accuracy that is only the predicted label's share
            nsp.plot(*_series(one_class, "nsp_accuracy"), "rx", ms=10, label="predicts one class")
        if not any("nsp_baseline_accuracy" in r for r in evals):  # rows from before the baseline
            nsp.axhline(0.5, color="black", linestyle=":", label="chance")
        nsp.set_title("NSP accuracy")
    else:
        nsp.set_axis_off()
        nsp.text(0.5, 0.5, "no NSP in this objective", ha="center", va="center")

    line(rate, train, "learning_rate")
    rate.set_title("learning rate")
    rate.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))

    for axes in (loss, mlm, nsp, rate):
        axes.set_xlabel("step")
        axes.grid(alpha=0.3)
        if axes.get_legend_handles_labels()[0]:
            axes.legend(fontsize="small")
    figure.suptitle(title)
    figure.tight_layout()
    return figure
