"""Instances without next-sentence prediction: ``[CLS] text [SEP]`` rows in RoBERTa's formats.

``doc_sentences``: contiguous sentences of one document up to the target length; a document's
last instance ends with the document. ``full_sentences``: contiguous sentences that may cross
documents (in corpus order), with a [SEP] between two documents' text. Either way:

- The target is ``max_seq_length - 2`` tokens ([CLS] and the final [SEP]) or, with probability
  ``short_seq_prob`` (drawn per instance), uniform in [2, max_seq_length - 2], as the original
  does for pairs, so fine-tuning's short inputs are seen.
- A sentence that alone exceeds the target is cut into consecutive pieces of the full length
  (no text is lost); otherwise an instance ends before the sentence that would overflow it.
- ``dupe_factor`` passes over the documents, then a shuffle; each pass masks anew. The LTR
  objective takes rows unmasked (``mask=False``: no masked_lm slots set, weights 0).
- ``segment_ids`` are all 0; ``next_sentence_labels`` are 0 (never read: no NSP).

The output is ``sentence_pairs.create_instance_rows``' (batches of ``InstanceRows``, the
shuffle), so ``data prepare`` writes it the same way.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Sequence

import numpy as np

from bert_jax.data import objectives
from bert_jax.data.instances.sentence_pairs import InstanceRows, TokenizedDocument, _check_settings
from bert_jax.data.masking.settings import MaskingConfig
from bert_jax.data.masking.static_rows import mask_rows
from bert_jax.runtime.errors import UserError

FORMATS = ("doc_sentences", "full_sentences")


def _spans(documents, max_num_tokens: int, short_seq_prob: float, cross: bool, rng, out):
    """Append one instance per tuple: (pieces, target), pieces = [(document, start, end)] token
    ranges of the documents' flat tokens, in order (a [SEP] goes between two documents)."""
    pieces: list[tuple[int, int, int]] = []
    used = 0  # tokens of `pieces`, separators included

    def new_target() -> int:
        if rng.random() < short_seq_prob:
            return rng.randint(2, max_num_tokens)
        return max_num_tokens

    target = new_target()

    def flush():
        nonlocal pieces, used, target
        if pieces:
            out.append((pieces, target))
            target = new_target()
        pieces, used = [], 0

    for document_index, document in enumerate(documents):
        offset = 0
        for sentence in document:
            start, end = offset, offset + len(sentence)
            offset = end
            while start < end:  # a sentence longer than the row goes in full-length pieces
                separator = 1 if pieces and pieces[-1][0] != document_index else 0
                size = end - start
                if pieces and used + separator + size > target:
                    flush()
                    separator = 0
                take = min(size, max_num_tokens - used - separator)
                if pieces and pieces[-1][0] == document_index and pieces[-1][2] == start:
                    pieces[-1] = (document_index, pieces[-1][1], start + take)
                else:
                    pieces.append((document_index, start, start + take))
                used += separator + take
                start += take
                if used >= max_num_tokens:
                    flush()
        if not cross:
            flush()
    flush()


def create_single_rows(
    documents: Sequence[TokenizedDocument],
    masking: MaskingConfig,
    max_seq_length: int = objectives.MAX_SEQ_LENGTH,
    short_seq_prob: float = objectives.SHORT_SEQ_PROB,
    dupe_factor: int = 1,
    seed: int = 0,
    instance_format: str = "full_sentences",
    mask: bool = True,
    rows_per_batch: int = 4096,
) -> tuple[Iterator[InstanceRows], list[int]]:
    """Single-sequence instances as batches of rows and their shuffle (module docstring)."""
    if instance_format not in FORMATS:
        raise UserError(f"instance format {instance_format!r} is not one of {FORMATS}")
    _check_settings(max_seq_length, short_seq_prob, dupe_factor)
    documents = [d for d in documents if d]
    if not documents:
        raise UserError("no non-empty documents to make instances of")
    seed_sequence = np.random.SeedSequence(seed)
    span_seed, mask_seed, shuffle_seed = seed_sequence.generate_state(3)
    span_rng = random.Random(int(span_seed))
    max_num_tokens = max_seq_length - 2
    spans: list[tuple] = []
    for _ in range(dupe_factor):
        _spans(
            documents,
            max_num_tokens,
            short_seq_prob,
            instance_format == "full_sentences",
            span_rng,
            spans,
        )
    order = list(range(len(spans)))
    random.Random(int(shuffle_seed)).shuffle(order)
    batches = _rows(documents, spans, masking, max_seq_length, int(mask_seed), mask, rows_per_batch)
    return batches, order


def _rows(documents, spans, masking, max_seq_length, mask_seed, mask, rows_per_batch):
    flat = [np.fromiter(itertools.chain.from_iterable(d), np.int32) for d in documents]
    mask_rng = np.random.default_rng(mask_seed)
    slots = masking.max_predictions_per_seq
    for first in range(0, len(spans), rows_per_batch):
        batch = spans[first : first + rows_per_batch]
        n = len(batch)
        input_ids = np.zeros((n, max_seq_length), np.int32)
        lengths = np.zeros(n, np.int64)
        for row, (pieces, _) in enumerate(batch):
            parts = [np.asarray([masking.cls_id], np.int32)]
            for i, (document, start, end) in enumerate(pieces):
                if i:
                    parts.append(np.asarray([masking.sep_id], np.int32))
                parts.append(flat[document][start:end])
            parts.append(np.asarray([masking.sep_id], np.int32))
            ids = np.concatenate(parts)
            input_ids[row, : len(ids)] = ids
            lengths[row] = len(ids)
        in_row = np.arange(max_seq_length)[None, :] < lengths[:, None]
        if mask:
            masked, positions, labels, counts = mask_rows(input_ids, lengths, masking, mask_rng)
        else:
            masked = input_ids
            positions = labels = np.zeros((n, slots), np.int32)
            counts = np.zeros(n, np.int32)
        yield InstanceRows(
            arrays={
                "input_ids": masked,
                "input_mask": in_row.astype(np.int32),
                "segment_ids": np.zeros((n, max_seq_length), np.int32),
                "masked_lm_positions": positions,
                "masked_lm_ids": labels,
                "masked_lm_weights": (np.arange(slots)[None, :] < counts[:, None]).astype(
                    np.float32
                ),
                "next_sentence_labels": np.zeros(n, np.int32),
            },
            lengths=lengths,
            document_index=np.asarray([pieces[0][0] for pieces, _ in batch], np.int64),
            random_document_index=np.full(n, -1, np.int64),
            target_seq_length=np.asarray([target for _, target in batch], np.int64),
            forced_random_next=np.zeros(n, bool),
            max_num_tokens=max_seq_length - 2,
        )
