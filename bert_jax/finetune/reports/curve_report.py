"""The checkpoint curve's report (`bert-jax finetune --each-checkpoint`): curve.md, the dev score
at each pretraining step beside the paper's Figure 5, and plots/curve.png.

matplotlib is imported lazily, with the Agg canvas (no display needed).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bert_jax.runtime import outputs


def curve_markdown(curve: Mapping[str, Any]) -> str:
    lines = [
        f"# {curve['task']}: {curve['metric']} against pretraining step",
        "",
        f"Pretraining run: `{curve['model']}`; data: `{curve['data']}`. The paper's Figure 5 "
        "draws MNLI dev accuracy for BERT-Base from checkpoints at 200k-1M steps (about +1.0 "
        "point from 500k to 1M).",
        "",
        f"| step | {curve['metric']} | run |",
        "|---|---|---|",
    ]
    for point in curve["points"]:
        lines.append(f"| {point['step']} | {point['score']:.2f} | `steps/step={point['step']}/` |")
    return "\n".join(lines) + "\n"


def plot_curve(path: str, curve: Mapping[str, Any]) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.0, 3.6), dpi=110)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    steps = [p["step"] for p in curve["points"]]
    axes.plot(steps, [p["score"] for p in curve["points"]], "o-", color="tab:blue")
    axes.set_xlabel("pretraining step")
    axes.set_ylabel(f"{curve['metric']} (%)")
    axes.set_title(f"{curve['task']} after fine-tuning, by pretraining step (cf. Figure 5)")
    with outputs.local_then_place(path, ".png") as local:
        figure.savefig(local, bbox_inches="tight")
