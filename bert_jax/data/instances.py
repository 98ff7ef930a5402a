"""Instance creation: tokenized documents -> ``[CLS] A [SEP] B [SEP]`` pairs, statically masked.

Plain Python on lists of ids (no TensorFlow, no JAX) and deterministic for a given seed.

Public API:

- ``tokenize_documents(documents, tokenizer) -> list[TokenizedDocument]``: each sentence to ids
  (special tokens in the text are treated as text), dropping sentences and documents that end up
  empty.
- ``create_instances_from_document(documents, document_index, max_seq_length, short_seq_prob,
  cls_id, sep_id, rng) -> list[Instance]``: the unmasked sentence pairs of one document.
- ``create_instances(documents, masking, max_seq_length=128, short_seq_prob=0.1,
  dupe_factor=1, seed=0, shuffle=True) -> list[Instance]``: every document, ``dupe_factor``
  times, each pass with a fresh masking (``masking.mask_ids``), then shuffled — as the
  original.
- ``mask_tokens(instance, masking, rng)``: ``masking.mask_ids`` on an ``Instance``.
- ``instances_to_arrays(instances, max_seq_length, max_predictions_per_seq) -> dict`` in the
  batch format (fixed shapes, int32/float32; ``next_sentence_labels`` is [N]).

Semantics (Devlin et al. and google-research/bert's create_pretraining_data.py):

- Per document (and per dupe pass), the target length is ``max_seq_length - 3`` with probability
  ``1 - short_seq_prob``, else uniform in [2, max_seq_length - 3]. Like the original, the draw is
  made once per document pass, so ``short_seq_prob`` is the share of document passes (not of
  instances) with a short target; ``Instance.target_seq_length`` records it.
- Sentences accumulate into a chunk until the target is reached or the document ends; A is the
  first ``a_end`` sentences (``a_end`` uniform in [1, len(chunk) - 1]); B is the rest (actual
  next) or, with probability 0.5, sentences from a different document starting at a random
  sentence, and then the unused sentences of the chunk are put back. A chunk of one sentence
  always takes a random next (``Instance.forced_random_next``), so on corpora of long sentences
  more than half of the instances are random-next.
- Truncation removes tokens from the longer segment until both fit, each from the front or back
  with probability 0.5.

A deliberate difference from the original (a fix of a known flaw): a random next always comes
from another document (the original tried 10 times and could pick the same one); at least two
documents are required. Masking's own differences are listed in ``masking.py``.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bert_jax.data.masking import MaskingConfig, mask_ids
from bert_jax.data.tokenizer import Tokenizer

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


def _truncate_pair(
    tokens_a: list[int], tokens_b: list[int], max_num_tokens: int, rng: random.Random
):
    """Drop tokens from the longer side (ties: B) until the pair fits, each from front or back.

    Computes how many tokens each side loses in closed form and then how many of those come off
    the front (a binomial(n, 1/2) draw), which is the same distribution as the original's
    one-token-at-a-time loop without its cost on very long sentences.
    """
    len_a, len_b = len(tokens_a), len(tokens_b)
    excess = len_a + len_b - max_num_tokens
    if excess <= 0:
        return tokens_a, tokens_b
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
    tokens_a = tokens_a[front_a : len_a - (cut_a - front_a)]
    tokens_b = tokens_b[front_b : len_b - (cut_b - front_b)]
    return tokens_a, tokens_b


def create_instances_from_document(
    documents: Sequence[TokenizedDocument],
    document_index: int,
    max_seq_length: int,
    short_seq_prob: float,
    cls_id: int,
    sep_id: int,
    rng: random.Random,
) -> list[Instance]:
    """The unmasked sentence-pair instances of one document (original semantics, see module)."""
    num_documents = len(documents)
    if num_documents < 2:
        raise ValueError("sentence pairs need at least two documents (for random next sentences)")
    document = documents[document_index]
    max_num_tokens = max_seq_length - 3
    target_seq_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)

    instances: list[Instance] = []
    chunk: list[list[int]] = []
    chunk_length = 0
    i = 0
    while i < len(document):
        sentence = document[i]
        chunk.append(sentence)
        chunk_length += len(sentence)
        if i == len(document) - 1 or chunk_length >= target_seq_length:
            a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
            tokens_a = list(itertools.chain.from_iterable(chunk[:a_end]))
            forced = len(chunk) == 1
            random_document_index = -1
            if forced or rng.random() < 0.5:
                target_b_length = target_seq_length - len(tokens_a)
                random_document_index = rng.randrange(num_documents - 1)
                if random_document_index >= document_index:
                    random_document_index += 1
                random_document = documents[random_document_index]
                tokens_b: list[int] = []
                for sentence_b in random_document[rng.randrange(len(random_document)) :]:
                    tokens_b.extend(sentence_b)
                    if len(tokens_b) >= target_b_length:
                        break
                # The chunk's unused sentences go back to the document for the next instance.
                i -= len(chunk) - a_end
            else:
                tokens_b = list(itertools.chain.from_iterable(chunk[a_end:]))
            tokens_a, tokens_b = _truncate_pair(tokens_a, tokens_b, max_num_tokens, rng)
            input_ids = [cls_id, *tokens_a, sep_id, *tokens_b, sep_id]
            segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
            instances.append(
                Instance(
                    input_ids=input_ids,
                    segment_ids=segment_ids,
                    is_random_next=random_document_index >= 0,
                    masked_lm_positions=[],
                    masked_lm_ids=[],
                    document_index=document_index,
                    random_document_index=random_document_index,
                    target_seq_length=target_seq_length,
                    max_num_tokens=max_num_tokens,
                    forced_random_next=forced,
                )
            )
            chunk = []
            chunk_length = 0
        i += 1
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


def _check_settings(max_seq_length: int, short_seq_prob: float, dupe_factor: int) -> None:
    if max_seq_length < 5:
        raise ValueError(
            f"max_seq_length must be >= 5 ([CLS] A [SEP] B [SEP]), got {max_seq_length}"
        )
    if not 0.0 <= short_seq_prob <= 1.0:
        raise ValueError(f"short_seq_prob must be in [0, 1], got {short_seq_prob}")
    if dupe_factor < 1:
        raise ValueError(f"dupe_factor must be >= 1, got {dupe_factor}")


def create_instances(
    documents: Sequence[TokenizedDocument],
    masking: MaskingConfig,
    max_seq_length: int = 128,
    short_seq_prob: float = 0.1,
    dupe_factor: int = 1,
    seed: int = 0,
    shuffle: bool = True,
) -> list[Instance]:
    """Masked instances from tokenized documents: ``dupe_factor`` passes, then a shuffle.

    Each pass draws new pairs and a new masking of every document, so ``dupe_factor`` copies of
    the corpus see different static maskings. Deterministic for ``seed``.
    """
    _check_settings(max_seq_length, short_seq_prob, dupe_factor)
    if masking.max_predictions_per_seq > max_seq_length:
        raise ValueError(
            f"max_predictions_per_seq {masking.max_predictions_per_seq} exceeds max_seq_length "
            f"{max_seq_length}"
        )
    documents = [d for d in documents if d]
    if len(documents) < 2:
        raise ValueError(
            f"need at least two non-empty documents to make sentence pairs, got {len(documents)}"
        )
    seed_sequence = np.random.SeedSequence(seed)
    pair_seed, mask_seed, shuffle_seed = seed_sequence.generate_state(3)
    pair_rng = random.Random(int(pair_seed))
    mask_rng = np.random.default_rng(int(mask_seed))
    # Tokenizers never give text a [CLS], [SEP] or [PAD] id; checked once here, it spares
    # masking a search per instance.
    text_has_special_ids = not masking.never_mask_ids.isdisjoint(
        itertools.chain.from_iterable(itertools.chain.from_iterable(documents))
    )
    instances: list[Instance] = []
    for _ in range(dupe_factor):
        for document_index in range(len(documents)):
            for instance in create_instances_from_document(
                documents,
                document_index,
                max_seq_length,
                short_seq_prob,
                masking.cls_id,
                masking.sep_id,
                pair_rng,
            ):
                instances.append(mask_tokens(instance, masking, mask_rng, text_has_special_ids))
    if shuffle:
        random.Random(int(shuffle_seed)).shuffle(instances)
    return instances


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
