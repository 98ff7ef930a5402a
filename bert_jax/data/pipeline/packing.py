"""Sequence packing: several short pretraining instances in one row, losses unchanged.

At sequence length 512 a real corpus leaves much of every row as padding (about 40% on the
embedded corpus), and the model computes on it all the same. Packing puts several instances into
one row and tells the model where each one starts and ends, so that the row computes what the
instances would compute one per row:

- ``packed_segment_ids`` [B, L]: 1, 2, ... for the instances of a row, 0 for padding; attention
  stays within an instance (``model.attention_mask``).
- ``position_ids`` [B, L]: restart at 0 at every instance's [CLS].
- ``segment_ids`` [B, L]: each instance's own A/B token types.
- ``cls_positions`` [B, N]: where each instance's [CLS] sits (the pooler and NSP head read there),
  with ``next_sentence_labels`` [B, N] and ``next_sentence_weights`` [B, N] (0 for unused slots).
- ``masked_lm_positions`` / ``_ids`` / ``_weights`` [B, P]: every instance's predictions, shifted
  to where the instance lies in the row, in one list of P slots per row.

With dropout off, the MLM and NSP loss sums of a packed batch equal those of the same instances
unpacked (tests/test_packing.py checks it, gradients included); what changes is that a batch of B
packed rows holds more instances than B, so means are taken over more predictions per step.

Packing is a pure function of one batch (``pack_batch``): ``round(factor x B)`` unpacked rows go
in, B packed rows come out, instances that do not fit are dropped (and counted). Being
per-batch, it keeps an input pipeline's position exact: ``PackedIterator`` wraps any iterator of
unpacked batches and hands ``get_state``/``set_state`` straight through. Pure NumPy.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from bert_jax.runtime.errors import UserError

Batch = dict[str, np.ndarray]

PACKED_KEYS = (
    "input_ids",
    "input_mask",
    "segment_ids",
    "position_ids",
    "packed_segment_ids",
    "cls_positions",
    "masked_lm_positions",
    "masked_lm_ids",
    "masked_lm_weights",
    "next_sentence_labels",
    "next_sentence_weights",
)


@dataclasses.dataclass(frozen=True)
class PackingConfig:
    """Row budgets: tokens (``max_seq_length``), predictions and instances per packed row.

    ``factor``: unpacked rows read per packed row (``PackedIterator`` reads
    ``round(factor x batch_size)`` instances per batch). ``suggest_factor`` picks one from the
    data's lengths.
    """

    max_seq_length: int
    max_predictions_per_row: int
    max_instances_per_row: int = 16
    factor: float = 1.5

    def __post_init__(self):
        if self.max_instances_per_row < 1:
            raise UserError(f"max_instances_per_row must be >= 1, got {self.max_instances_per_row}")
        if self.factor < 1.0:
            raise UserError(
                f"packing factor must be >= 1 (unpacked rows per row), got {self.factor}"
            )

    def instances_per_batch(self, batch_size: int) -> int:
        return max(batch_size, int(round(self.factor * batch_size)))


@dataclasses.dataclass
class PackingStats:
    """What one or more calls of ``pack_batch`` did."""

    instances: int = 0
    dropped: int = 0
    rows: int = 0
    real_tokens: int = 0
    row_tokens: int = 0  # rows x max_seq_length

    def add(self, other: PackingStats) -> None:
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))

    @property
    def fill(self) -> float:
        """Share of row positions holding real tokens."""
        return self.real_tokens / max(self.row_tokens, 1)

    @property
    def instances_per_row(self) -> float:
        return (self.instances - self.dropped) / max(self.rows, 1)

    def summary(self) -> str:
        return (
            f"{self.instances - self.dropped} instances in {self.rows} rows "
            f"({self.instances_per_row:.2f} per row, {self.fill:.1%} of positions real), "
            f"{self.dropped} dropped (did not fit)"
        )


def instance_lengths(batch: Mapping[str, np.ndarray]) -> np.ndarray:
    """Real tokens per unpacked row (``input_mask`` is a prefix of ones)."""
    return np.asarray(batch["input_mask"]).astype(bool).sum(axis=1)


def suggest_factor(
    lengths: Sequence[int] | np.ndarray, max_seq_length: int, fill: float = 0.95
) -> float:
    """Unpacked rows per packed row that fill about ``fill`` of each row, in steps of 0.05."""
    mean = float(np.mean(lengths)) if len(lengths) else float(max_seq_length)
    factor = fill * max_seq_length / max(mean, 1.0)
    return max(1.0, math.floor(factor * 20) / 20)


def choose_factor(
    rows: Mapping[str, np.ndarray],
    batch_size: int,
    config: PackingConfig,
    max_dropped: float = 0.01,
) -> float:
    """The largest factor, from ``suggest_factor`` down in steps of 0.05, that drops at most
    ``max_dropped`` of the instances in ``rows`` (unpacked) when packed batch by batch."""
    lengths = instance_lengths(rows)
    factor = suggest_factor(lengths, config.max_seq_length)
    while factor > 1.0:
        candidate = dataclasses.replace(config, factor=factor)
        size = candidate.instances_per_batch(batch_size)
        stats = PackingStats()
        for start in range(0, len(lengths) - size + 1, size):
            group = {key: value[start : start + size] for key, value in rows.items()}
            stats.add(pack_batch(group, batch_size, candidate)[1])
        if stats.instances and stats.dropped <= max_dropped * stats.instances:
            return factor
        factor = round(factor - 0.05, 2)
    return 1.0


def assign_rows(
    lengths: np.ndarray,
    predictions: np.ndarray,
    num_rows: int,
    config: PackingConfig,
) -> np.ndarray:
    """Row of every instance by first fit in input order, -1 when none has room.

    An instance fits a row with enough tokens, prediction slots and instance slots left. Input
    order rather than longest first: when a batch overflows, what is dropped is whatever came
    last in the (shuffled) input, not systematically the short instances (first-fit decreasing
    fills rows with long instances and leaves the short ones out, which would skew the data).
    """
    tokens_left = np.full((num_rows,), config.max_seq_length, np.int64)
    slots_left = np.full((num_rows,), config.max_predictions_per_row, np.int64)
    count = np.zeros((num_rows,), np.int64)
    rows = np.full((len(lengths),), -1, np.int64)
    for index in range(len(lengths)):
        fits = (
            (tokens_left >= lengths[index])
            & (slots_left >= predictions[index])
            & (count < config.max_instances_per_row)
        )
        if not fits.any():
            continue
        row = int(np.argmax(fits))
        rows[index] = row
        tokens_left[row] -= lengths[index]
        slots_left[row] -= predictions[index]
        count[row] += 1
    return rows


def empty_packed_batch(num_rows: int, config: PackingConfig) -> Batch:
    length, slots, n = (
        config.max_seq_length,
        config.max_predictions_per_row,
        config.max_instances_per_row,
    )
    ints = lambda *shape: np.zeros(shape, np.int32)  # noqa: E731
    return {
        "input_ids": ints(num_rows, length),
        "input_mask": ints(num_rows, length),
        "segment_ids": ints(num_rows, length),
        "position_ids": ints(num_rows, length),
        "packed_segment_ids": ints(num_rows, length),
        "cls_positions": ints(num_rows, n),
        "masked_lm_positions": ints(num_rows, slots),
        "masked_lm_ids": ints(num_rows, slots),
        "masked_lm_weights": np.zeros((num_rows, slots), np.float32),
        "next_sentence_labels": ints(num_rows, n),
        "next_sentence_weights": np.zeros((num_rows, n), np.float32),
    }


def pack_batch(
    unpacked: Mapping[str, np.ndarray], num_rows: int, config: PackingConfig
) -> tuple[Batch, PackingStats]:
    """Packs the instances of an unpacked batch (the pipeline's format) into ``num_rows`` rows.

    Instances are the rows of ``unpacked`` with at least one real token; those that fit nowhere
    are dropped (see ``PackingStats.dropped``). Within a row, instances keep their input order.
    """
    lengths = instance_lengths(unpacked)
    if lengths.size and lengths.max() > config.max_seq_length:
        raise ValueError(
            f"an instance has {int(lengths.max())} tokens; packed rows hold {config.max_seq_length}"
        )
    weights = np.asarray(unpacked["masked_lm_weights"])
    predictions = (weights > 0).sum(axis=1)
    real = np.flatnonzero(lengths > 0)
    rows = np.full((len(lengths),), -1, np.int64)
    rows[real] = assign_rows(lengths[real], predictions[real], num_rows, config)

    out = empty_packed_batch(num_rows, config)
    input_ids = np.asarray(unpacked["input_ids"])
    segment_ids = np.asarray(unpacked["segment_ids"])
    positions = np.asarray(unpacked["masked_lm_positions"])
    ids = np.asarray(unpacked["masked_lm_ids"])
    labels = np.asarray(unpacked["next_sentence_labels"]).reshape(len(lengths))
    offset = np.zeros((num_rows,), np.int64)
    slot = np.zeros((num_rows,), np.int64)
    count = np.zeros((num_rows,), np.int64)
    for index in np.flatnonzero(rows >= 0):  # input order within each row
        row, n, k = int(rows[index]), int(lengths[index]), int(predictions[index])
        start, first_slot, j = int(offset[row]), int(slot[row]), int(count[row])
        span = slice(start, start + n)
        out["input_ids"][row, span] = input_ids[index, :n]
        out["input_mask"][row, span] = 1
        out["segment_ids"][row, span] = segment_ids[index, :n]
        out["position_ids"][row, span] = np.arange(n, dtype=np.int32)
        out["packed_segment_ids"][row, span] = j + 1
        out["cls_positions"][row, j] = start
        out["next_sentence_labels"][row, j] = labels[index]
        out["next_sentence_weights"][row, j] = 1.0
        valid = np.flatnonzero(weights[index] > 0)
        slots = slice(first_slot, first_slot + k)
        out["masked_lm_positions"][row, slots] = positions[index, valid] + start
        out["masked_lm_ids"][row, slots] = ids[index, valid]
        out["masked_lm_weights"][row, slots] = weights[index, valid]
        offset[row] += n
        slot[row] += k
        count[row] += 1
    stats = PackingStats(
        instances=len(real),
        dropped=int((rows[real] < 0).sum()),
        rows=num_rows,
        real_tokens=int(offset.sum()),
        row_tokens=num_rows * config.max_seq_length,
    )
    return out, stats


class PackedIterator:
    """Packed batches of ``batch_size`` rows from an iterator of unpacked batches.

    The wrapped iterator must yield ``config.instances_per_batch(batch_size)`` rows per batch.
    Each output batch is a function of one input batch, so the position is the wrapped
    iterator's: ``get_state``/``set_state`` pass straight through and resume stays exact.
    """

    def __init__(
        self, unpacked: Iterator[Mapping[str, np.ndarray]], batch_size: int, config: PackingConfig
    ):
        self.unpacked = unpacked
        self.batch_size = batch_size
        self.config = config
        self.stats = PackingStats()

    def __iter__(self) -> PackedIterator:
        return self

    @property
    def corrupt_files(self) -> dict[str, int]:
        """Damaged files the reader skipped (``PretrainIterator.corrupt_files``)."""
        return getattr(self.unpacked, "corrupt_files", {})

    @property
    def corrupt_records(self) -> int:
        """Damaged records the reader skipped (``PretrainIterator.corrupt_records``)."""
        return len(self.corrupt_files)

    def __next__(self) -> Batch:
        batch = next(self.unpacked)
        expected = self.config.instances_per_batch(self.batch_size)
        if len(batch["input_ids"]) != expected:
            raise ValueError(
                f"packing {self.batch_size} rows at factor {self.config.factor} reads {expected} "
                f"unpacked rows per batch, got {len(batch['input_ids'])}"
            )
        packed, stats = pack_batch(batch, self.batch_size, self.config)
        self.stats.add(stats)
        return packed

    def get_state(self) -> Any:
        return self.unpacked.get_state()

    def set_state(self, state: Any) -> None:
        self.unpacked.set_state(state)
