"""Packed fine-tuning batches (`packing`): several examples laid end to end in sequences of one
static length, instead of one example a row padded to its bucket (`batches.Buckets`).

A unit is what a head reads as one: a sentence (pair) row, a CoNLL sentence, a SQuAD window, or
a multiple-choice example's choices. Units are packed first-fit decreasing into sequences of
`length` positions, at most `slots` units a sequence, each row keeping its own tokens and segment
ids, with `position_ids` restarting at 0, `packed_segment_ids` (1, 2, ...: the unit's slot + 1;
0 on padding) so that attention stays within the row, and `cls_positions` [sequences, slots,
choices] where each row starts (the pooled heads read there). A multiple-choice sequence is one
lane per choice ([sequences, choices, length]): choice c of every unit it holds lies in lane c,
so a lane is as long as the longest row, not four of them, and attention, whose cost grows with
the length, runs over rows of that length (SWAG's 128 instead of 512).
Per-example arrays (labels, [N]) become [sequences, slots], with `weights` 1 where a slot holds
an example; those that are positions in the example's row (`ROW_POSITION_KEYS`: a SQuAD window's
answer start and end, 0 its [CLS]) become positions in its sequence (the row's offset added);
per-token arrays ([N, L]: tags and their weights) are laid out as the tokens are.
Everything has the sequences as its leading axis, so micro-batches and data-parallel shards
split a packed batch as they split a bucketed one.

Static shapes: for training, one `length` (the bucket that holds the longest training unit)
and a few sequence counts chosen up front from the run's whole order (`plan`): the fewest
sequences each batch needs, rounded up to a count that splits into equal micro-batches within
`micro_batch_tokens`, then the set of counts where each count more saves at least
`COMPILE_COST_POSITIONS` positions over the run. Prediction packs a whole split at once into
sequences as long as the longest unit of any split needs, in batches of one count (about
`eval_batch_size` examples). With dropout off a packed step computes what the
bucketed step does, to float rounding (tests/test_finetune_packing.py).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from bert_jax.finetune.tuning.batches import (
    Buckets,
    bucket_lengths,
    host_rows,
    padded_length,
)

# The arrays a packed batch adds to the model's inputs (the heads take them as keywords).
PACKING_KEYS = ("position_ids", "packed_segment_ids", "cls_positions")
# What the per-token heads read of them (they pool nothing).
TOKEN_PACKING_KEYS = PACKING_KEYS[:2]
# The per-example arrays that are positions in the example's (first) row: packed, they become
# positions in the sequence, the row's offset added (a row's [CLS], 0, becomes its offset).
ROW_POSITION_KEYS = ("start_positions", "end_positions")
# A shape more costs a compile. Measured on the 2-core CPU with all-MiniLM-L6-v2, a training
# step's compile costs 12-23 CPU-s, about what training on 8-16 thousand positions costs there
# (~1.5-2 ms a position); a larger encoder trains fewer positions in that time, an accelerator
# many more. A sequence count more is taken only where it saves this many positions over the run.
COMPILE_COST_POSITIONS = 16384


def packing_inputs(batch: Mapping[str, Any], keys: Sequence[str] = PACKING_KEYS) -> dict[str, Any]:
    """The packing arrays of `batch` that `keys` names, as the heads' keywords: none for a
    bucketed batch."""
    return {key: batch[key] for key in keys if key in batch}


def row_spans(input_mask: np.ndarray) -> np.ndarray:
    """Each row's real tokens, [N, choices] from `input_mask` [N, L] or [N, choices, L]: one
    past its last unmasked position."""
    mask = input_mask.reshape(len(input_mask), -1, input_mask.shape[-1])
    positions = np.arange(1, mask.shape[-1] + 1)
    return np.max(np.where(mask != 0, positions, 0), axis=-1)


def first_fit_decreasing(lengths: np.ndarray, capacity: int, slots: int) -> list[list[int]]:
    """Indices of `lengths` ([units], or [units, lanes]: a unit takes its own length in each
    lane) packed into bins of `capacity` positions a lane and at most `slots` units: longest
    (over its lanes) first, each into the first bin with room in every lane (ties and bins keep
    the given order)."""
    sizes = np.asarray(lengths, np.int64)
    sizes = sizes.reshape(len(sizes), -1)
    longest = int(sizes.max(initial=0))
    if longest > capacity:
        raise ValueError(f"a unit of {longest} tokens is longer than the packed length {capacity}")
    rows = sizes.tolist()  # Python ints: a plan packs every batch of a run
    bins: list[list[int]] = []
    room: list[list[int]] = []
    for index in np.argsort(-sizes.sum(axis=1), kind="stable").tolist():
        size = rows[index]
        for members, left in zip(bins, room):
            if len(members) < slots and all(r >= n for r, n in zip(left, size)):
                members.append(index)
                left[:] = [r - n for r, n in zip(left, size)]
                break
        else:
            bins.append([index])
            room.append([capacity - n for n in size])
    return bins


def chosen_counts(needed: Sequence[int], compile_cost: float) -> tuple[int, ...]:
    """The sequence counts a run compiles: covering every batch's `needed` count (each batch
    takes the smallest chosen count that holds it), at the least padded sequences plus
    `compile_cost` sequences for each count (a dynamic programme over the distinct needs)."""
    values = sorted(set(int(n) for n in needed))
    counts = [sum(1 for n in needed if n == v) for v in values]
    best = [0.0] + [math.inf] * len(values)
    previous = [0] * (len(values) + 1)
    for j in range(1, len(values) + 1):
        for i in range(j):  # values[i:j] padded up to values[j - 1]
            cost = best[i] + sum(counts[i:j]) * values[j - 1] + compile_cost
            if cost < best[j]:
                best[j], previous[j] = cost, i
    chosen, j = [], len(values)
    while j > 0:
        chosen.append(values[j - 1])
        j = previous[j]
    return tuple(sorted(chosen))


def rounded_count(needed: int, per_micro_batch: int, divisor: int) -> int:
    """`needed` sequences rounded up to a count that divides over `divisor` (devices of the
    batch axes) and, where it needs more than one micro-batch of at most `per_micro_batch`
    sequences, runs as the fewest equal ones that fit (`batches.micro_batch_count`'s split):
    7 at 5 a micro-batch is 8 (two of 4), not 10."""
    per_micro_batch = max(per_micro_batch, divisor)
    splits = math.ceil(needed / per_micro_batch)
    each = divisor * math.ceil(math.ceil(needed / splits) / divisor)
    return max(divisor, splits * each)


@dataclasses.dataclass
class Packing:
    """A run's packing: the training sequences' `length` (a lane's, for multiple choice), the
    `slots` (units) a sequence holds at most, the counts its training batches take (`plan`), the
    prediction batches' length and count, and the shapes its train and predict steps compiled,
    which `summary` gives in one line (as `batches.Buckets` does for buckets)."""

    length: int
    slots: int
    per_micro_batch: int  # sequences of a training micro-batch (its tokens // positions a sequence)
    train_lengths: np.ndarray  # each training unit's real tokens, [units, choices]
    predict_length: int
    predict_slots: int
    predict_count: int
    divisor: int = 1
    choices: int = 1  # lanes a sequence has: the rows a unit has
    train_counts: tuple[int, ...] = ()
    used: dict[str, set[tuple[int, int]]] = dataclasses.field(default_factory=dict)

    @classmethod
    def for_units(
        cls,
        unit_lengths: Sequence[np.ndarray],
        settings: Any,
        divisor: int = 1,
        choices: int = 1,
    ) -> Packing:
        """The packing of a run over splits of these `unit_lengths` (each unit's real tokens,
        [units] or [units, choices] by row; the training split's first). Training sequences
        (lanes) are as long as the bucket (`bucket_lengths` of `max_seq_length`) of the longest
        training row, prediction's as that of the longest row of any split; a sequence holds at
        most as many units as the shortest training row fits; a prediction batch holds about
        `eval_batch_size` examples of the training split's mean length."""
        ladder = bucket_lengths(settings.max_seq_length)
        splits = [
            np.asarray(lengths, np.int64).reshape(len(lengths), choices) for lengths in unit_lengths
        ]
        train = splits[0]
        length = padded_length([int(np.max(train, initial=2))], ladder)
        longest = max(int(np.max(lengths, initial=2)) for lengths in splits)
        predict_length = padded_length([longest], ladder)
        shortest = max(int(np.min(train)) if train.size else 2, 2)  # [CLS] and [SEP] at least
        mean = float(np.mean(train.sum(axis=1))) if len(train) else float(choices * length)
        budget = settings.micro_batch_tokens
        per_micro_batch = max(1, budget // (choices * length)) if budget > 0 else 1 << 30
        needed = math.ceil(settings.eval_batch_size * mean / (choices * predict_length))
        return cls(
            length=length,
            slots=max(1, length // shortest),
            per_micro_batch=per_micro_batch,
            train_lengths=train,
            predict_length=predict_length,
            predict_slots=max(1, predict_length // shortest),
            predict_count=rounded_count(needed, 1 << 30, divisor),
            divisor=divisor,
            choices=choices,
        )

    def needed(self, lengths: np.ndarray) -> int:
        """The sequences a batch of units of `lengths` ([units, choices]) packs into, rounded
        (`rounded_count`)."""
        bins = first_fit_decreasing(lengths, self.length, self.slots)
        return rounded_count(len(bins), self.per_micro_batch, self.divisor)

    def plan(self, order: np.ndarray) -> None:
        """Choose the training counts from the run's whole order ([steps, batch_size] rows of
        the training split, -1: none)."""
        needed = [self.needed(self.train_lengths[rows[rows >= 0]]) for rows in order]
        self.train_counts = chosen_counts(
            needed, COMPILE_COST_POSITIONS / (self.choices * self.length)
        )

    def gather(
        self, arrays: Mapping[str, np.ndarray], rows: np.ndarray, kind: str = "train"
    ) -> dict[str, np.ndarray]:
        """The packed training batch of global `rows` (-1: none), this host's share of its
        sequences (see the module's docstring for the arrays)."""
        real = rows[rows >= 0]
        spans = row_spans(arrays["input_mask"][real])
        bins = first_fit_decreasing(spans, self.length, self.slots)
        need = rounded_count(len(bins), self.per_micro_batch, self.divisor)
        count = next((c for c in self.train_counts if c >= need), need)
        batch, _ = self.packed(arrays, real, spans, bins, (count, self.length, self.slots))
        self.used.setdefault(kind, set()).add((count, self.length))
        return batch

    def packed(
        self,
        arrays: Mapping[str, np.ndarray],
        units: np.ndarray,
        spans: np.ndarray,
        bins: list[list[int]],
        shape: tuple[int, int, int],
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """`shape`'s sequences, length and slots (this host's share of the sequences) holding
        `bins` (lists of indices into `units`,
        the rows of `arrays`; `spans` their rows' tokens, [units, choices]), and where each unit
        went in the global batch: [units, 3] (sequence, slot, start of its first row)."""
        stored = arrays["input_ids"].shape[1:]
        choices = spans.shape[1]
        count, length, slots = shape
        sequences = host_rows(np.arange(count))
        first = int(sequences[0])
        shape = (len(sequences), choices, length)
        out = {
            key: np.zeros(shape, arrays[key].dtype)
            for key in ("input_ids", "input_mask", "segment_ids")
        }
        out["position_ids"] = np.zeros(shape, np.int32)
        out["packed_segment_ids"] = np.zeros(shape, np.int32)
        out["cls_positions"] = np.zeros((len(sequences), slots, choices), np.int32)
        out["weights"] = np.zeros((len(sequences), slots), np.float32)
        per_token = [
            key for key, value in arrays.items() if key not in out and value.shape[1:] == stored
        ]
        per_unit = [key for key in arrays if key not in out and key not in per_token]
        positions = [key for key in ROW_POSITION_KEYS if key in per_unit]
        sizes = spans.sum(axis=1)
        for key in positions:  # else the position would name another row's token
            beyond = np.flatnonzero((arrays[key][units] < 0) | (arrays[key][units] >= sizes))
            if len(beyond):
                index = int(beyond[0])
                raise ValueError(f"{key} of row {units[index]} is past its {sizes[index]} tokens")
        for key in per_token:
            out[key] = np.zeros(shape, arrays[key].dtype)
        for key in per_unit:
            out[key] = np.zeros((len(sequences), slots), arrays[key].dtype)
        where = np.full((len(units), 3), -1, np.int64)
        for sequence, members in enumerate(bins):
            local = sequence - first
            offsets = np.zeros(choices, np.int64)  # each lane's next free position
            for slot, index in enumerate(members):
                unit = int(units[index])
                where[index] = (sequence, slot, offsets[0])
                if not 0 <= local < len(sequences):  # another host's sequence
                    offsets += spans[index]
                    continue
                out["weights"][local, slot] = 1.0
                for key in per_unit:
                    out[key][local, slot] = arrays[key][unit]
                for key in positions:
                    out[key][local, slot] += offsets[0]
                for choice in range(choices):
                    size = int(spans[index, choice])
                    cut = (local, choice, slice(offsets[choice], offsets[choice] + size))
                    source = (unit, choice) if len(stored) == 2 else (unit,)
                    for key in ("input_ids", "input_mask", "segment_ids", *per_token):
                        out[key][cut] = arrays[key][source][:size]
                    out["position_ids"][cut] = np.arange(size)
                    out["packed_segment_ids"][cut] = slot + 1
                    out["cls_positions"][local, slot, choice] = offsets[choice]
                    offsets[choice] += size
        if choices == 1:  # one lane: the arrays laid out by lane lose that axis
            out = {
                key: value[:, 0] if value.shape == shape else value for key, value in out.items()
            }
            out["cls_positions"] = out["cls_positions"][..., 0]
        return out, where

    def predict(
        self,
        arrays: Mapping[str, np.ndarray],
        predict_fn: Callable[[dict[str, np.ndarray]], np.ndarray],
        fill: float,
    ) -> np.ndarray:
        """Outputs of every row of `arrays` (the model's inputs), in their order: the split
        packed at once, run `predict_count` sequences at a time (`predict_fn(batch)` gives the
        global outputs: [sequences, slots, ...] per example, or [sequences, length, ...] per
        token, which come back at the stored length with `fill` past each row's tokens)."""
        stored = arrays["input_ids"].shape[-1]
        spans = row_spans(arrays["input_mask"])
        length = self.predict_length
        outputs = None
        for batch, where in self._predict_batches(arrays, spans):
            logits = np.asarray(predict_fn(batch))
            placed = np.flatnonzero(where[:, 0] >= 0)
            sequence, slot, offset = where[placed].T
            if logits.shape[1] == length:  # per token (more positions than slots)
                values = np.full((len(placed), stored, *logits.shape[2:]), fill, logits.dtype)
                for i, (s, o) in enumerate(zip(sequence, offset)):
                    size = int(spans[placed[i], 0])
                    values[i, :size] = logits[s, o : o + size]
            else:
                values = logits[sequence, slot]
            if outputs is None:
                outputs = np.zeros((len(arrays["input_ids"]), *values.shape[1:]), values.dtype)
            outputs[placed] = values
        assert outputs is not None, "no rows to predict"
        return outputs

    def _predict_batches(
        self, arrays: Mapping[str, np.ndarray], spans: np.ndarray
    ) -> Iterator[tuple[dict[str, np.ndarray], np.ndarray]]:
        """`predict`'s batches of `arrays` (rows of `spans`), without weights, each with where its
        units sit ([units, 3]: sequence, slot, offset; -1 where none)."""
        length, slots, count = self.predict_length, self.predict_slots, self.predict_count
        units = np.arange(len(arrays["input_ids"]))
        bins = first_fit_decreasing(spans, length, slots)
        for start in range(0, len(bins), count):
            chunk = bins[start : start + count]
            batch, where = self.packed(arrays, units, spans, chunk, (count, length, slots))
            self.used.setdefault("predict", set()).add((count, length))
            batch.pop("weights")
            yield batch, where

    def summary(self) -> str:
        """`compiled shapes: train 2 (8x384, 10x384), predict 1 (10x512) (sequences x length),
        packed: up to 4 examples a sequence`; multiple choice's `6x4x128` (sequences x choices
        x length)."""
        lanes, axes = (f"x{self.choices}", " x choices") if self.choices > 1 else ("", "")
        kinds = ", ".join(
            f"{kind} {len(used)} ({', '.join(f'{c}{lanes}x{n}' for c, n in sorted(used))})"
            for kind, used in sorted(self.used.items(), key=lambda item: item[0] != "train")
        )
        return (
            f"compiled shapes: {kinds or 'none'} (sequences{axes} x length), packed: up to "
            f"{self.slots} examples a sequence"
        )


def first_predict_batch(
    arrays: Mapping[str, np.ndarray], batch_size: int, batches: Buckets | Packing
) -> dict[str, np.ndarray]:
    """The first batch prediction over `arrays` runs, without weights (what a predict step
    compiled ahead of time is compiled for): `Packing.predict`'s, or the first of
    `Buckets.predicting`."""
    if isinstance(batches, Packing):
        batch, _ = next(batches._predict_batches(arrays, row_spans(arrays["input_mask"])))
        return batch
    _, batch = next(batches.predicting(arrays, batch_size))
    return batch


def batches_for(
    settings: Any,
    splits: Sequence[Mapping[str, np.ndarray]],
    mesh: Any,
) -> Buckets | Packing:
    """A run's batches: packed (`settings.packing`, where batches are not padded to
    `max_seq_length`) over `splits` (the arrays of every split the run packs, with
    `input_mask` [N, L] or [N, choices, L]; the training split's first), else length buckets
    (`Buckets.for_settings`)."""
    if not settings.packing or settings.pad_to_max_length:
        return Buckets.for_settings(settings)
    from bert_jax.core import partitioning

    masks = [split["input_mask"] for split in splits]
    divisor = math.prod(mesh.shape[axis] for axis in partitioning.BATCH_AXES)
    choices = masks[0].shape[1] if masks[0].ndim == 3 else 1
    return Packing.for_units([row_spans(mask) for mask in masks], settings, divisor, choices)
