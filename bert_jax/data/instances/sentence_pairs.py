"""Instance creation: tokenized documents -> ``[CLS] A [SEP] B [SEP]`` pairs, statically masked.

No TensorFlow, no JAX; deterministic for a given seed. Pairs are drawn in Python as token
ranges of the documents (a few integers each); rows are then built, masked
(``static_rows.mask_rows``) and handed out as arrays a batch at a time.

Public API:

- ``tokenize_documents(documents, tokenizer) -> list[TokenizedDocument]``: each sentence to ids
  (special tokens in the text are treated as text), dropping sentences and documents that end up
  empty.
- ``create_instances_from_document(documents, document_index, max_seq_length, short_seq_prob,
  cls_id, sep_id, rng, random_next_prob) -> list[Instance]``: the unmasked sentence pairs of one
  document.
- ``create_instances(documents, masking, max_seq_length, short_seq_prob, dupe_factor=1, seed=0,
  shuffle=True, random_next_prob) -> list[Instance]``: every document, ``dupe_factor`` times,
  each pass with a fresh masking (``static_sequence.mask_ids``), then shuffled — as the
  original (the length and shares default to data/objectives.py's).
- ``create_instance_rows(...same...) -> (batches of InstanceRows, order)``: the same instances
  as batch-format arrays in creation order, and the shuffle (what ``data prepare`` writes).
- ``mask_tokens(instance, masking, rng)``: ``static_sequence.mask_ids`` on an ``Instance``.
- ``instances_to_arrays(instances, max_seq_length, max_predictions_per_seq) -> dict`` in the
  batch format (fixed shapes, int32/float32; ``next_sentence_labels`` is [N]).

Why this file is long: the list form (``create_instances``) and the array form
(``create_instance_rows``) must draw from the random generator in exactly the original's order;
kept side by side, a change to one is seen against the other.

Semantics (Devlin et al. and google-research/bert's create_pretraining_data.py):

- Per document (and per dupe pass), the target length is ``max_seq_length - 3`` with probability
  ``1 - short_seq_prob``, else uniform in [2, max_seq_length - 3]. Like the original, the draw is
  made once per document pass, so ``short_seq_prob`` is the share of document passes (not of
  instances) with a short target; ``Instance.target_seq_length`` records it.
- Sentences accumulate into a chunk until the target is reached or the document ends; A is the
  first ``a_end`` sentences (``a_end`` uniform in [1, len(chunk) - 1]); B is the rest (actual
  next) or, with probability ``random_next_prob`` (the paper's 0.5), sentences from a different
  document starting at a random sentence, and then the unused sentences of the chunk are put
  back. A chunk of one sentence always takes a random next (``Instance.forced_random_next``), so
  on corpora of long sentences more instances are random-next than the share says.
- Truncation removes tokens from the longer segment until both fit, each from the front or back
  with probability 0.5.

A deliberate difference from the original (a fix of a known flaw): a random next always comes
from another document (the original tried 10 times and could pick the same one); at least two
documents are required. Masking's own differences are listed in ``masking/static_sequence.py``.
"""

from __future__ import annotations

import bisect
import itertools
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from bert_jax.data import objectives
from bert_jax.data.masking.settings import MaskingConfig
from bert_jax.data.masking.static_rows import mask_rows
from bert_jax.data.masking.static_sequence import mask_ids
from bert_jax.data.tokenizers.interface import Tokenizer
from bert_jax.runtime.errors import UserError

TokenizedDocument = list[list[int]]


@dataclass(slots=True)
class Instance:
    """One ``[CLS] A [SEP] B [SEP]`` example, unpadded, with where it came from."""

    input_ids: list[int]  # [n]; masked once ``masked_lm_positions`` is set
    segment_ids: list[int]  # [n]
    is_random_next: bool
    masked_lm_positions: list[int]  # [k], ascending
    masked_lm_ids: list[int]  # [k], the original ids at those positions
    document_index: int
    random_document_index: int  # -1 for an actual next
    target_seq_length: int
    max_num_tokens: int
    forced_random_next: bool

    @property
    def is_short_target(self) -> bool:
        return self.target_seq_length < self.max_num_tokens


