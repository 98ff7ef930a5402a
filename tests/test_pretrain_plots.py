"""The pretraining picture (plots/pretraining.png from metrics.jsonl) and the TensorBoard line
(issue 49): drawn from the rows a run writes, with or without NSP; the line says how to get
TensorBoard where it is not installed."""

from __future__ import annotations

import os

import pytest

from bert_jax.training import metric_writers, plots, pretrain


def _write_rows(log_dir, nsp: bool) -> str:
    writer = metric_writers.MetricWriter(str(log_dir), tensorboard=False)
    for step in (10, 20, 30):
        row = {"loss": 9.0 - step / 10, "mlm_loss": 8.0, "mlm_accuracy": step / 1000}
        row["learning_rate"] = 1e-3 * step / 30
        if nsp:
            row.update(nsp_loss=0.69, nsp_accuracy=0.5)
        writer.write(step, row)
    evaluation = {"loss": 7.0, "mlm_accuracy": 0.05, "mlm_baseline_accuracy": 0.046}
    writer.write(30, {**evaluation, **({"nsp_accuracy": 0.51} if nsp else {})}, kind="eval")
    writer.close()
    return writer.jsonl_path


def test_an_evaluation_redraws_the_plot_once_it_is_a_minute_old(monkeypatch):
    now = 1000.0
    monkeypatch.setattr(plots.time, "monotonic", lambda: now)
    assert not plots.due(now)
    assert not plots.due(now - plots.REDRAW_SECONDS + 1)
    assert plots.due(now - plots.REDRAW_SECONDS)
    assert plots.REDRAW_SECONDS == 60.0  # "a minute", as docs/pretraining.md says


@pytest.mark.parametrize("nsp", [True, False])
def test_the_plot_is_drawn_from_the_runs_metrics(tmp_path, nsp):
    jsonl = _write_rows(tmp_path / "run", nsp)
    path = str(tmp_path / "run" / plots.PLOT_NAME)
    assert plots.write_plot(jsonl, path)
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    size = os.path.getsize(path)
    assert plots.write_plot(jsonl, path) and os.path.getsize(path) == size  # replaced whole
    assert sorted(os.listdir(os.path.dirname(path))) == ["pretraining.png"]  # no temporary left


def test_nothing_to_draw_yet_writes_nothing(tmp_path):
    path = str(tmp_path / plots.PLOT_NAME)
    assert not plots.write_plot(str(tmp_path / "metrics.jsonl"), path)
    assert not os.path.exists(path)


def test_the_tensorboard_line_says_how_to_get_tensorboard(monkeypatch):
    monkeypatch.setattr(pretrain.shutil, "which", lambda name: None)
    line = pretrain.tensorboard_line("/w/tensorboard")
    assert line == (
        "tensorboard: events in /w/tensorboard (`pip install tensorboard`, then "
        "`tensorboard --logdir /w/tensorboard`)"
    )
    monkeypatch.setattr(pretrain.shutil, "which", lambda name: "/usr/bin/tensorboard")
    assert pretrain.tensorboard_line("/w/tensorboard") == (
        "tensorboard: tensorboard --logdir /w/tensorboard"
    )
