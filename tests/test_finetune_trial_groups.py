"""The one grouping of a sweep's trials by task and learning rate (finetune/reports/
trial_groups.py), and the three reports that read it (the seed spread, the mean at the selected
learning rate, the per-task plot), on a small set checked by hand."""

from __future__ import annotations

import math

import pytest

from bert_jax.finetune.reports import sweep_plot, sweep_report, trial_groups


def _trial(task, lr, seed, selection, **scores):
    """A sweep record: the accuracy (MNLI's and SST-2's paper metric) on each dev evaluation."""
    dev = {name.replace("_", "-"): {"accuracy": value, "f1": 0.0} for name, value in scores.items()}
    return {
        "task": task,
        "learning_rate": lr,
        "seed": seed,
        "selection_score": selection,
        "dev_metrics": dev,
    }


RECORDS = [
    _trial("SST-2", 2e-5, 1, 90.0, SST_2=90.0),
    _trial("MNLI", 2e-5, 1, 83.5, MNLI_m=84.0, MNLI_mm=83.0),
    _trial("SST-2", 2e-5, 2, 91.0, SST_2=91.0),
    _trial("SST-2", 3e-5, 1, 89.0, SST_2=89.0),
    _trial("MNLI", 2e-5, 2, 85.5, MNLI_m=86.0, MNLI_mm=85.0),
    _trial("SST-2", 2e-5, 3, 95.0, SST_2=95.0),
]


def test_trials_group_by_task_and_learning_rate_in_sweep_order():
    groups = trial_groups.by_learning_rate(RECORDS)
    assert list(groups) == ["SST-2", "MNLI"] and list(groups["SST-2"]) == [2e-5, 3e-5]
    sst = groups["SST-2"][2e-5]
    assert sst.seeds == [1, 2, 3] and sst.selection_scores == [90.0, 91.0, 95.0]
    assert sst.scores("SST-2") == [90.0, 91.0, 95.0]
    # By hand: mean 92; deviations -2, -1, 3; sample variance 14 / 2 = 7.
    assert sst.spread() == pytest.approx({"mean": 92.0, "std": math.sqrt(7), "min": 90, "max": 95})
    assert groups["SST-2"][3e-5].spread() == {"mean": 89.0, "std": 0.0, "min": 89.0, "max": 89.0}
    mnli = groups["MNLI"][2e-5]
    assert mnli.report_names == ["MNLI-m", "MNLI-mm"]
    assert mnli.scores("MNLI-m") == [84.0, 86.0] and mnli.scores("MNLI-mm") == [83.0, 85.0]


def test_the_reports_read_the_one_grouping():
    spread = sweep_report.seed_spread(RECORDS)
    assert list(spread["SST-2"]) == ["2e-05", "3e-05"]  # results.json's keys, as before
    entry = spread["SST-2"]["2e-05"]
    assert entry["seeds"] == [1, 2, 3] and entry["by_eval"] == {"SST-2": [90.0, 91.0, 95.0]}
    assert entry["mean"] == 92.0 and entry["std"] == pytest.approx(math.sqrt(7))
    assert spread["MNLI"]["2e-05"]["by_eval"] == {"MNLI-m": [84.0, 86.0], "MNLI-mm": [83.0, 85.0]}
    # The selected rate of SST-2 is 3e-5 (one seed), MNLI's 2e-5 (two): the means over seeds.
    selected = {"SST-2": RECORDS[3], "MNLI": RECORDS[4]}
    assert sweep_report.mean_at_selected_lr(RECORDS, selected) == {
        "SST-2": 89.0,
        "MNLI-m": 85.0,
        "MNLI-mm": 84.0,
    }


def test_the_plot_draws_each_rates_mean_and_range(tmp_path, monkeypatch):
    drawn = {}
    from matplotlib.axes import Axes

    plot, fill = Axes.plot, Axes.fill_between

    def record_plot(self, x, y, *args, **kwargs):
        drawn.setdefault("means", []).append((list(x), list(y)))
        return plot(self, x, y, *args, **kwargs)

    def record_fill(self, x, low, high, *args, **kwargs):
        drawn.setdefault("ranges", []).append((list(x), list(low), list(high)))
        return fill(self, x, low, high, *args, **kwargs)

    monkeypatch.setattr(Axes, "plot", record_plot)
    monkeypatch.setattr(Axes, "fill_between", record_fill)
    sst = [r for r in RECORDS if r["task"] == "SST-2"]
    sweep_plot.plot_task(str(tmp_path / "SST-2.png"), "SST-2", sst, RECORDS[5])
    assert drawn["means"] == [([2e-5, 3e-5], [92.0, 89.0])]
    assert drawn["ranges"] == [([2e-5, 3e-5], [90.0, 89.0], [95.0, 89.0])]
    assert (tmp_path / "SST-2.png").stat().st_size > 0