def tokenize_documents(documents: Sequence[Sequence[str]], tokenizer: Tokenizer) -> list:
    """Sentences to ids; special-token strings in the text stay text. Empty results are dropped."""
    tokenized: list[TokenizedDocument] = []
    encode_batch = getattr(tokenizer, "encode_batch", None)
    for document in documents:
        if encode_batch is not None:
            sentences = encode_batch(list(document))
        else:
            sentences = [tokenizer.encode(s, allow_special=False) for s in document]
        sentences = [s for s in sentences if s]
        if sentences:
            tokenized.append(sentences)
    return tokenized


class _SentenceEnds:
    """Per document, where each sentence ends in the document's tokens: ``[0, e1, e2, ...]``.

    Computed when first asked for (``create_instances_from_document`` touches few documents).
    """

    def __init__(self, documents: Sequence[TokenizedDocument]):
        self.documents = documents
        self.ends: dict[int, list[int]] = {}

    def __len__(self) -> int:
        return len(self.documents)

    def __getitem__(self, index: int) -> list[int]:
        ends = self.ends.get(index)
        if ends is None:
            ends = self.ends[index] = [0, *itertools.accumulate(map(len, self.documents[index]))]
        return ends


def _pair_document(
    sentence_ends,
    document_index: int,
    max_num_tokens: int,
    short_seq_prob: float,
    random_next_prob: float,
    rng,
    out,
) -> None:
    """Append one tuple per instance of a document (original semantics, see module):
    ``(document, a_start, a_end, b_document or -1, b_start, b_end, target_seq_length,
    forced_random_next)``, A and B as token ranges of their documents (B of ``document`` when
    it is the actual next), truncated.

    Only token counts are handled here: a chunk ends at the first sentence that brings it to
    the target (``bisect`` on the sentence ends), and a random B runs from its first sentence
    to the first that brings it to what A left of the target.
    """
    num_documents = len(sentence_ends)
    ends = sentence_ends[document_index]
    num_sentences = len(ends) - 1
    target_seq_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)
    i = 0
    while i < num_sentences:
        a_start = ends[i]
        last = min(bisect.bisect_left(ends, a_start + target_seq_length, i + 1), num_sentences) - 1
        chunk = last - i + 1
        a_sentences = rng.randint(1, chunk - 1) if chunk >= 2 else 1
        a_end = ends[i + a_sentences]
        forced = chunk == 1
        if forced or rng.random() < random_next_prob:
            b_document = rng.randrange(num_documents - 1)
            if b_document >= document_index:
                b_document += 1
            b_ends = sentence_ends[b_document]
            b_sentence = rng.randrange(len(b_ends) - 1)
            b_start = b_ends[b_sentence]
            target_b_length = target_seq_length - (a_end - a_start)
            b_last = bisect.bisect_left(b_ends, b_start + target_b_length, b_sentence + 1)
            b_end = b_ends[min(b_last, len(b_ends) - 1)]
            # The chunk's unused sentences go back to the document for the next instance.
            i += a_sentences
        else:
            b_document = -1
            b_start, b_end = a_end, ends[last + 1]
            i = last + 1
        excess = a_end - a_start + b_end - b_start - max_num_tokens
        if excess > 0:
            a_start, a_end, b_start, b_end = _truncate(a_start, a_end, b_start, b_end, excess, rng)
        out.append(
            (document_index, a_start, a_end, b_document, b_start, b_end, target_seq_length, forced)
        )


def _truncate(a_start: int, a_end: int, b_start: int, b_end: int, excess: int, rng):
    """Drop ``excess`` tokens from the longer side (ties: B) until the pair fits, each from the
    front or back.

    Computes how many tokens each side loses in closed form and then how many of those come off
    the front (a binomial(n, 1/2) draw), which is the same distribution as the original's
    one-token-at-a-time loop without its cost on very long sentences.
    """
    len_a, len_b = a_end - a_start, b_end - b_start
    cut_a = cut_b = 0
    if len_a > len_b:
        cut_a = min(excess, len_a - len_b)
    elif len_b > len_a:
        cut_b = min(excess, len_b - len_a)
    remaining = excess - cut_a - cut_b
    cut_b += (remaining + 1) // 2
    cut_a += remaining // 2
    front_a = rng.getrandbits(cut_a).bit_count() if cut_a else 0
    front_b = rng.getrandbits(cut_b).bit_count() if cut_b else 0
    return (
        a_start + front_a,
        a_end - (cut_a - front_a),
        b_start + front_b,
        b_end - (cut_b - front_b),
    )


