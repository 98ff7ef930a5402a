"""metrics: JSONL/TensorBoard writers, training windows, evaluation, FLOPs checked by XLA."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest

from bert_jax.core import trainer
from bert_jax.core.model import BertConfig, BertForPreTraining
from bert_jax.training import metrics


def test_jsonl_rows_by_kind_and_tensorboard_events(tmp_path):
    writer = metrics.MetricWriter(str(tmp_path / "run"))
    writer.write(1, {"loss": np.float32(2.5), "phase": 1})
    writer.write(1, {"event": "non_finite_step_skipped"}, kind="event")
    writer.write(2, {"mlm_accuracy": 0.25}, kind="eval")
    writer.close()
    writer.write(3, {"loss": 2.0})  # reopens and appends
    writer.close()
    with open(writer.jsonl_path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    assert rows == [
        {"step": 1, "kind": "train", "loss": 2.5, "phase": 1},
        {"step": 1, "kind": "event", "event": "non_finite_step_skipped"},
        {"step": 2, "kind": "eval", "mlm_accuracy": 0.25},
        {"step": 3, "kind": "train", "loss": 2.0},
    ]
    assert [r["step"] for r in metrics.read_jsonl(writer.jsonl_path, kind="train")] == [1, 3]
    assert metrics.read_jsonl(writer.jsonl_path, kind="eval") == [rows[2]]
    # TensorBoard's events, read back: the numeric scalars under kind/name, at their steps.
    assert _tensorboard_scalars(pathlib.Path(writer.tensorboard_dir)) == [
        ("train/loss", 1, 2.5),
        ("train/phase", 1, 1.0),
        ("eval/mlm_accuracy", 2, 0.25),
        ("train/loss", 3, 2.0),
    ]


def _tensorboard_scalars(directory) -> list[tuple[str, int, float]]:
    """(tag, step, value) of every scalar in a directory's event files (TFRecord framing: a
    little-endian u64 length, its CRC, the Event proto, its CRC), files in the order written."""
    from tensorboardX.proto import event_pb2

    scalars = []
    for name in sorted(os.listdir(directory), key=lambda n: os.path.getmtime(directory / n)):
        data = (directory / name).read_bytes()
        while data:
            length = int.from_bytes(data[:8], "little")
            event = event_pb2.Event.FromString(data[12 : 12 + length])
            data = data[16 + length :]
            scalars += [(v.tag, event.step, v.simple_value) for v in event.summary.value]
    return scalars


def test_tensorboard_is_written_without_importing_torch():
    """tensorboardX imports PyTorch where it is installed (here it is): the writer hides it
    during that import, and a later `import torch` still works."""
    script = (
        "import sys, tempfile\n"
        "from bert_jax.training import metrics\n"
        "writer = metrics.MetricWriter(tempfile.mkdtemp())\n"
        "writer.write(1, {'loss': 1.0})\n"
        "writer.close()\n"
        "print('torch' in sys.modules)\n"
        "import torch\n"
        "print(torch.ones(2).sum().item())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    assert out.split() == ["False", "2.0"]


def test_a_disabled_writer_writes_nothing(tmp_path):
    """Processes other than 0 call the writer too; only process 0 writes."""
    writer = metrics.MetricWriter(str(tmp_path / "other"), enabled=False)
    writer.write(1, {"loss": 1.0})
    writer.close()
    assert not os.path.exists(tmp_path / "other")


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
    window = metrics.TrainWindow(BertConfig(), num_chips=1, device_kind="cpu")
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
    line = metrics.train_line(2, 10, row, eta_seconds=125)
    assert line.startswith("step 2/10 [phase 1, seq 64] loss ") and line.endswith("ETA 2m05s")
    # Each value after its name: which is the loss and which the accuracy.
    assert " | mlm loss 2.000 acc 0.500 | nsp loss 0.250 acc " in line, line
    # The next window starts empty.
    values = step_values(1.0, 1.0)
    window.add(values)
    assert window.row(values, phase=2, seq_len=128)["mlm_loss"] == pytest.approx(1.0)


def test_evaluate_reports_the_most_frequent_token_baseline():
    def eval_step(local):
        return {k: v for k, v in step_values(3.0, 4.0).items() if k.endswith(("_sum", "weight"))}

    batches = [
        {
            "input_ids": np.zeros((2, 8), np.int32),
            "masked_lm_ids": np.array([[5, 5], [5, 7]]),
            "masked_lm_weights": np.array([[1.0, 1.0], [1.0, 0.0]]),
        }
    ] * 2
    result = metrics.evaluate(eval_step, batches, vocab_size=10)
    assert result["mlm_baseline_accuracy"] == pytest.approx(1.0)  # padding (weight 0) not counted
    assert result["examples"] == 4
    assert result["mlm_loss"] == pytest.approx(6.0 / 8.0)


@pytest.mark.parametrize("sparse_last_layer", [False, True])
def test_flops_per_token_matches_xla_cost_analysis(sparse_last_layer):
    """The formula against XLA's own count of the compiled forward + backward.

    XLA counts every operation; the formula counts the matrix multiplies only (the MFU
    convention). What it leaves out (LayerNorm, GELU, softmax, bias adds, the loss, the pooler
    and NSP head) is 4.5% of XLA's count at this size (hidden 128, length 128) and shrinks as the
    hidden size grows. So XLA's count must lie between the formula and 6% above it: a missing or
    doubled term would leave that band (the MLM head's d x V term is 5% here, attention 13%).
    """
    d, seq_len, predictions, batch_size = 128, 128, 20, 4
    config = BertConfig(
        vocab_size=1024,
        hidden_size=d,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=4 * d,
        max_position_embeddings=seq_len,
        vocab_pad_multiple=1,
        sparse_last_layer=sparse_last_layer,
    )
    model = BertForPreTraining(config)
    batch = trainer.dummy_batch(batch_size, seq_len, predictions)
    params = jax.eval_shape(
        lambda: nn.meta.unbox(
            model.init(jax.random.key(0), **trainer.model_inputs(batch), deterministic=True)
        )
    )["params"]

    def loss(params, batch):
        sums = trainer.compute_sums(params, batch, model, deterministic=True)
        return sums["mlm_loss_sum"] + sums["nsp_loss_sum"]

    compiled = jax.jit(jax.grad(loss)).lower(params, batch).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    xla_per_token = cost["flops"] / (batch_size * seq_len)
    # A sparse last layer runs at the masked positions and [CLS] only.
    last_layer = (predictions + 1) / seq_len if sparse_last_layer else 1.0
    formula = metrics.flops_per_token(config, seq_len, predictions / seq_len, last_layer)
    assert formula <= xla_per_token <= 1.06 * formula, xla_per_token / formula


def test_peak_flops_by_device_kind():
    assert metrics.peak_flops_per_chip("TPU v5 lite") == 197e12
    assert metrics.peak_flops_per_chip("TPU v5") == 459e12  # v5p's device kind
    assert metrics.peak_flops_per_chip("TPU v6 lite") == 918e12
    assert metrics.peak_flops_per_chip("TPU v4") == 275e12
    assert metrics.peak_flops_per_chip("NVIDIA H100 80GB HBM3") == 989e12
    assert metrics.peak_flops_per_chip("cpu") is None


def test_skipped_record_files_are_logged_once_each(tmp_path):
    """With `data.skip_corrupt_records`, every damaged file the pipeline skips is one event row."""
    writer = metrics.MetricWriter(str(tmp_path / "run"), tensorboard=False)
    lines = []
    log = metrics.StepLog(None, 10, None, writer, lines.append, checkpointer=None)
    log.note_corrupt_files(3, {})
    log.note_corrupt_files(4, {"a.tfrecord": 7})
    log.note_corrupt_files(5, {"a.tfrecord": 7, "b.tfrecord": 0})
    writer.close()
    events = metrics.read_jsonl(writer.jsonl_path, kind="event")
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
    monkeypatch.setattr(metrics.time, "perf_counter", lambda: clock[0])
    writer = metrics.MetricWriter(str(tmp_path / "run"), tensorboard=False)
    lines = []
    config = types.SimpleNamespace(log_every_steps=50, max_consecutive_nonfinite=3)
    log = metrics.StepLog(config, 100, BertConfig(), writer, lines.append, checkpointer=None)
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
    assert lines[1] == "step 2/100: 2.00 s/step, ETA 3m16s"
    assert lines[2] == "step 5/100: 2.00 s/step, ETA 3m10s"
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
    assert lines == ["step 15/100: 9.33 s/step, ETA 13m13s"]  # 28 s over steps 13-15
