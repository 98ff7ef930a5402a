"""A task's splits as fixed-length arrays, and the batches a run reads from them, each padded to
its length bucket.

Splits keep every row at `max_seq_length` (the stored arrays); a batch is cut from them to the
shortest bucket (`bucket_lengths`) that holds its longest real row (`padded_length`), so the
compiled steps see a handful of static shapes and no step computes more than about half again
the positions its rows need. Padding is masked everywhere it could count (attention's keys, the
pooled mean, the per-token losses), so a batch's outputs at its real positions do not depend on
which bucket it was padded to. `gather_rows` is the one gather every task uses, for training,
evaluation and prediction.

The last training and evaluation batches are filled up with rows of weight 0. The training order
is deterministic given the seed; `group_by_length` orders rows into batches of similar length.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping, Sequence
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


def train_order(
    num_examples: int,
    epochs: float,
    batch_size: int,
    seed: int,
    lengths: np.ndarray | None = None,
) -> np.ndarray:
    """Row indices of every training batch, [steps, batch_size]; -1 marks padding rows.

    Each epoch is a fresh permutation cut into `steps_per_epoch` batches, the last one partial, so
    every example is seen once per epoch; a fractional last epoch takes its first batches. With
    `lengths` (each row's real tokens: `group_by_length`), each permutation is then cut into
    mega-batches of `group_size` rows, each sorted by length (longest first), as transformers'
    LengthGroupedSampler does: batches of similar length, in an order still drawn by the seed.
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
        permutation = rng.permutation(num_examples)
        if lengths is not None:
            permutation = grouped_by_length(permutation, lengths, batch_size)
        order[epoch, :num_examples] = permutation
    return order.reshape(epochs_started * per_epoch, batch_size)[:total]


def group_size(num_examples: int, batch_size: int) -> int:
    """Rows in a `group_by_length` mega-batch: transformers' rule, 50 batches, fewer where the
    data holds less than 200 batches (a quarter of the data's batches), at least one batch."""
    return max(1, min(num_examples // (batch_size * 4), 50)) * batch_size


def grouped_by_length(permutation: np.ndarray, lengths: np.ndarray, batch_size: int) -> np.ndarray:
    """`permutation` with each mega-batch of `group_size` rows sorted by length, longest first
    (ties keep the permutation's order): the same rows, in batches of similar length."""
    size = group_size(len(permutation), batch_size)
    grouped = [
        chunk[np.argsort(-lengths[chunk], kind="stable")]
        for chunk in np.split(permutation, range(size, len(permutation), size))
    ]
    return np.concatenate(grouped)


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


# ------------------------------------------------------------------------------------------------
# Length buckets
# ------------------------------------------------------------------------------------------------

# The shortest bucket: GLUE's single sentences are 10-30 tokens, and below 16 a step's fixed
# costs outweigh the positions saved (each bucket more is one compile more).
SHORTEST_BUCKET = 16


def bucket_lengths(max_seq_length: int) -> tuple[int, ...]:
    """The lengths a batch may be padded to: 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, ...
    (each power of two and the 1.5x one between) below `max_seq_length`, then `max_seq_length`.

    Each bucket is at most 1.5x the one below, so a batch computes at most 1.5x the positions its
    longest row needs (about 1.2x on average), and their number grows with the log of the length
    (7 at 128, 10 at 384, 11 at 512): a run compiles the few its batches reach (random batches of
    16 or 32 rows reach 1-3, their longest rows being alike). Every bucket is a multiple of 8
    (the sublane tile of accelerators). Multiples of 16 or 32 would fit mid-length batches closer
    but take 24-32 shapes at 384-512, a compile each where a run reaches them (evaluation sorts
    its rows by length and reaches every one); measured on prose SWAG rows at 128 tokens,
    multiples of 16 pad 1.81x the real tokens and this ladder 2.05x, with one shape fewer.
    """
    ladder, power = [], SHORTEST_BUCKET
    while power < max_seq_length:  # 16, 24, 32, 48, ...
        ladder += [length for length in (power, power * 3 // 2) if length < max_seq_length]
        power *= 2
    return (*ladder, max_seq_length)


def padded_length(real_lengths: np.ndarray | Sequence[int], buckets: Sequence[int]) -> int:
    """The length a batch is padded to: the shortest of `buckets` (ascending) that holds its
    longest row (`real_lengths`: each row's real tokens, `row_lengths`); the longest bucket for an
    empty batch. A row longer than every bucket is a ValueError (the buckets end at the stored
    length, which holds every row)."""
    longest = int(np.max(real_lengths)) if len(real_lengths) else buckets[-1]
    for length in buckets:
        if length >= longest:
            return int(length)
    raise ValueError(f"a row of {longest} tokens is longer than every bucket {tuple(buckets)}")


def row_lengths(input_mask: np.ndarray) -> np.ndarray:
    """Each row's real tokens, [N] from `input_mask` [N, ..., L]: one past its last unmasked
    position (a multiple-choice row: its longest choice)."""
    if input_mask.shape[-1] == 0:
        return np.zeros(len(input_mask), np.int64)
    positions = np.arange(1, input_mask.shape[-1] + 1)
    ends = np.max(np.where(input_mask != 0, positions, 0), axis=-1)
    return ends.reshape(len(input_mask), -1).max(axis=1)


def gather_rows(
    arrays: Mapping[str, np.ndarray], rows: np.ndarray, buckets: Sequence[int] | None = None
) -> dict[str, np.ndarray]:
    """This host's share of the global batch `rows` (row indices of `arrays`; -1: a padding row,
    which repeats row 0 with weight 0), with its `weights` (and `label_weights`, where given,
    times them).

    `arrays` hold one row per example; those shaped like `input_ids` ([N, ..., L]: the token
    arrays, per-token labels) are cut on their last axis to the bucket of the global batch's
    longest real row (`padded_length` over `buckets`, default `bucket_lengths(L)`; `(L,)` keeps
    the stored length), the same on every host; the rest ([N] labels, answer positions) are
    taken whole.
    """
    stored = arrays["input_ids"].shape[1:]
    buckets = bucket_lengths(stored[-1]) if buckets is None else buckets
    real = rows[rows >= 0]
    length = min(padded_length(row_lengths(arrays["input_mask"][real]), buckets), stored[-1])
    local = host_rows(rows)
    valid = local >= 0
    picked = np.where(valid, local, 0)
    batch = {
        key: (value[..., :length] if value.shape[1:] == stored else value)[picked]
        for key, value in arrays.items()
    }
    batch["weights"] = valid.astype(np.float32)
    if "label_weights" in batch:
        batch["label_weights"] = batch["label_weights"] * batch["weights"][:, None]
    return batch


def gather_batch(
    split: EncodedSplit, rows: np.ndarray, buckets: Sequence[int] | None = None
) -> dict[str, np.ndarray]:
    """`gather_rows` of a sentence task's split: features, labels (where the split has them),
    weights."""
    arrays = dict(split.features)
    if split.labels is not None:
        arrays["labels"] = split.labels
    return gather_rows(arrays, rows, buckets)


@dataclasses.dataclass
class Buckets:
    """A run's buckets (`for_settings`), and the padded lengths its batches took: the shapes its
    train and predict steps compiled, which `summary` gives in one line."""

    lengths: tuple[int, ...]
    used: dict[str, set[int]] = dataclasses.field(default_factory=dict)

    @classmethod
    def for_settings(cls, settings: Any) -> Buckets:
        """`bucket_lengths(max_seq_length)`, or that length alone with `pad_to_max_length`."""
        length = settings.max_seq_length
        return cls((length,) if settings.pad_to_max_length else bucket_lengths(length))

    def gather(
        self, arrays: Mapping[str, np.ndarray], rows: np.ndarray, kind: str = "train"
    ) -> dict[str, np.ndarray]:
        """`gather_rows` over these buckets, its length noted under `kind` (train, predict)."""
        batch = gather_rows(arrays, rows, self.lengths)
        self.used.setdefault(kind, set()).add(int(batch["input_ids"].shape[-1]))
        return batch

    def predicting(
        self, arrays: Mapping[str, np.ndarray], batch_size: int
    ) -> Iterator[tuple[np.ndarray, dict[str, np.ndarray]]]:
        """Prediction's batches of `arrays` (`predict_batches` of their rows, each padded to its
        bucket, without weights), each with its global rows (-1: padding)."""
        for rows in predict_batches(row_lengths(arrays["input_mask"]), batch_size):
            batch = self.gather(arrays, rows, "predict")
            batch.pop("weights")
            yield rows, batch

    def summary(self) -> str:
        """`compiled shapes: train 2 (64, 96), predict 3 (64, 96, 128) of buckets 32, ...`."""
        kinds = ", ".join(
            f"{kind} {len(used)} ({', '.join(map(str, sorted(used)))})"
            for kind, used in sorted(self.used.items(), key=lambda item: item[0] != "train")
        )
        return f"compiled shapes: {kinds or 'none'} of buckets {', '.join(map(str, self.lengths))}"


def predict_batches(lengths: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """The global batches prediction takes over rows of `lengths` (`row_lengths`): every row once,
    in order of length, so that each batch pads to the bucket of rows like it; the last batch is
    filled up with -1 (padding rows). A row's outputs do not depend on its batch."""
    order = np.argsort(lengths, kind="stable")
    padded = np.full(steps_per_epoch(len(order), batch_size) * batch_size, -1, np.int64)
    padded[: len(order)] = order
    return list(padded.reshape(-1, batch_size))


def micro_batch_count(rows: int, positions_per_row: int, budget: int, divisor: int = 1) -> int:
    """The micro-batches a training batch of `rows` (each `positions_per_row` padded positions:
    a multiple-choice row counts every choice) runs as: the fewest that split it into equal
    micro-batches of a multiple of `divisor` rows (the data-parallel size) holding at most
    `budget` positions each; where none does, the most there can be; 1 with `budget` 0.

    SWAG's 16 rows of 4 choices at 96 tokens under 2048: 4 (4 rows, 1536 positions each)."""
    if budget <= 0:
        return 1
    fewest = 1
    for count in range(1, rows + 1):
        if rows % count or (rows // count) % divisor:
            continue
        fewest = count
        if rows // count * positions_per_row <= budget:
            break
    return fewest
