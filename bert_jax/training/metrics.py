"""Metrics: writers (JSONL, TensorBoard, console), training windows, the step log of the loop,
evaluation, FLOPs and MFU.

FLOPs per trained token (forward + backward = 3x forward, 2 FLOPs per multiply-add):

    F = 6 * L * (4 d^2 + 2 d f)  +  12 * L * s * d  +  6 * m * (d^2 + d V)

with L layers, hidden d, feed-forward f (4d in BERT, which gives the usual 72 L d^2), sequence
length s, vocabulary V and m the share of positions that reach the MLM head (predictions / s when
masked positions are gathered). MFU = real (non-pad) tokens/s x F / peak FLOP/s of the chips.

Why this file is long: the loop's console lines, their early progress lines (rate and ETA before
the first logging interval) and the JSONL/TensorBoard rows are one record of a step, written
together; splitting the writers from the windows would pass that record between files.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from bert_jax.core import losses
from bert_jax.core.model import BertConfig
from bert_jax.data import objectives
from bert_jax.runtime import fs, hardware


def peak_flops_per_chip(device_kind: str) -> float | None:
    """Peak bf16 FLOP/s of one chip, or None when unknown (e.g. CPU: no MFU is reported); from
    the hardware table (`runtime/hardware.py`), by exact device kind."""
    return hardware.peak_flops(device_kind)


def head_share(config: BertConfig, seq_len: int, predictions: int) -> float:
    """The share of positions that reach the MLM head: every one for the left-to-right
    objective (each predicts the next token), else the masked-LM slots."""
    return 1.0 if config.objective == "ltr" else predictions / seq_len


def flops_per_token(
    config: BertConfig, seq_len: int, mlm_fraction: float, last_layer_fraction: float = 1.0
) -> float:
    """Training FLOPs per token (model FLOPs: no recomputation counted).

    `last_layer_fraction` < 1 counts what a sparse last layer computes (`sparse_last_layer`):
    keys and values at every position, the rest of the layer at that share of positions only.
    """
    d, f, n_layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    dense = 6 * n_layers * (4 * d * d + 2 * d * f)
    attention = 12 * n_layers * seq_len * d
    head = 6 * mlm_fraction * (d * d + d * config.vocab_size)
    # Skipped in the last layer: queries, attention output, FFN, and the attention itself.
    skipped = (1.0 - last_layer_fraction) * (6 * (2 * d * d + 2 * d * f) + 12 * seq_len * d)
    return float(dense + attention + head - skipped)


class Throughput:
    """Tokens and sequences per second over a window of steps, and MFU when the chip is known."""

    def __init__(self, config: BertConfig, num_chips: int, device_kind: str):
        self.config = config
        self.num_chips = num_chips
        self.peak = peak_flops_per_chip(device_kind)
        self.reset()

    def reset(self) -> None:
        self._start = time.perf_counter()
        self._real_tokens = 0
        self._padded_tokens = 0
        self._sequences = 0
        self._flops = 0.0

    def add(self, real_tokens: int, batch_size: int, seq_len: int, predictions: int) -> None:
        self._real_tokens += real_tokens
        self._padded_tokens += batch_size * seq_len
        self._sequences += batch_size
        share = head_share(self.config, seq_len, predictions)
        self._flops += real_tokens * flops_per_token(self.config, seq_len, share)

    def summary(self) -> dict[str, float]:
        elapsed = max(time.perf_counter() - self._start, 1e-9)
        out = {
            "tokens_per_sec": self._real_tokens / elapsed,
            "padded_tokens_per_sec": self._padded_tokens / elapsed,
            "sequences_per_sec": self._sequences / elapsed,
            "model_tflops_per_sec": self._flops / elapsed / 1e12,
        }
        if self.peak:
            out["mfu"] = self._flops / elapsed / (self.peak * self.num_chips)
        return out


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
    """A console line between metrics rows: where the run is, its rate and ETA."""
    rate = (
        f"{seconds_per_step:.2f} s/step"
        if seconds_per_step >= 1
        else f"{1 / max(seconds_per_step, 1e-9):.1f} steps/s"
    )
    return f"step {step}/{total}: {rate}, ETA {format_duration(eta_seconds)}"


class EvalSums:
    """Held-out sums over batches: the losses and weights the eval step returns, and the target
    counts behind the always-the-most-frequent-token baseline (rows of weight 0 count nothing)."""

    def __init__(self, vocab_size: int, objective: str = objectives.DEFAULT_OBJECTIVE):
        self.objective = objective
        self.sums: collections.Counter = collections.Counter()
        self.counts = np.zeros((vocab_size,), np.float64)
        self.rows = 0

    def add(self, local: Mapping[str, Any], step_sums: Mapping[str, Any]) -> None:
        """`local`: the batch; `step_sums`: what the eval step returned for it."""
        out = jax.device_get(step_sums)
        self.sums.update({k: float(v) for k, v in out.items()})
        if self.objective == "ltr":  # the targets are every next token
            ids, weights = local["input_ids"][:, 1:], local["input_mask"][:, 1:]
        else:
            ids, weights = local["masked_lm_ids"], local["masked_lm_weights"]
        np.add.at(self.counts, np.asarray(ids).ravel(), np.asarray(weights, np.float64).ravel())
        self.rows += len(local["input_ids"])

    def result(self) -> dict[str, float]:
        summary = losses.summarize(self.sums)
        summary["mlm_baseline_accuracy"] = float(self.counts.max() / max(self.counts.sum(), 1e-9))
        summary["examples"] = self.rows
        return summary


def evaluate(
    eval_step: Callable[[dict[str, np.ndarray]], Mapping[str, Any]],
    batches: list[dict[str, np.ndarray]],
    vocab_size: int,
    objective: str = objectives.DEFAULT_OBJECTIVE,
) -> dict[str, float]:
    """Held-out MLM accuracy and perplexity (and NSP accuracy where the objective has NSP), with
    the always-the-most-frequent-token baseline.

    `eval_step(local_batch)` returns the batch's summed losses and weights (all hosts together).
    """
    sums = EvalSums(vocab_size, objective)
    for local in batches:
        sums.add(local, eval_step(local))
    return sums.result()


def format_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def summary_writer_class() -> type:
    """tensorboardX's `SummaryWriter`, imported without PyTorch.

    tensorboardX imports torch, where it is installed, only to accept torch tensors; the writer
    here passes Python numbers. Hidden while tensorboardX is imported, it costs each training
    process 0.3 s and 70 MB instead of 1.3 s and 250 MB (measured on a host with torch, as the
    GPU images have). A torch that is already imported stays as it is, and one imported later
    imports as usual: only the name's placeholder is removed.
    """
    hide = "torch" not in sys.modules
    if hide:
        sys.modules["torch"] = None  # type: ignore[assignment]  (`import torch` raises ImportError)
    try:
        from tensorboardX import SummaryWriter
    finally:
        if hide and sys.modules.get("torch", ...) is None:
            del sys.modules["torch"]
    return SummaryWriter


class MetricWriter:
    """Writes scalars as JSONL (`metrics.jsonl`) and TensorBoard events (`tensorboard/`).

    Only process 0 writes; every process may call it. `log_dir` is created on first use.
    """

    def __init__(self, log_dir: str, enabled: bool = True, tensorboard: bool = True):
        self.log_dir = log_dir
        self.enabled = enabled
        self._jsonl = None
        self._tb = None
        self._tb_opened = 0
        self._tensorboard = tensorboard
        # In a bucket (objects are written whole, never appended to): the file's rows, uploaded
        # whole after each write; TensorBoard's events go to a local directory, uploaded likewise.
        self._remote_rows: list[str] | None = None
        self._tb_local: str | None = None

    @property
    def jsonl_path(self) -> str:
        return os.path.join(self.log_dir, "metrics.jsonl")

    @property
    def tensorboard_dir(self) -> str:
        return os.path.join(self.log_dir, "tensorboard")

    def write(self, step: int, scalars: Mapping[str, Any], kind: str = "train") -> None:
        if not self.enabled:
            return
        record = {"step": int(step), "kind": kind, **{k: _plain(v) for k, v in scalars.items()}}
        if fs.is_remote(self.log_dir):
            if self._remote_rows is None:
                old = fs.read_text(self.jsonl_path) if fs.exists(self.jsonl_path) else ""
                self._remote_rows = [old] if old else []
            self._remote_rows.append(json.dumps(record) + "\n")
            fs.write_text(self.jsonl_path, "".join(self._remote_rows))
        else:
            if self._jsonl is None:
                fs.makedirs(self.log_dir, exist_ok=True)
                self._jsonl = fs.open(self.jsonl_path, "a", encoding="utf-8")  # noqa: SIM115
            self._jsonl.write(json.dumps(record) + "\n")
            self._jsonl.flush()
        if self._tensorboard:
            if self._tb is None:
                SummaryWriter = summary_writer_class()  # noqa: N806
                target = self.tensorboard_dir
                if fs.is_remote(target):
                    self._tb_local = target = tempfile.mkdtemp(prefix="bert_jax_tb-")
                # One file per writer opened: tensorboardX names a file by the second and host
                # alone, and a writer reopened within the same second would overwrite it.
                self._tb_opened += 1
                suffix = f".{os.getpid()}.{self._tb_opened}"
                self._tb = SummaryWriter(target, filename_suffix=suffix)
            for key, value in scalars.items():
                value = _plain(value)  # NumPy scalars too
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._tb.add_scalar(f"{kind}/{key}", value, int(step))
            self._tb.flush()
            self._upload_events()

    def _upload_events(self) -> None:
        if self._tb_local is None:
            return
        for name in os.listdir(self._tb_local):
            fs.upload(os.path.join(self._tb_local, name), os.path.join(self.tensorboard_dir, name))

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
            self._upload_events()
        if self._tb_local is not None:
            shutil.rmtree(self._tb_local, ignore_errors=True)
            self._tb_local = None


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    return value


def read_jsonl(path: str, kind: str | None = None) -> list[dict[str, Any]]:
    """Records of a metrics.jsonl file (optionally only one kind: train, eval, event)."""
    with fs.open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r for r in rows if kind is None or r.get("kind") == kind]


def drop_rows_after(path: str, step: int) -> int:
    """Removes the rows of steps after `step` from a metrics.jsonl (a run resumed at `step` logs
    them again); returns how many. Rewritten atomically (a new file renamed over the old), so an
    interruption leaves the old file or the new one. A torn last line (a killed run) goes too."""
    if not fs.exists(path):
        return 0
    kept, dropped = [], 0
    with fs.open(path, encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
            except ValueError:
                dropped += bool(line.strip())
                continue
            if isinstance(row, dict) and int(row.get("step", 0)) > step:
                dropped += 1
            else:
                kept.append(line if line.endswith("\n") else line + "\n")
    if dropped and fs.is_remote(path):  # one object, replaced whole
        fs.write_text(path, "".join(kept))
    elif dropped:
        tmp = f"{path}.tmp-{os.getpid()}"
        with fs.open(tmp, "w", encoding="utf-8") as f:
            f.writelines(kept)
        fs.rename(tmp, path)
    return dropped


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
