"""Per-host tf.data input for pretraining, with an exactly resumable position.

Public API::

    make_pretrain_iterator(records_or_source, tokenizer=None, *, batch_size, max_seq_length=128,
                           max_predictions_per_seq=20, seed=0, process_index=0, process_count=1,
                           dynamic_masking=False, whole_word_mask=False, masked_lm_prob=0.15,
                           shuffle=True, shuffle_buffer_size=10_000, num_epochs=None,
                           cache_dir=None, dupe_factor=None, short_seq_prob=0.1, num_workers=1,
                           tfds_data_dir=None, shard_by="auto", packing=None)
        -> PretrainIterator (or packing.PackedIterator with ``packing``)

``records_or_source`` is prepared data (a directory of ``*.tfrecord`` shards, a glob, a file or a
list of files — ours or written by the original ``create_pretraining_data.py``) or a corpus
source as accepted by ``corpus.read_documents`` (``"embedded"``, text/JSONL files,
``tfds:NAME``), which is first prepared into ``cache_dir`` with ``prepare.prepare_records``
(reused when already there; every host prepares the same bytes, then reads its own part).

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

Dynamic masking (``dynamic_masking=True``) re-masks every batch with vectorized TF ops: the
original tokens are first restored from the record's ``masked_lm_ids`` (so any static records,
including the original tool's, can be re-masked), then each example gets a fresh selection of 15%
of its non-special tokens with 80/10/10 replacement, drawn with stateless RNG seeded by
``(seed, epoch, process_index, batch index)``: every epoch sees a new masking, and a restored
iterator re-creates exactly the same one. With ``whole_word_mask`` whole words are taken in random
order while they fit the budget; unlike static preparation, the first word that does not fit ends
the selection (a prefix rule has a closed vectorized form; skipping needs a sequential loop), so
slightly fewer than 15% of tokens may be selected.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np

from bert_jax.data import records as records_lib
from bert_jax.data.files import write_json_atomic
from bert_jax.data.packing import PackedIterator, PackingConfig
from bert_jax.data.prepare import CONFIG_FILE, TOKENIZER_SUBDIR, prepare_records
from bert_jax.data.pretraining import MASK_SHARE, RANDOM_SHARE, MaskingConfig
from bert_jax.data.tokenizer import Tokenizer, load_tokenizer

STATE_VERSION = 1
_COMPLETE_MARKER = "prepared-complete.json"

__all__ = [
    "PretrainIterator",
    "make_pretrain_iterator",
    "prepare_records",
    "synthetic_batch",
    "dynamic_mask_batch",
]


def _derived_seed(*parts: int) -> int:
    """A 63-bit seed from integers (tf.data and stateless ops take signed int64)."""
    state = np.random.SeedSequence([int(p) for p in parts]).generate_state(2, np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1])) & ((1 << 63) - 1)


def dynamic_mask_batch(batch: dict, seed, masking: MaskingConfig) -> dict:
    """Re-mask a parsed batch with TF ops (no Python per example); ``seed`` is an int64 [2].

    Returns a new batch dict with ``input_ids`` and the ``masked_lm_*`` features replaced.
    """
    tf = records_lib.import_tensorflow()
    input_ids = batch["input_ids"]
    input_mask = batch["input_mask"]
    batch_size = tf.shape(input_ids)[0]
    seq_length = input_ids.shape[1]
    num_slots = masking.max_predictions_per_seq

    # Undo the static masking: put the original ids back at the predicted positions.
    record_positions = batch["masked_lm_positions"]
    was_predicted = batch["masked_lm_weights"] > 0
    rows = tf.broadcast_to(tf.range(batch_size)[:, None], tf.shape(record_positions))
    indices = tf.stack([rows, record_positions], axis=-1)
    input_ids = tf.tensor_scatter_nd_update(
        input_ids,
        tf.boolean_mask(indices, was_predicted),
        tf.boolean_mask(batch["masked_lm_ids"], was_predicted),
    )

    never_mask = tf.constant(masking.never_mask_table)
    candidates = tf.logical_and(input_mask > 0, tf.logical_not(tf.gather(never_mask, input_ids)))
    num_candidates = tf.reduce_sum(tf.cast(candidates, tf.int32), axis=1)
    wanted = tf.cast(
        tf.round(tf.cast(num_candidates, tf.float32) * masking.masked_lm_prob), tf.int32
    )
    num_to_predict = tf.minimum(tf.minimum(tf.maximum(wanted, 1), num_slots), num_candidates)

    seeds = tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), 4)
    positions = tf.range(seq_length)[None, :]
    if masking.word_start_table is None:
        # Token level: the num_to_predict candidates with the highest random scores. Scores are
        # random integers times L plus the position, so they never tie.
        random_bits = tf.random.stateless_uniform(
            [batch_size, seq_length],
            seed=seeds[0],
            minval=0,
            maxval=(2**31 - 1) // seq_length,  # keeps bits * L + position within int32
            dtype=tf.int32,
        )
        scores = tf.where(candidates, random_bits * seq_length + positions, -1)
        top_scores, _ = tf.math.top_k(scores, k=num_slots)
        kth_index = tf.maximum(num_to_predict - 1, 0)
        threshold = tf.gather(top_scores, kth_index, batch_dims=1)
        selected = candidates & (scores >= threshold[:, None]) & (num_to_predict > 0)[:, None]
        token_draws = tf.random.stateless_uniform([batch_size, seq_length], seed=seeds[1])
    else:
        selected, token_draws = _select_whole_words(
            input_ids, candidates, num_to_predict, masking, seeds
        )
    ordinary = tf.constant(masking.ordinary_ids)
    random_ids = tf.gather(
        ordinary,
        tf.random.stateless_uniform(
            [batch_size, seq_length],
            seed=seeds[2],
            minval=0,
            maxval=int(masking.ordinary_ids.shape[0]),
            dtype=tf.int32,
        ),
    )
    to_mask = selected & (token_draws < MASK_SHARE)
    to_random = selected & (token_draws >= MASK_SHARE) & (token_draws < MASK_SHARE + RANDOM_SHARE)
    masked_ids = tf.where(to_mask, masking.mask_id, tf.where(to_random, random_ids, input_ids))

    # Selected positions, ascending, padded with position 0 / id 0 / weight 0.
    priority = tf.where(selected, seq_length - positions, 0)
    top_priority, _ = tf.math.top_k(priority, k=num_slots)
    slot_valid = top_priority > 0
    masked_lm_positions = tf.where(slot_valid, seq_length - top_priority, 0)
    masked_lm_ids = tf.where(slot_valid, tf.gather(input_ids, masked_lm_positions, batch_dims=1), 0)
    out = dict(batch)
    out["input_ids"] = masked_ids
    out["masked_lm_positions"] = masked_lm_positions
    out["masked_lm_ids"] = masked_lm_ids
    out["masked_lm_weights"] = tf.cast(slot_valid, tf.float32)
    return out


def _select_whole_words(input_ids, candidates, num_to_predict, masking: MaskingConfig, seeds):
    """Whole words in random order while they fit the budget (the prefix rule, see module).

    A word starts at a word-start id or after a non-candidate (so never across [SEP]). Returns
    the selected tokens [B, L] and one uniform draw per token, shared by the tokens of a word.
    """
    tf = records_lib.import_tensorflow()
    batch_size = tf.shape(input_ids)[0]
    seq_length = input_ids.shape[1]
    previous_is_candidate = tf.pad(candidates[:, :-1], [[0, 0], [1, 0]])
    word_start = tf.gather(tf.constant(masking.word_start_table), input_ids)
    starts = candidates & (word_start | tf.logical_not(previous_is_candidate))
    word_of_token = tf.cumsum(tf.cast(starts, tf.int32), axis=1) - 1
    word_of_token = tf.where(candidates, word_of_token, seq_length)  # sentinel for non-words
    num_words = tf.reduce_sum(tf.cast(starts, tf.int32), axis=1)
    word_sizes = tf.math.bincount(
        word_of_token, minlength=seq_length + 1, maxlength=seq_length + 1, axis=-1
    )[:, :seq_length]
    word_scores = tf.random.stateless_uniform([batch_size, seq_length], seed=seeds[0])
    word_exists = tf.range(seq_length)[None, :] < num_words[:, None]
    word_scores = tf.where(word_exists, word_scores, 2.0)
    order = tf.argsort(word_scores, axis=1)
    sizes_in_order = tf.gather(word_sizes, order, batch_dims=1)
    fits_in_order = tf.cumsum(sizes_in_order, axis=1) <= num_to_predict[:, None]
    fits_in_order &= tf.gather(word_exists, order, batch_dims=1)
    word_chosen = tf.gather(fits_in_order, tf.argsort(order, axis=1), batch_dims=1)
    word_chosen = tf.pad(word_chosen, [[0, 0], [0, 1]])  # the sentinel word is never chosen
    selected = tf.gather(word_chosen, word_of_token, batch_dims=1)
    word_draws = tf.random.stateless_uniform([batch_size, seq_length + 1], seed=seeds[1])
    token_draws = tf.gather(word_draws, word_of_token, batch_dims=1)
    return selected, token_draws


class PretrainIterator:
    """Per-host batches with a saved/restored position (see the module docstring)."""

    def __init__(
        self,
        files: Sequence[str],
        *,
        batch_size: int,
        max_seq_length: int,
        max_predictions_per_seq: int,
        seed: int = 0,
        process_index: int = 0,
        process_count: int = 1,
        shuffle: bool = True,
        shuffle_buffer_size: int = 10_000,
        masking: MaskingConfig | None = None,
        num_epochs: int | None = None,
        shard_by: str = "auto",
        cycle_length: int = 8,
        prefetch: int = 2,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if process_count < 1 or not 0 <= process_index < process_count:
            raise ValueError(
                f"process_index {process_index} must be in [0, process_count {process_count})"
            )
        if shard_by not in ("auto", "files", "records"):
            raise ValueError(f"shard_by must be auto, files or records, not {shard_by!r}")
        if masking is not None and masking.max_predictions_per_seq != max_predictions_per_seq:
            raise ValueError("masking.max_predictions_per_seq must equal max_predictions_per_seq")
        self.all_files = sorted(os.fspath(f) for f in files)
        if not self.all_files:
            raise ValueError("no record files")
        if shard_by == "auto":
            shard_by = "files" if len(self.all_files) >= process_count else "records"
        self.shard_by = shard_by
        if shard_by == "files":
            if len(self.all_files) < process_count:
                raise ValueError(
                    f"{len(self.all_files)} record files cannot be split over {process_count} "
                    "hosts by file; use shard_by='records'"
                )
            self.files = self.all_files[process_index::process_count]
        else:
            self.files = list(self.all_files)
        self.batch_size = batch_size
        self.max_seq_length = max_seq_length
        self.max_predictions_per_seq = max_predictions_per_seq
        self.seed = int(seed)
        self.process_index = process_index
        self.process_count = process_count
        self.shuffle = shuffle
        self.shuffle_buffer_size = shuffle_buffer_size
        self.masking = masking
        self.num_epochs = num_epochs
        self.cycle_length = cycle_length
        self.prefetch = prefetch
        self._epoch = 0
        self._batches_in_epoch = 0
        self._batches_total = 0
        self._iterator = None

    # --- position ---------------------------------------------------------------------------
    def _fingerprint(self) -> str:
        description = {
            "files": [os.path.basename(f) for f in self.all_files],
            "batch_size": self.batch_size,
            "max_seq_length": self.max_seq_length,
            "max_predictions_per_seq": self.max_predictions_per_seq,
            "seed": self.seed,
            "process_index": self.process_index,
            "process_count": self.process_count,
            "shard_by": self.shard_by,
            "shuffle": self.shuffle,
            "shuffle_buffer_size": self.shuffle_buffer_size,
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
            raise ValueError(f"unsupported data iterator state version {state.get('version')!r}")
        if state.get("fingerprint") != self._fingerprint():
            raise ValueError(
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
        if self.shuffle:
            # Same permutation on every host: record-level sharding needs a common order.
            order = np.random.default_rng(_derived_seed(self.seed, epoch, 1)).permutation(
                len(files)
            )
            files = [files[i] for i in order]
        dataset = tf.data.Dataset.from_tensor_slices(files)
        dataset = dataset.interleave(
            lambda path: tf.data.TFRecordDataset(path, buffer_size=records_lib.READ_BUFFER_BYTES),
            cycle_length=max(1, min(self.cycle_length, len(files))),
            block_length=1,
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
        if self.shard_by == "records" and self.process_count > 1:
            dataset = dataset.shard(self.process_count, self.process_index)
        if self.shuffle:
            # Blocks of shuffle_buffer_size records, each permuted by stateless random keys.
            # Not Dataset.shuffle: its order also depends on TensorFlow's global seed, which
            # any code in the process may set, and a resumed run must reproduce the order.
            block_key = _derived_seed(self.seed, epoch, self.process_index, 2)

            def permute(block_index, block):
                seed = tf.stack([tf.constant(block_key, tf.int64), block_index])
                keys = tf.random.stateless_uniform(tf.shape(block), seed=seed)
                return tf.gather(block, tf.argsort(keys))

            dataset = dataset.batch(self.shuffle_buffer_size).enumerate().map(permute).unbatch()
        dataset = dataset.batch(self.batch_size, drop_remainder=True)
        if skip_batches:
            dataset = dataset.skip(skip_batches)
        length, slots = self.max_seq_length, self.max_predictions_per_seq
        dataset = dataset.map(
            lambda s: records_lib.parse_batch(s, length, slots),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
        if self.masking is not None:
            masking = self.masking
            epoch_key = _derived_seed(self.seed, epoch, self.process_index, 3)

            def remask(index, batch):
                seed = tf.stack([tf.constant(epoch_key, tf.int64), tf.cast(index, tf.int64)])
                return dynamic_mask_batch(batch, seed, masking)

            dataset = dataset.enumerate(start=skip_batches).map(
                remask, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
            )
        options = tf.data.Options()
        options.deterministic = True
        dataset = dataset.with_options(options)
        return dataset.prefetch(self.prefetch)

    def __iter__(self) -> PretrainIterator:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        while True:
            if self.num_epochs is not None and self._epoch >= self.num_epochs:
                raise StopIteration
            if self._iterator is None:
                dataset = self._epoch_dataset(self._epoch, self._batches_in_epoch)
                self._iterator = dataset.as_numpy_iterator()
            try:
                batch = next(self._iterator)
            except StopIteration:
                if self._batches_in_epoch == 0:
                    raise ValueError(
                        f"host {self.process_index} of {self.process_count} has fewer than "
                        f"batch_size={self.batch_size} examples in {len(self.files)} file(s); "
                        "prepare more data or lower the batch size"
                    ) from None
                self._epoch += 1
                self._batches_in_epoch = 0
                self._iterator = None
                continue
            self._batches_in_epoch += 1
            self._batches_total += 1
            return batch


def _looks_like_records(item: str) -> bool:
    if os.path.isdir(item):
        return any(records_lib.RECORD_SUFFIX in f for f in os.listdir(item))
    return records_lib.RECORD_SUFFIX in os.path.basename(item)


def _check_record_shapes(files: Sequence[str], max_seq_length: int, slots: int) -> None:
    """Fail up front, naming the file, when records were prepared with other lengths."""
    tf = records_lib.import_tensorflow()
    first = tf.data.TFRecordDataset(files[:1], buffer_size=records_lib.READ_BUFFER_BYTES)
    for serialized in first.take(1).as_numpy_iterator():
        feature = tf.train.Example.FromString(serialized).features.feature
        missing = [n for n in records_lib.FEATURE_NAMES if n not in feature]
        if missing:
            raise ValueError(f"{files[0]}: records lack the feature(s) {', '.join(missing)}")
        found_length = len(feature["input_ids"].int64_list.value)
        found_slots = len(feature["masked_lm_positions"].int64_list.value)
        if (found_length, found_slots) != (max_seq_length, slots):
            raise ValueError(
                f"{files[0]} holds records with max_seq_length={found_length} and "
                f"max_predictions_per_seq={found_slots}, but the pipeline was asked for "
                f"{max_seq_length} and {slots}"
            )


def make_pretrain_iterator(
    records_or_source: str | os.PathLike | Sequence[str | os.PathLike],
    tokenizer: Tokenizer | str | os.PathLike | None = None,
    *,
    batch_size: int,
    max_seq_length: int = 128,
    max_predictions_per_seq: int = 20,
    seed: int = 0,
    process_index: int = 0,
    process_count: int = 1,
    dynamic_masking: bool = False,
    whole_word_mask: bool = False,
    masked_lm_prob: float = 0.15,
    shuffle: bool = True,
    shuffle_buffer_size: int = 10_000,
    num_epochs: int | None = None,
    cache_dir: str | os.PathLike | None = None,
    dupe_factor: int | None = None,
    short_seq_prob: float = 0.1,
    num_workers: int = 1,
    tfds_data_dir: str | None = None,
    shard_by: str = "auto",
    packing: PackingConfig | None = None,
) -> PretrainIterator | PackedIterator:
    """One call from data (prepared records or a raw corpus) to a resumable per-host iterator.

    With ``packing`` (``data/packing.py``), every batch of ``batch_size`` rows packs the
    instances of ``packing.instances_per_batch(batch_size)`` records; the position is the same
    kind of state as without.

    The tokenizer is needed to prepare a raw corpus and for dynamic masking; for prepared
    records it defaults to the ``tokenizer/`` saved next to them by ``data prepare``.
    ``dupe_factor`` for on-the-fly preparation defaults to 1 with dynamic masking (each epoch is
    re-masked anyway) and 5 without.
    """
    items = (
        [os.fspath(records_or_source)]
        if isinstance(records_or_source, (str, os.PathLike))
        else [os.fspath(s) for s in records_or_source]
    )
    if isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = load_tokenizer(tokenizer)
    if all(_looks_like_records(item) for item in items):
        files = records_lib.list_record_files(items)
        if tokenizer is None and dynamic_masking:
            for item in items:
                candidate = os.path.join(item, TOKENIZER_SUBDIR)
                if os.path.isdir(item) and os.path.isdir(candidate):
                    tokenizer = load_tokenizer(candidate)
                    break
        if tokenizer is not None and dynamic_masking:
            # Re-masking with another vocabulary than the records' would corrupt every batch.
            for item in items:
                config = read_prepare_config(item) if os.path.isdir(item) else None
                if config and config.get("tokenizer_fingerprint") != tokenizer.fingerprint():
                    raise ValueError(
                        f"{item} was prepared with tokenizer {config.get('tokenizer_fingerprint')}"
                        f" but dynamic masking was given {tokenizer!r}"
                    )
    else:
        if tokenizer is None:
            raise ValueError(
                f"{', '.join(items)} is a corpus, not prepared records: pass a tokenizer to "
                "prepare it"
            )
        if dupe_factor is None:
            dupe_factor = 1 if dynamic_masking else 5
        prepare_settings = {
            "items": items,
            "tokenizer": tokenizer.fingerprint(),
            "max_seq_length": max_seq_length,
            "max_predictions_per_seq": max_predictions_per_seq,
            "masked_lm_prob": masked_lm_prob,
            "short_seq_prob": short_seq_prob,
            "dupe_factor": dupe_factor,
            "whole_word_mask": whole_word_mask,
            "seed": seed,
        }
        key = hashlib.sha256(json.dumps(prepare_settings, sort_keys=True).encode()).hexdigest()
        if cache_dir is None:
            cache_dir = os.path.join(tempfile.gettempdir(), "bert_jax_data")
        output_dir = os.path.join(os.fspath(cache_dir), f"prepared-{key[:16]}")
        # A finished on-the-fly preparation leaves a marker listing its files, so restarts and
        # later phases reuse it without reading the corpus again.
        marker = os.path.join(output_dir, _COMPLETE_MARKER)
        if os.path.exists(marker):
            with open(marker, encoding="utf-8") as f:
                files = [os.path.join(output_dir, name) for name in json.load(f)["files"]]
        else:
            result = prepare_records(
                items,
                tokenizer,
                output_dir,
                max_seq_length=max_seq_length,
                max_predictions_per_seq=max_predictions_per_seq,
                masked_lm_prob=masked_lm_prob,
                short_seq_prob=short_seq_prob,
                dupe_factor=dupe_factor,
                seed=seed,
                whole_word_mask=whole_word_mask,
                num_workers=num_workers,
                tfds_data_dir=tfds_data_dir,
            )
            files = result.files
            if not files:
                raise ValueError(f"preparing {', '.join(items)} produced no instances")
            if process_index == 0:
                write_json_atomic(marker, {"files": [os.path.basename(f) for f in files]})
    _check_record_shapes(files, max_seq_length, max_predictions_per_seq)
    masking = None
    if dynamic_masking:
        if tokenizer is None:
            raise ValueError(
                "dynamic masking needs the tokenizer (special ids, vocabulary, word starts); "
                f"pass one or keep the {TOKENIZER_SUBDIR}/ directory next to the records"
            )
        masking = MaskingConfig.from_tokenizer(
            tokenizer, masked_lm_prob, max_predictions_per_seq, whole_word_mask
        )
    if packing is not None and packing.max_seq_length != max_seq_length:
        raise ValueError(
            f"packed rows of {packing.max_seq_length} tokens for records of {max_seq_length}"
        )
    iterator = PretrainIterator(
        files,
        batch_size=batch_size if packing is None else packing.instances_per_batch(batch_size),
        max_seq_length=max_seq_length,
        max_predictions_per_seq=max_predictions_per_seq,
        seed=seed,
        process_index=process_index,
        process_count=process_count,
        shuffle=shuffle,
        shuffle_buffer_size=shuffle_buffer_size,
        masking=masking,
        num_epochs=num_epochs,
        shard_by=shard_by,
    )
    return iterator if packing is None else PackedIterator(iterator, batch_size, packing)


def read_prepare_config(directory: str | os.PathLike) -> dict | None:
    """The settings ``data prepare`` recorded in ``directory``, or None for foreign records."""
    path = os.path.join(os.fspath(directory), CONFIG_FILE)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def synthetic_batch(
    batch_size: int,
    max_seq_length: int = 128,
    max_predictions_per_seq: int = 20,
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