def _truncate_pair(tokens_a: list[int], tokens_b: list[int], max_num_tokens: int, rng):
    """``_truncate`` on two token lists: both, cut to fit ``max_num_tokens`` together."""
    excess = len(tokens_a) + len(tokens_b) - max_num_tokens
    if excess <= 0:
        return tokens_a, tokens_b
    a_start, a_end, b_start, b_end = _truncate(0, len(tokens_a), 0, len(tokens_b), excess, rng)
    return tokens_a[a_start:a_end], tokens_b[b_start:b_end]


def create_instances_from_document(
    documents: Sequence[TokenizedDocument],
    document_index: int,
    max_seq_length: int,
    short_seq_prob: float,
    cls_id: int,
    sep_id: int,
    rng: random.Random,
    random_next_prob: float = objectives.RANDOM_NEXT_PROB,
) -> list[Instance]:
    """The unmasked sentence-pair instances of one document (original semantics, see module)."""
    if len(documents) < 2:
        raise UserError("sentence pairs need at least two documents (for random next sentences)")
    max_num_tokens = max_seq_length - 3
    spans: list[tuple] = []
    _pair_document(
        _SentenceEnds(documents),
        document_index,
        max_num_tokens,
        short_seq_prob,
        random_next_prob,
        rng,
        spans,
    )
    flat: dict[int, list[int]] = {}

    def tokens(document: int) -> list[int]:
        if document not in flat:
            flat[document] = list(itertools.chain.from_iterable(documents[document]))
        return flat[document]

    instances = []
    for document, a_start, a_end, b_document, b_start, b_end, target, forced in spans:
        tokens_a = tokens(document)[a_start:a_end]
        tokens_b = tokens(document if b_document < 0 else b_document)[b_start:b_end]
        instances.append(
            Instance(
                input_ids=[cls_id, *tokens_a, sep_id, *tokens_b, sep_id],
                segment_ids=[0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1),
                is_random_next=b_document >= 0,
                masked_lm_positions=[],
                masked_lm_ids=[],
                document_index=document,
                random_document_index=b_document,
                target_seq_length=target,
                max_num_tokens=max_num_tokens,
                forced_random_next=forced,
            )
        )
    return instances


def mask_tokens(
    instance: Instance,
    masking: MaskingConfig,
    rng: np.random.Generator,
    text_has_special_ids: bool = True,
) -> Instance:
    """Mask an unmasked ``Instance`` in place and return it.

    Without special ids in the text, the maskable positions follow from the layout alone: all
    but [CLS] and the two [SEP]s.
    """
    candidates = None
    if not text_has_special_ids:
        first_b = instance.segment_ids.index(1)
        candidates = [*range(1, first_b - 1), *range(first_b, len(instance.input_ids) - 1)]
    masked, positions, labels = mask_ids(instance.input_ids, masking, rng, candidates)
    instance.input_ids = masked
    instance.masked_lm_positions = positions
    instance.masked_lm_ids = labels
    return instance


def _check_settings(
    max_seq_length: int, short_seq_prob: float, dupe_factor: int, random_next_prob: float = 0.0
) -> None:
    """A UserError for settings no instance can be made with (single segments have no next
    sentence: ``random_next_prob`` 0)."""
    if max_seq_length < 5:
        raise UserError(
            f"max_seq_length must be >= 5 ([CLS] A [SEP] B [SEP]), got {max_seq_length}"
        )
    if not 0.0 <= short_seq_prob <= 1.0:
        raise UserError(f"short_seq_prob must be in [0, 1], got {short_seq_prob}")
    if not 0.0 <= random_next_prob <= 1.0:
        raise UserError(f"random_next_prob must be in [0, 1], got {random_next_prob}")
    if dupe_factor < 1:
        raise UserError(f"dupe_factor must be >= 1, got {dupe_factor}")


