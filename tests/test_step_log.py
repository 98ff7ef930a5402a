"""step_log: the training window's sums and console line, skipped files, progress lines."""

from __future__ import annotations

import os

import pytest

from bert_jax.core.model import BertConfig
from bert_jax.training import metric_writers, step_log


def step_values(loss_sum, weight, finite=True, grad_norm=1.0):
    return {
        "mlm_loss_sum": loss_sum,
        "mlm_correct_sum": weight / 2,
        "mlm_weight": weight,
        "nsp_loss_sum": 0.5,
        "nsp_correct_sum": 1.0,
        "nsp_weight": 2.0,
        "grad_norm": grad_norm,
        "learning_rate": 1e-4,
        "skipped_steps": 0,
        "real_tokens": 100,
        "finite": finite,
    }


def test_a_training_window_sums_steps_then_starts_afresh():
    window = step_log.TrainWindow(BertConfig(), num_chips=1, device_kind="cpu")
    for values in (step_values(6.0, 2.0, grad_norm=1.0), step_values(2.0, 2.0, grad_norm=3.0)):
        window.count(values, batch_size=2, seq_len=64, predictions=10)
        window.add(values)
    row = window.row(step_values(0.0, 1.0), phase=1, seq_len=64)
    # Means over the window's weights, not means of per-step means.
    assert row["mlm_loss"] == pytest.approx(8.0 / 4.0)
    assert row["mlm_accuracy"] == pytest.approx(0.5)
    assert row["nsp_loss"] == pytest.approx(1.0 / 4.0)
    assert row["grad_norm"] == pytest.approx(2.0)
    assert (row["phase"], row["seq_len"], row["learning_rate"]) == (1, 64, 1e-4)
    assert row["tokens_per_sec"] > 0 and "mfu" not in row  # no peak known for a CPU
    assert list(row)[-1] == "skipped_steps_total"
    line = step_log.train_line(2, 10, row, eta_seconds=125)
    assert line.startswith("step 2/10 [phase 1, seq 64] loss ") and line.endswith("ETA 2m05s")
    # Each value after its name: which is the loss and which the accuracy.
    assert " | mlm loss 2.000 acc 0.500 | nsp loss 0.250 acc " in line, line
    # The next window starts empty.
    values = step_values(1.0, 1.0)
    window.add(values)
    assert window.row(values, phase=2, seq_len=128)["mlm_loss"] == pytest.approx(1.0)


def test_skipped_record_files_are_logged_once_each(tmp_path):
    """With `data.skip_corrupt_records`, every damaged file the pipeline skips is one event row."""
    writer = metric_writers.MetricWriter(str(tmp_path / "run"), tensorboard=False)
    lines = []
    log = step_log.StepLog(None, 10, None, writer, lines.append, checkpointer=None)
    log.note_corrupt_files(3, {})
    log.note_corrupt_files(4, {"a.tfrecord": 7})
    log.note_corrupt_files(5, {"a.tfrecord": 7, "b.tfrecord": 0})
    writer.close()
    events = metric_writers.read_jsonl(writer.jsonl_path, kind="event")
    assert [(e["step"], e["file"], e["from_record"]) for e in events] == [
        (4, "a.tfrecord", 7),
        (5, "b.tfrecord", 0),
    ]
    assert {e["event"] for e in events} == {"corrupt_records_skipped"}
    assert lines == [
        "step 4: skipping a.tfrecord from record 7 (damaged)",
        "step 5: skipping b.tfrecord from record 0 (damaged)",
    ]


def test_the_first_steps_and_long_silences_get_progress_lines(tmp_path, monkeypatch):
    """Between metrics rows: the compile of a phase's first step, lines at steps 2 and 5, and a
    line whenever PROGRESS_SECONDS pass without one; each with a rate and an ETA."""
    import types

    clock = [100.0]
    monkeypatch.setattr(step_log.time, "perf_counter", lambda: clock[0])
    writer = metric_writers.MetricWriter(str(tmp_path / "run"), tensorboard=False)
    lines = []
    config = types.SimpleNamespace(log_every_steps=50, max_consecutive_nonfinite=3)
    log = step_log.StepLog(config, 100, BertConfig(), writer, lines.append, checkpointer=None)
    phase = types.SimpleNamespace(
        index=0, batch_size=2, max_seq_length=64, max_predictions_per_seq=10
    )
    clock[0] += 9.0
    log.compiled(1, phase, 8.5)
    for step in range(1, 12):
        log.push(step, step_values(1.0, 1.0), phase)
        clock[0] += 2.0 if step < 8 else 30.0  # then a slow stretch: a line every 20 s
    log.flush()
    writer.close()
    assert lines[0] == "step 1/100: phase 1's train step compiled and dispatched in 8.5 s"
    assert lines[1] == "step 2/100: 0.5 steps/s, ETA 3m16s"
    assert lines[2] == "step 5/100: 0.5 steps/s, ETA 3m10s"
    assert [line.split("/")[0] for line in lines[3:]] == ["step 8", "step 9", "step 10", "step 11"]
    assert not os.path.exists(writer.jsonl_path)  # progress lines write no metrics rows
    # After a pause (an evaluation) the rate is measured afresh and the silence counts anew.
    lines.clear()
    log.paused()
    for step in range(12, 15):
        log.push(step, step_values(1.0, 1.0), phase)
        clock[0] += 4.0
    log.flush()
    assert lines == []  # 12 s since the pause: no line due
    clock[0] += 20.0
    log.push(15, step_values(1.0, 1.0), phase)
    log.flush()
    assert lines == ["step 15/100: 0.107 steps/s, ETA 13m13s"]  # 28 s over steps 13-15


def test_the_rate_is_in_steps_per_second_whatever_the_speed():
    """One unit, fast or slow (the lines flipped between steps/s and s/step at 1 s a step)."""
    lines = [step_log.progress_line(2, 100, seconds, 60.0) for seconds in (0.25, 1.0, 4.0, 30.0)]
    assert [line.split(": ")[1].split(",")[0] for line in lines] == [
        "4 steps/s",
        "1 steps/s",
        "0.25 steps/s",
        "0.0333 steps/s",
    ]
