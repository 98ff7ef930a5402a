"""The training loop's step log: each step's metrics read one step behind the device, summed
over a window into a metrics row (losses, accuracies, rates) and its console line, progress lines
between rows, non-finite steps skipped and counted.

The console lines, their early progress lines (rate and ETA before the first logging interval)
and the JSONL/TensorBoard rows (a `metric_writers.MetricWriter`) are one record of a step,
written together here.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from bert_jax.core import losses
from bert_jax.core.model import BertConfig
from bert_jax.training.flops import Throughput


class TrainWindow:
    """The training steps since the last metrics row: summed losses, gradient norms, throughput.

    `count` takes every step's tokens (skipped steps took time too), `add` the finite steps'
    sums; `row` turns the window into a metrics row and starts a new one.
    """

    SUMMED = (
        "mlm_loss_sum",
        "mlm_correct_sum",
        "mlm_weight",
        "nsp_loss_sum",
        "nsp_correct_sum",
        "nsp_weight",
    )

    def __init__(self, config: BertConfig, num_chips: int, device_kind: str):
        self.throughput = Throughput(config, num_chips, device_kind)
        self._clear()

    def _clear(self) -> None:
        self.sums: collections.Counter = collections.Counter()
        self.grad_norms: list[float] = []

    def count(self, values: Mapping[str, Any], batch_size: int, seq_len: int, predictions: int):
        self.throughput.add(int(values["real_tokens"]), batch_size, seq_len, predictions)

    def add(self, values: Mapping[str, Any]) -> None:
        for key in self.SUMMED:
            self.sums[key] += float(values[key])
        self.grad_norms.append(float(values["grad_norm"]))

    def row(self, values: Mapping[str, Any], phase: int, seq_len: int) -> dict[str, Any]:
        """The metrics row (losses, accuracies, rates) ending with the step of `values`."""
        summary = losses.summarize(self.sums)
        summary["grad_norm"] = float(np.mean(self.grad_norms))
        summary["learning_rate"] = float(values["learning_rate"])
        summary["phase"] = phase
        summary["seq_len"] = seq_len
        summary.update(self.throughput.summary())
        summary["skipped_steps_total"] = int(values["skipped_steps"])
        self._clear()
        self.throughput.reset()
        return summary


def train_line(step: int, total: int, row: Mapping[str, Any], eta_seconds: float) -> str:
    """The console line for a metrics row: each value after its name (loss, then accuracy)."""
    mfu = f" MFU {row['mfu']:.1%}" if "mfu" in row else ""
    nsp = (
        f" | nsp loss {row['nsp_loss']:.3f} acc {row['nsp_accuracy']:.3f}"
        if "nsp_loss" in row
        else ""
    )
    return (
        f"step {step}/{total} [phase {row['phase']}, seq {row['seq_len']}] "
        f"loss {row['loss']:.4f} | mlm loss {row['mlm_loss']:.3f} acc "
        f"{row['mlm_accuracy']:.3f}{nsp} | lr {row['learning_rate']:.2e} "
        f"gnorm {row['grad_norm']:.2f} | {row['tokens_per_sec']:.0f} tok/s "
        f"{row['sequences_per_sec']:.1f} seq/s "
        f"{row['model_tflops_per_sec']:.3f} TFLOP/s{mfu} | ETA "
        f"{format_duration(eta_seconds)}"
    )


def progress_line(step: int, total: int, seconds_per_step: float, eta_seconds: float) -> str:
    """A console line between metrics rows: where the run is, its rate (in steps/s, as
    fine-tuning's lines, whatever the speed) and ETA."""
    rate = 1 / max(seconds_per_step, 1e-9)
    return f"step {step}/{total}: {rate:.3g} steps/s, ETA {format_duration(eta_seconds)}"


def format_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


class NonFiniteError(RuntimeError):
    """Too many consecutive steps had a non-finite loss or gradient."""


class StepLog:
    """Reads each step's metrics one step behind the device: a non-finite step is skipped and
    counted (too many in a row stop the run), the others go into the window, written as a row
    every `log_every_steps` and at the last step.

    `push` hands over the step just dispatched (with its `config_lib.Phase`) and reads the one
    before; `flush` reads the pending step now (before a checkpoint and at the end). Between rows
    the console gets a progress line (rate, ETA) at the first steps of the run and whenever
    `PROGRESS_SECONDS` pass without a line; `compiled` reports a phase's first step.
    """

    PROGRESS_SECONDS = 20.0
    # Steps after which, early in a run, a progress line is printed when no row is due.
    EARLY_STEPS = (2, 5)

    def __init__(self, config, total: int, model_config, writer, console, checkpointer):
        self.config, self.total, self.writer, self.console = config, total, writer, console
        self.checkpointer = checkpointer
        self.window = TrainWindow(model_config, jax.device_count(), jax.devices()[0].device_kind)
        self.last_train: dict[str, float] = {}
        self.consecutive_bad = 0
        self.dispatched = 0  # steps run by this process (for the ETA)
        self.start = time.perf_counter()
        self._last_line = self.start
        self._rate_from: tuple[int, float] | None = None  # (step, time) after the compile
        self._pending = None
        self._corrupt_seen: set[str] = set()

    def compiled(self, step: int, phase: Any, seconds: float) -> None:
        """The first step of `phase` (number `step`) was compiled and dispatched in `seconds`."""
        self.flush()  # the steps before it are said first
        self.console(
            f"step {step}/{self.total}: phase {phase.index + 1}'s train step compiled and "
            f"dispatched in {seconds:.1f} s"
        )
        self._last_line = time.perf_counter()
        self._rate_from = None  # the next read steps measure the rate without the compile

    def paused(self) -> None:
        """The loop did something else (an evaluation, a checkpoint) and said so: the rate is
        measured afresh, and the silence counts from now."""
        self._last_line = time.perf_counter()
        self._rate_from = None

    def _eta(self, step: int) -> tuple[float, float]:
        """(seconds per step, ETA): measured since the last compile where possible."""
        now = time.perf_counter()
        if self._rate_from is not None and step > self._rate_from[0]:
            per_step = (now - self._rate_from[1]) / (step - self._rate_from[0])
        else:
            per_step = (now - self.start) / max(self.dispatched, 1)
        return per_step, per_step * (self.total - step)

    def push(self, step: int, device_metrics: Any, phase: Any) -> None:
        self.dispatched += 1
        self.flush()
        self._pending = (step, device_metrics, phase)

    def note_corrupt_files(self, step: int, corrupt_files: Mapping[str, int]) -> None:
        """Logs, once each, the damaged record files the input pipeline skips
        (`config.data.skip_corrupt_records`): an event row and a console line per file."""
        for path, index in corrupt_files.items():
            if path not in self._corrupt_seen:
                self._corrupt_seen.add(path)
                event = {"event": "corrupt_records_skipped", "file": path, "from_record": index}
                self.writer.write(step, event, kind="event")
                self.console(f"step {step}: skipping {path} from record {index} (damaged)")

    def flush(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._read(*pending)

    def _read(self, step: int, device_metrics: Any, phase: Any) -> None:
        values = jax.device_get(device_metrics)
        if self._rate_from is None:
            self._rate_from = (step, time.perf_counter())
        self.window.count(
            values, phase.batch_size, phase.max_seq_length, phase.max_predictions_per_seq
        )
        if not bool(values["finite"]):
            self._skipped(step)
            return
        self.consecutive_bad = 0
        self.window.add(values)
        now = time.perf_counter()
        if step % int(self.config.log_every_steps) == 0 or step == self.total:
            row = self.window.row(values, phase.index + 1, phase.max_seq_length)
            _, eta = self._eta(step)
            self.writer.write(step, row)
            self.console(train_line(step, self.total, row, eta))
            self.last_train = row
            self._last_line = now
        elif step in self.EARLY_STEPS or now - self._last_line >= self.PROGRESS_SECONDS:
            per_step, eta = self._eta(step)
            self.console(progress_line(step, self.total, per_step, eta))
            self._last_line = now

    def _skipped(self, step: int) -> None:
        self.consecutive_bad += 1
        self.writer.write(step, {"event": "non_finite_step_skipped"}, kind="event")
        self.console(f"step {step}: non-finite loss or gradient; update skipped")
        limit = int(self.config.max_consecutive_nonfinite)
        if self.consecutive_bad > limit:
            raise NonFiniteError(
                f"{self.consecutive_bad} consecutive steps up to step {step} had a "
                f"non-finite loss or gradient (config.max_consecutive_nonfinite={limit}); "
                f"stopping. The last good checkpoint is step {self.checkpointer.latest_step()} "
                f"in {self.checkpointer.directory}"
            )