@dataclass
class InstanceRows:
    """Masked instances as rows of the batch format, and where each one came from.

    ``arrays`` has ``instances_to_arrays``' keys, shapes and dtypes; the others are [N].
    """

    arrays: dict[str, np.ndarray]
    lengths: np.ndarray
    document_index: np.ndarray
    random_document_index: np.ndarray  # -1 for an actual next
    target_seq_length: np.ndarray
    forced_random_next: np.ndarray
    max_num_tokens: int

    def __len__(self) -> int:
        return len(self.lengths)

    def instances(self) -> list[Instance]:
        a = self.arrays
        ids, segments = a["input_ids"].tolist(), a["segment_ids"].tolist()
        positions, labels = a["masked_lm_positions"].tolist(), a["masked_lm_ids"].tolist()
        counts = a["masked_lm_weights"].sum(axis=1).astype(np.int64).tolist()
        lengths, documents = self.lengths.tolist(), self.document_index.tolist()
        random_documents = self.random_document_index.tolist()
        targets, forced = self.target_seq_length.tolist(), self.forced_random_next.tolist()
        return [
            Instance(
                input_ids=ids[i][: lengths[i]],
                segment_ids=segments[i][: lengths[i]],
                is_random_next=random_documents[i] >= 0,
                masked_lm_positions=positions[i][: counts[i]],
                masked_lm_ids=labels[i][: counts[i]],
                document_index=documents[i],
                random_document_index=random_documents[i],
                target_seq_length=targets[i],
                max_num_tokens=self.max_num_tokens,
                forced_random_next=forced[i],
            )
            for i in range(len(lengths))
        ]


def create_instance_rows(
    documents: Sequence[TokenizedDocument],
    masking: MaskingConfig,
    max_seq_length: int = objectives.MAX_SEQ_LENGTH,
    short_seq_prob: float = objectives.SHORT_SEQ_PROB,
    dupe_factor: int = 1,
    seed: int = 0,
    rows_per_batch: int = 4096,
    random_next_prob: float = objectives.RANDOM_NEXT_PROB,
) -> tuple[Iterator[InstanceRows], list[int]]:
    """``create_instances`` as batches of rows: (masked batches in creation order, the shuffle).

    Output position ``p`` of ``create_instances`` holds instance ``order[p]`` of the batches'
    concatenation. Every pair is drawn first (a few integers each); the batches are built,
    masked (``static_rows.mask_rows``) and handed out ``rows_per_batch`` at a time, so memory
    stays at one batch of rows. Same instances, masking and order as ``create_instances``.
    """
    _check_settings(max_seq_length, short_seq_prob, dupe_factor, random_next_prob)
    if masking.max_predictions_per_seq > max_seq_length:
        raise UserError(
            f"max_predictions_per_seq {masking.max_predictions_per_seq} exceeds max_seq_length "
            f"{max_seq_length}"
        )
    documents = [d for d in documents if d]
    if len(documents) < 2:
        raise UserError(
            f"need at least two non-empty documents to make sentence pairs, got {len(documents)}"
        )
    seed_sequence = np.random.SeedSequence(seed)
    pair_seed, mask_seed, shuffle_seed = seed_sequence.generate_state(3)
    pair_rng = random.Random(int(pair_seed))
    max_num_tokens = max_seq_length - 3
    sentence_ends = _SentenceEnds(documents)
    spans: list[tuple] = []
    for _ in range(dupe_factor):
        for document_index in range(len(documents)):
            _pair_document(
                sentence_ends,
                document_index,
                max_num_tokens,
                short_seq_prob,
                random_next_prob,
                pair_rng,
                spans,
            )
    order = list(range(len(spans)))
    random.Random(int(shuffle_seed)).shuffle(order)
    return _masked_batches(
        documents, spans, masking, max_seq_length, int(mask_seed), rows_per_batch
    ), order


