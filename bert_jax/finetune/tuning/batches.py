"""A task's splits as fixed-length arrays, and the fixed-shape batches a run reads from them.

Batches have a fixed shape: the last training and evaluation batches are filled up with rows of
weight 0. The training order is deterministic given the seed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from bert_jax.finetune.tasks.glue import Example, SentenceTask, read_split
from bert_jax.runtime.errors import UserError

FEATURE_KEYS = ("input_ids", "input_mask", "segment_ids")


@dataclasses.dataclass(frozen=True)
class EncodedSplit:
    """One split as arrays: features [N, max_seq_length] (int32), labels [N] or None (test).

    Labels are class indices (int32) for classification and scores (float32) for regression.
    """

    split: str
    guids: tuple[str, ...]
    features: Mapping[str, np.ndarray]
    labels: np.ndarray | None

    def __len__(self) -> int:
        return len(self.guids)


def encode_split(
    task: SentenceTask, split: str, examples: Sequence[Example], tokenizer: Any, max_seq_length: int
) -> EncodedSplit:
    from bert_jax.data.tokenizers.pair_encoding import encode_pairs

    texts_b = [e.text_b or "" for e in examples] if task.is_pair else None
    features = encode_pairs(
        tokenizer, [e.text_a for e in examples], texts_b, max_seq_length=max_seq_length
    )
    labels = None
    if examples and examples[0].label is not None:
        if task.is_regression:
            labels = np.asarray([float(e.label) for e in examples], np.float32)
        else:
            assert task.labels is not None
            index = {label: i for i, label in enumerate(task.labels)}
            labels = np.asarray([index[e.label] for e in examples], np.int32)
    return EncodedSplit(split, tuple(e.guid for e in examples), features, labels)


@dataclasses.dataclass(frozen=True)
class TaskData:
    """A task's encoded train, dev and (optionally) test splits."""

    task: SentenceTask
    train: EncodedSplit
    dev: Mapping[str, EncodedSplit]
    test: Mapping[str, EncodedSplit]


def load_task_data(
    data: str,
    task: SentenceTask,
    tokenizer: Any,
    max_seq_length: int,
    test_splits: Sequence[str] = (),
) -> TaskData:
    """Read and encode a task's train and dev splits (and the given test splits)."""

    def encoded(split: str) -> EncodedSplit:
        return encode_split(task, split, read_split(data, task, split), tokenizer, max_seq_length)

    return TaskData(
        task=task,
        train=encoded("train"),
        dev={split: encoded(split) for split in task.dev_splits},
        test={split: encoded(split) for split in test_splits},
    )


def steps_per_epoch(num_examples: int, batch_size: int) -> int:
    """Batches in one pass over the data: the last one partial (filled up with rows of weight 0),
    as a PyTorch DataLoader without `drop_last` gives them (999 examples at batch 16: 63)."""
    return math.ceil(num_examples / batch_size)


def num_train_steps(num_examples: int, epochs: float, batch_size: int) -> int:
    """Optimizer steps of a run: `epochs` (may be fractional) times the steps of an epoch, rounded
    up, as Hugging Face's Trainer counts them."""
    return max(1, math.ceil(epochs * steps_per_epoch(num_examples, batch_size)))


def train_order(num_examples: int, epochs: float, batch_size: int, seed: int) -> np.ndarray:
    """Row indices of every training batch, [steps, batch_size]; -1 marks padding rows.

    Each epoch is a fresh permutation cut into `steps_per_epoch` batches, the last one partial, so
    every example is seen once per epoch; a fractional last epoch takes its first batches.
    """
    if num_examples <= 0:
        raise UserError("no training examples")
    if epochs <= 0:
        raise UserError(f"epochs must be positive, got {epochs}")
    rng = np.random.default_rng(seed)
    per_epoch = steps_per_epoch(num_examples, batch_size)
    total = num_train_steps(num_examples, epochs, batch_size)
    epochs_started = math.ceil(total / per_epoch)
    order = np.full((epochs_started, per_epoch * batch_size), -1, np.int64)
    for epoch in range(epochs_started):
        order[epoch, :num_examples] = rng.permutation(num_examples)
    return order.reshape(epochs_started * per_epoch, batch_size)[:total]


def epoch_end_steps(num_examples: int, epochs: float, batch_size: int) -> list[int]:
    """The number of steps after which each (whole) epoch has been seen completely."""
    per_epoch = steps_per_epoch(num_examples, batch_size)
    return [per_epoch * epoch for epoch in range(1, math.floor(epochs) + 1)]


def host_rows(global_rows: np.ndarray) -> np.ndarray:
    """This host's contiguous share of a global batch's rows."""
    count = jax.process_count()
    if len(global_rows) % count:
        raise ValueError(f"batch of {len(global_rows)} rows does not split over {count} hosts")
    share = len(global_rows) // count
    index = jax.process_index()
    return global_rows[index * share : (index + 1) * share]


def gather_batch(split: EncodedSplit, rows: np.ndarray) -> dict[str, np.ndarray]:
    """Features, labels and weights of `rows`; padding rows (-1) repeat row 0 with weight 0."""
    valid = rows >= 0
    picked = np.where(valid, rows, 0)
    batch = {key: split.features[key][picked] for key in FEATURE_KEYS}
    batch["weights"] = valid.astype(np.float32)
    if split.labels is not None:
        batch["labels"] = split.labels[picked]
    return batch
