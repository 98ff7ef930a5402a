"""Per-host tf.data input for pretraining, with an exactly resumable position.

Public API::

    make_pretrain_iterator(records, settings: PipelineSettings, tokenizer=None)
        -> PretrainIterator (or packing.PackedIterator with ``settings.packing``)

``records`` is prepared data: a directory of ``*.tfrecord`` shards, a glob, a file or a list of
files — ours or written by the original ``create_pretraining_data.py``. A raw corpus is prepared
first by the caller (``cached.prepare_cached``); this module never prepares.

``PretrainIterator`` yields per-host batches in the fixed format: ``input_ids``, ``input_mask``,
``segment_ids`` [B, L] int32; ``masked_lm_positions``, ``masked_lm_ids`` [B, P] int32;
``masked_lm_weights`` [B, P] float32; ``next_sentence_labels`` [B] int32 (1 = random next).
``get_state() -> dict`` (JSON-serializable) and ``set_state(state)`` save and restore the position:
an iterator restored from the state taken after batch k — in this or a new process — yields
batch k+1, k+2, ... exactly as the uninterrupted run would.

How. Host ``process_index`` of ``process_count`` reads a disjoint part of the data: whole files
(``files[process_index::process_count]``) when there are at least as many files as hosts, else
every ``process_count``-th record of the common stream. Each epoch is a deterministic function of
``(seed, epoch)``: a NumPy permutation of the files, a deterministic interleave, and a shuffle of
consecutive blocks of ``shuffle_buffer_size`` records by stateless random keys (so, unlike
``Dataset.shuffle``, the order never depends on TensorFlow's global seed); batches use
``drop_remainder``. The state is just ``(epoch, batches taken in the epoch)``; restoring rebuilds
that epoch and skips the consumed batches while they are still serialized strings (no parsing, no
masking), so resuming costs a re-read of part of one epoch and the state stays a few bytes
instead of a shuffle buffer.

Dynamic masking (``dynamic_masking=True``) re-masks every batch
(``dynamic_batch.dynamic_mask_batch``) with stateless RNG seeded by ``(seed, epoch,
process_index, batch index)``: every epoch sees a new masking, and a restored iterator
re-creates exactly the same one.

Why this file is long: `PretrainIterator` (about half of it) holds the one resumable position
(file order, shuffle, masking draws) that every one of its methods reads or advances.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from bert_jax.data import objectives
from bert_jax.data.layout import TOKENIZER_SUBDIR, read_prepare_config
from bert_jax.data.masking.dynamic_batch import dynamic_mask_batch
from bert_jax.data.masking.settings import MaskingConfig
from bert_jax.data.pipeline.packing import PackedIterator, PackingConfig
from bert_jax.data.records import integrity, manifest
from bert_jax.data.records import tfrecord as records_lib
from bert_jax.data.sources.kinds import source_kind
from bert_jax.data.tokenizers.interface import Tokenizer
from bert_jax.data.tokenizers.load_or_train import check_prepared_with, load_tokenizer
from bert_jax.runtime import fs
from bert_jax.runtime.errors import UserError

STATE_VERSION = 1
logger = logging.getLogger(__name__)

__all__ = ["PipelineSettings", "PretrainIterator", "make_pretrain_iterator", "synthetic_batch"]


@dataclasses.dataclass(frozen=True)
class PipelineSettings:
    """How to read prepared records: batch shape, this host's part, order and masking.

    Handed down whole: ``make_pretrain_iterator`` and ``PretrainIterator`` read each field
    where it is used. A pretraining run fills the fields config.data declares under the same
    name from it (``training.inputs.settings_from_config``), so a new setting is a field here,
    its declaration there, and the code that reads it."""

    batch_size: int
    max_seq_length: int = objectives.MAX_SEQ_LENGTH
    max_predictions_per_seq: int = objectives.MAX_PREDICTIONS_PER_SEQ
    seed: int = 0
    # This reader's part of the data: ``process_index`` of ``process_count`` disjoint parts.
    process_index: int = 0
    process_count: int = 1
    dynamic_masking: bool = False
    whole_word_mask: bool = False
    masked_lm_prob: float = objectives.MASKED_LM_PROB
    shuffle: bool = True
    shuffle_buffer_size: int = 10_000
    num_epochs: int | None = None
    shard_by: str = "auto"  # "files", "records" or "auto" (files when there are enough)
    packing: PackingConfig | None = None
    # Keep a damaged file's records before the damage and count it, instead of stopping.
    skip_corrupt_records: bool = False
    # What the records must be prepared for (data/objectives.py; records without a recorded
    # objective are not checked), and the MASK/SAME/RND shares of dynamic masking. "ltr" reads
    # the text unmasked: no dynamic masking.
    objective: str = objectives.DEFAULT_OBJECTIVE
    mask_share: float = objectives.DEFAULT_SHARES["mask_share"]
    same_share: float = objectives.DEFAULT_SHARES["same_share"]
    random_share: float = objectives.DEFAULT_SHARES["random_share"]


def _derived_seed(*parts: int) -> int:
    """A 63-bit seed from integers (tf.data and stateless ops take signed int64)."""
    state = np.random.SeedSequence([int(p) for p in parts]).generate_state(2, np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1])) & ((1 << 63) - 1)


class PretrainIterator:
    """Per-host batches with a saved/restored position (see the module docstring)."""

    def __init__(
        self,
        files: Sequence[str],
        settings: PipelineSettings,
        masking: MaskingConfig | None = None,
        *,
        cycle_length: int = 8,
        prefetch: int = 2,
    ):
        """``settings``: what to read and how (read from it where used, never copied field by
        field); ``masking``: dynamic masking's, made from ``settings`` and the tokenizer, or
        None. With ``settings.packing`` a batch is the records of one packed batch."""
        if settings.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {settings.batch_size}")
        index, count = settings.process_index, settings.process_count
        if count < 1 or not 0 <= index < count:
            raise ValueError(f"process_index {index} must be in [0, process_count {count})")
        if settings.shard_by not in ("auto", "files", "records"):
            raise ValueError(f"shard_by must be auto, files or records, not {settings.shard_by!r}")
        if (
            masking is not None
            and masking.max_predictions_per_seq != settings.max_predictions_per_seq
        ):
            raise ValueError("masking.max_predictions_per_seq must equal max_predictions_per_seq")
        self.settings = settings
        self.all_files = sorted(os.fspath(f) for f in files)
        if not self.all_files:
            raise UserError("no record files")
        shard_by = settings.shard_by
        if shard_by == "auto":
            shard_by = "files" if len(self.all_files) >= count else "records"
        self.shard_by = shard_by
        if shard_by == "files":
            if len(self.all_files) < count:
                raise UserError(
                    f"{len(self.all_files)} record files cannot be split over {count} "
                    "hosts by file; use shard_by='records'"
                )
            self.files = self.all_files[index::count]
        else:
            self.files = list(self.all_files)
        packing = settings.packing
        # Records per batch: a packed batch of batch_size rows is made of more of them.
        self.batch_size = (
            settings.batch_size
            if packing is None
            else packing.instances_per_batch(settings.batch_size)
        )
        self.masking = masking
        self.cycle_length = cycle_length
        self.prefetch = prefetch
        self._epoch = 0
        self._batches_in_epoch = 0
        self._batches_total = 0
        self._iterator = None
        # Damaged files met so far -> intact records read from each (`integrity`).
        self.corrupt_files: dict[str, int] = {}

    @property
    def corrupt_records(self) -> int:
        """Damaged records skipped so far (one per damaged file: the rest of it is not read)."""
        return len(self.corrupt_files)

    # --- position ---------------------------------------------------------------------------
    def _fingerprint(self) -> str:
        description = {
            "files": [os.path.basename(f) for f in self.all_files],
            "batch_size": self.batch_size,
            "max_seq_length": self.settings.max_seq_length,
            "max_predictions_per_seq": self.settings.max_predictions_per_seq,
            "seed": int(self.settings.seed),
            "process_index": self.settings.process_index,
            "process_count": self.settings.process_count,
            "shard_by": self.shard_by,
            "shuffle": self.settings.shuffle,
            "shuffle_buffer_size": self.settings.shuffle_buffer_size,
            "dynamic_masking": self.masking is not None,
            "whole_word_mask": self.masking is not None and self.masking.whole_word_mask,
        }
        blob = json.dumps(description, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def get_state(self) -> dict[str, Any]:
        """The position after the last batch returned; JSON-serializable."""
        return {
            "version": STATE_VERSION,
            "epoch": self._epoch,
            "batches_in_epoch": self._batches_in_epoch,
            "batches_total": self._batches_total,
            "fingerprint": self._fingerprint(),
        }

    def set_state(self, state: dict[str, Any] | bytes | str) -> None:
        """Continue from ``state``; refuses a state taken with a different data configuration."""
        if isinstance(state, (bytes, str)):
            state = json.loads(state)
        if state.get("version") != STATE_VERSION:
            raise UserError(f"unsupported data iterator state version {state.get('version')!r}")
        if state.get("fingerprint") != self._fingerprint():
            raise UserError(
                "the saved data iterator state belongs to a different input configuration "
                "(files, batch size, lengths, seed, host index/count, shuffle or masking "
                "changed); it cannot be resumed exactly"
            )
        self._epoch = int(state["epoch"])
        self._batches_in_epoch = int(state["batches_in_epoch"])
        self._batches_total = int(state["batches_total"])
        self._iterator = None

    @property
    def epoch(self) -> int:
        return self._epoch

    # --- data -------------------------------------------------------------------------------
    def _epoch_dataset(self, epoch: int, skip_batches: int):
        tf = records_lib.import_tensorflow()
        files = list(self.files)
        if self.settings.shuffle:
            # Same permutation on every host: record-level sharding needs a common order.
            order = np.random.default_rng(_derived_seed(self.settings.seed, epoch, 1)).permutation(
                len(files)
            )
            files = [files[i] for i in order]
        dataset = tf.data.Dataset.from_tensor_slices(files)
        intact = tf.lookup.StaticHashTable(  # per damaged file: read its intact records only
            tf.lookup.KeyValueTensorInitializer(
                tf.constant([""] + list(self.corrupt_files), tf.string),
                tf.constant([-1] + list(self.corrupt_files.values()), tf.int64),
            ),
            default_value=-1,
        )
        dataset = dataset.interleave(
            records_lib.graph_function(
                lambda path: tf.data.TFRecordDataset(
                    path, buffer_size=records_lib.READ_BUFFER_BYTES
                ).take(intact.lookup(path))
            ),
            cycle_length=max(1, min(self.cycle_length, len(files))),
            block_length=1,
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
        if self.shard_by == "records" and self.settings.process_count > 1:
            dataset = dataset.shard(self.settings.process_count, self.settings.process_index)
        if self.settings.shuffle:
            # Blocks of shuffle_buffer_size records, each permuted by stateless random keys.
            # Not Dataset.shuffle: its order also depends on TensorFlow's global seed, which
            # any code in the process may set, and a resumed run must reproduce the order.
            block_key = _derived_seed(self.settings.seed, epoch, self.settings.process_index, 2)

            def permute(block_index, block):
                seed = tf.stack([tf.constant(block_key, tf.int64), block_index])
                keys = tf.random.stateless_uniform(tf.shape(block), seed=seed)
                return tf.gather(block, tf.argsort(keys))

            dataset = (
                dataset.batch(self.settings.shuffle_buffer_size)
                .enumerate()
                .map(records_lib.graph_function(permute))
                .unbatch()
            )
        dataset = dataset.batch(self.batch_size, drop_remainder=True)
        if skip_batches:
            dataset = dataset.skip(skip_batches)
        length, slots = self.settings.max_seq_length, self.settings.max_predictions_per_seq
        dataset = dataset.map(
            records_lib.graph_function(lambda s: records_lib.parse_batch(s, length, slots)),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
        if self.masking is not None:
            masking = self.masking
            epoch_key = _derived_seed(self.settings.seed, epoch, self.settings.process_index, 3)

            def remask(index, batch):
                seed = tf.stack([tf.constant(epoch_key, tf.int64), tf.cast(index, tf.int64)])
                return dynamic_mask_batch(batch, seed, masking)

            dataset = dataset.enumerate(start=skip_batches).map(
                records_lib.graph_function(remask),
                num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=True,
            )
        options = tf.data.Options()
        options.deterministic = True
        dataset = dataset.with_options(options)
        return dataset.prefetch(self.prefetch)

    def __iter__(self) -> PretrainIterator:
        return self

    def _met_corrupt_record(self, error: Exception) -> None:
        """Names the damaged file, or (skipping) rebuilds the epoch without its damaged part."""
        found = integrity.find_corrupt([f for f in self.files if f not in self.corrupt_files])
        if not found:
            raise error
        if not self.settings.skip_corrupt_records:
            path, (index, problem) = next(iter(found.items()))
            raise integrity.corrupt_error(path, index, problem) from None
        for path, (index, problem) in found.items():
            logger.warning("skipping %s from record %d on: %s", path, index, problem)
            self.corrupt_files[path] = index
        self._iterator = None  # the same epoch again, past the batches already taken

    def __next__(self) -> dict[str, np.ndarray]:
        while True:
            if self.settings.num_epochs is not None and self._epoch >= self.settings.num_epochs:
                raise StopIteration
            if self._iterator is None:
                dataset = self._epoch_dataset(self._epoch, self._batches_in_epoch)
                self._iterator = dataset.as_numpy_iterator()
            try:
                batch = next(self._iterator)
            except StopIteration:
                if self._batches_in_epoch == 0:
                    host = f"{self.settings.process_index} of {self.settings.process_count}"
                    raise UserError(
                        f"host {host} has fewer than "
                        f"batch_size={self.batch_size} examples in {len(self.files)} file(s); "
                        "prepare more data or lower the batch size"
                    ) from None
                self._epoch += 1
                self._batches_in_epoch = 0
                self._iterator = None
                continue
            except Exception as err:
                if not integrity.is_data_loss(err):
                    raise
                self._met_corrupt_record(err)
                continue
            self._batches_in_epoch += 1
            self._batches_total += 1
            return batch


def _check_record_shapes(
    files: Sequence[str], max_seq_length: int, slots: int, skip_corrupt: bool = False
) -> None:
    """Fail up front, naming the file, when records were prepared with other lengths."""
    tf = records_lib.import_tensorflow()
    path, serialized = integrity.first_record(files, skip_corrupt)
    if serialized is not None:
        feature = tf.train.Example.FromString(serialized).features.feature
        missing = [n for n in records_lib.FEATURE_NAMES if n not in feature]
        if missing:
            raise UserError(f"{path}: records lack the feature(s) {', '.join(missing)}")
        found_length = len(feature["input_ids"].int64_list.value)
        found_slots = len(feature["masked_lm_positions"].int64_list.value)
        if (found_length, found_slots) != (max_seq_length, slots):
            raise UserError(
                f"{path} holds records with max_seq_length={found_length} and "
                f"max_predictions_per_seq={found_slots}, but the pipeline was asked for "
                f"{max_seq_length} and {slots}"
            )


def _masking_tokenizer(items: list[str], tokenizer: Tokenizer | None) -> Tokenizer:
    """The tokenizer dynamic masking uses: the one given, else the one saved with the records.

    Refuses one that differs from the records' own (re-masking with another vocabulary would
    corrupt every batch).
    """
    if tokenizer is None:
        for item in items:
            candidate = os.path.join(item, TOKENIZER_SUBDIR)
            if fs.isdir(item) and fs.isdir(candidate):
                tokenizer = load_tokenizer(candidate)
                break
    if tokenizer is None:
        raise UserError(
            "dynamic masking needs the tokenizer (special ids, vocabulary, word starts); "
            f"pass one or keep the {TOKENIZER_SUBDIR}/ directory next to the records"
        )
    named = [("records", item) for item in items]
    check_prepared_with(tokenizer, named, "the tokenizer given for dynamic masking")
    return tokenizer


def make_pretrain_iterator(
    records: str | os.PathLike | Sequence[str | os.PathLike],
    settings: PipelineSettings,
    tokenizer: Tokenizer | str | os.PathLike | None = None,
) -> PretrainIterator | PackedIterator:
    """One call from prepared records to a resumable per-host iterator.

    With ``settings.packing`` (``packing.py``), every batch of ``batch_size`` rows packs the
    instances of ``packing.instances_per_batch(batch_size)`` records; the position is the same
    kind of state as without. The tokenizer is needed for dynamic masking only; it defaults to
    the ``tokenizer/`` saved next to the records by ``data prepare``.
    """
    items = (
        [os.fspath(records)]
        if isinstance(records, (str, os.PathLike))
        else [os.fspath(s) for s in records]
    )
    corpora = [item for item in items if source_kind(item) != "records"]
    if corpora:
        raise UserError(
            f"{', '.join(corpora)} is a corpus, not prepared records: prepare it first "
            "(`bert-jax data prepare`, or data.preparation.cached.prepare_cached)"
        )
    if isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = load_tokenizer(tokenizer)
    for item in items:
        manifest.require_complete(item)  # a failed or unfinished `data prepare` is not trusted
        if fs.isdir(item):
            objectives.check_records(
                item, read_prepare_config(item), settings.objective, "the objective"
            )
    files = records_lib.list_record_files(items)
    length, slots = settings.max_seq_length, settings.max_predictions_per_seq
    _check_record_shapes(files, length, slots, settings.skip_corrupt_records)
    masking = None
    if settings.dynamic_masking and settings.objective != "ltr":
        masking = MaskingConfig.from_tokenizer(
            _masking_tokenizer(items, tokenizer),
            settings.masked_lm_prob,
            slots,
            settings.whole_word_mask,
            mask_share=settings.mask_share,
            same_share=settings.same_share,
            random_share=settings.random_share,
        )
    packing = settings.packing
    if packing is not None and packing.max_seq_length != length:
        raise UserError(f"packed rows of {packing.max_seq_length} tokens for records of {length}")
    iterator = PretrainIterator(files, settings, masking)
    return iterator if packing is None else PackedIterator(iterator, settings.batch_size, packing)


def synthetic_batch(
    batch_size: int,
    max_seq_length: int = objectives.MAX_SEQ_LENGTH,
    max_predictions_per_seq: int = objectives.MAX_PREDICTIONS_PER_SEQ,
    vocab_size: int = 30522,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """A well-formed random batch in the pipeline's format, for benchmarks without data.

    Full-length rows of ids uniform in [5, vocab_size) (special tokens are not placed), segment B
    from the middle, the ``P`` positions after the first predicted, every other row a random next.
    """
    rng = np.random.default_rng(seed)
    length, slots = max_seq_length, max_predictions_per_seq
    input_ids = rng.integers(5, vocab_size, size=(batch_size, length), dtype=np.int32)
    segment_ids = np.zeros((batch_size, length), dtype=np.int32)
    segment_ids[:, length // 2 :] = 1
    positions = np.broadcast_to(np.arange(1, slots + 1, dtype=np.int32), (batch_size, slots))
    return {
        "input_ids": input_ids,
        "input_mask": np.ones((batch_size, length), dtype=np.int32),
        "segment_ids": segment_ids,
        "masked_lm_positions": positions.copy(),
        "masked_lm_ids": np.take_along_axis(input_ids, positions, axis=1),
        "masked_lm_weights": np.ones((batch_size, slots), dtype=np.float32),
        "next_sentence_labels": (np.arange(batch_size) % 2).astype(np.int32),
    }