def _masked_batches(documents, spans, masking, max_seq_length, mask_seed, rows_per_batch):
    document_tokens = [np.fromiter(itertools.chain.from_iterable(d), np.int32) for d in documents]
    document_starts = np.cumsum([0] + [len(t) for t in document_tokens])
    tokens = np.concatenate([*document_tokens, np.zeros(1, np.int32)])  # never empty
    del document_tokens
    mask_rng = np.random.default_rng(mask_seed)
    columns = np.arange(max_seq_length)
    slots = np.arange(masking.max_predictions_per_seq)
    for first in range(0, len(spans), rows_per_batch):
        batch = np.asarray(spans[first : first + rows_per_batch], dtype=np.int64)
        document, a_start, a_end, b_document, b_start, b_end, target, forced = batch.T
        a_length, b_length = a_end - a_start, b_end - b_start
        a_first = document_starts[document] + a_start
        b_first = document_starts[np.where(b_document < 0, document, b_document)] + b_start
        lengths = a_length + b_length + 3
        # Row layout: [CLS] at 0, A at 1..a_length, [SEP], B from a_length + 2, [SEP], padding.
        in_a = columns <= a_length[:, None]
        source = np.where(
            in_a, a_first[:, None] - 1 + columns, (b_first - a_length - 2)[:, None] + columns
        )
        in_row = columns < lengths[:, None]
        input_ids = tokens[np.clip(source, 0, len(tokens) - 1)]
        rows = np.arange(len(batch))
        input_ids[:, 0] = masking.cls_id
        input_ids[rows, a_length + 1] = masking.sep_id
        input_ids[rows, lengths - 1] = masking.sep_id
        input_ids[~in_row] = 0
        segment_ids = (in_row & (columns >= (a_length + 2)[:, None])).astype(np.int32)
        masked, positions, labels, counts = mask_rows(input_ids, lengths, masking, mask_rng)
        yield InstanceRows(
            arrays={
                "input_ids": masked,
                "input_mask": in_row.astype(np.int32),
                "segment_ids": segment_ids,
                "masked_lm_positions": positions,
                "masked_lm_ids": labels,
                "masked_lm_weights": (slots < counts[:, None]).astype(np.float32),
                "next_sentence_labels": (b_document >= 0).astype(np.int32),
            },
            lengths=lengths,
            document_index=document,
            random_document_index=b_document,
            target_seq_length=target,
            forced_random_next=forced.astype(bool),
            max_num_tokens=max_seq_length - 3,
        )


def create_instances(
    documents: Sequence[TokenizedDocument],
    masking: MaskingConfig,
    max_seq_length: int = objectives.MAX_SEQ_LENGTH,
    short_seq_prob: float = objectives.SHORT_SEQ_PROB,
    dupe_factor: int = 1,
    seed: int = 0,
    shuffle: bool = True,
    random_next_prob: float = objectives.RANDOM_NEXT_PROB,
) -> list[Instance]:
    """Masked instances from tokenized documents: ``dupe_factor`` passes, then a shuffle.

    Each pass draws new pairs and a new masking of every document, so ``dupe_factor`` copies of
    the corpus see different static maskings. Deterministic for ``seed``.
    """
    batches, order = create_instance_rows(
        documents,
        masking,
        max_seq_length,
        short_seq_prob,
        dupe_factor,
        seed,
        random_next_prob=random_next_prob,
    )
    instances = [instance for batch in batches for instance in batch.instances()]
    return [instances[i] for i in order] if shuffle else instances


def instances_to_arrays(
    instances: Sequence[Instance], max_seq_length: int, max_predictions_per_seq: int
) -> dict[str, np.ndarray]:
    """Stack instances into the fixed-shape batch format (padding: id 0, position 0, weight 0)."""
    n = len(instances)
    arrays = {
        "input_ids": np.zeros((n, max_seq_length), dtype=np.int32),
        "input_mask": np.zeros((n, max_seq_length), dtype=np.int32),
        "segment_ids": np.zeros((n, max_seq_length), dtype=np.int32),
        "masked_lm_positions": np.zeros((n, max_predictions_per_seq), dtype=np.int32),
        "masked_lm_ids": np.zeros((n, max_predictions_per_seq), dtype=np.int32),
        "masked_lm_weights": np.zeros((n, max_predictions_per_seq), dtype=np.float32),
        "next_sentence_labels": np.zeros((n,), dtype=np.int32),
    }
    for row, instance in enumerate(instances):
        length = len(instance.input_ids)
        num_predictions = len(instance.masked_lm_positions)
        if length > max_seq_length or num_predictions > max_predictions_per_seq:
            raise ValueError(
                f"instance {row} has {length} tokens / {num_predictions} predictions; limits are "
                f"{max_seq_length} / {max_predictions_per_seq}"
            )
        arrays["input_ids"][row, :length] = instance.input_ids
        arrays["input_mask"][row, :length] = 1
        arrays["segment_ids"][row, :length] = instance.segment_ids
        arrays["masked_lm_positions"][row, :num_predictions] = instance.masked_lm_positions
        arrays["masked_lm_ids"][row, :num_predictions] = instance.masked_lm_ids
        arrays["masked_lm_weights"][row, :num_predictions] = 1.0
        arrays["next_sentence_labels"][row] = int(instance.is_random_next)
    return arrays
