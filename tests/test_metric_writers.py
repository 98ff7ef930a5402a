"""metric_writers: metrics.jsonl rows by kind, TensorBoard events read back, a disabled writer."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np

from bert_jax.training import metric_writers


def test_jsonl_rows_by_kind_and_tensorboard_events(tmp_path):
    writer = metric_writers.MetricWriter(str(tmp_path / "run"))
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
    assert [r["step"] for r in metric_writers.read_jsonl(writer.jsonl_path, kind="train")] == [1, 3]
    assert metric_writers.read_jsonl(writer.jsonl_path, kind="eval") == [rows[2]]
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
        "from bert_jax.training import metric_writers\n"
        "writer = metric_writers.MetricWriter(tempfile.mkdtemp())\n"
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
    writer = metric_writers.MetricWriter(str(tmp_path / "other"), enabled=False)
    writer.write(1, {"loss": 1.0})
    writer.close()
    assert not os.path.exists(tmp_path / "other")
