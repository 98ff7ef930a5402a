"""Sentence pairs (and their static masking): the original semantics, over >10,000 instances."""

from __future__ import annotations

import random

import numpy as np
import pytest

from bert_jax.data.instances import sentence_pairs as instances_lib
from bert_jax.data.instances.sentence_pairs import (
    create_instances,
    create_instances_from_document,
    instances_to_arrays,
)
from tests.data_fixtures import embedded_spm, embedded_tokenized, masking_config

MAX_SEQ_LENGTH = 128
MAX_PREDICTIONS = 20


@pytest.fixture(scope="module")
def static_instances():
    documents = embedded_tokenized()
    instances = create_instances(
        documents,
        masking_config(masked_lm_prob=0.15, max_predictions_per_seq=MAX_PREDICTIONS),
        max_seq_length=MAX_SEQ_LENGTH,
        short_seq_prob=0.1,
        dupe_factor=4,
        seed=7,
    )
    arrays = instances_to_arrays(instances, MAX_SEQ_LENGTH, MAX_PREDICTIONS)
    return documents, instances, arrays


def _restore(arrays: dict) -> np.ndarray:
    """Original (unmasked) ids: the masked positions get their labels back."""
    restored = arrays["input_ids"].copy()
    rows, slots = np.nonzero(arrays["masked_lm_weights"])
    restored[rows, arrays["masked_lm_positions"][rows, slots]] = arrays["masked_lm_ids"][
        rows, slots
    ]
    return restored


def _is_slice_of(needle: np.ndarray, haystack: np.ndarray) -> bool:
    needle_bytes, haystack_bytes = needle.astype(np.int32).tobytes(), haystack.tobytes()
    start = haystack_bytes.find(needle_bytes)
    while start != -1 and start % 4:
        start = haystack_bytes.find(needle_bytes, start + 1)
    return start != -1


def test_masking_statistics_over_ten_thousand_instances(static_instances):
    _, instances, arrays = static_instances
    tokenizer = embedded_spm()
    cls_id, sep_id, mask_id = tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id
    assert len(instances) >= 10_000
    input_ids, input_mask = arrays["input_ids"], arrays["input_mask"]
    weights = arrays["masked_lm_weights"]
    labels, positions = arrays["masked_lm_ids"], arrays["masked_lm_positions"]

    # Random replacements never produce special ids, so they still mark the special positions.
    non_special = ((input_mask == 1) & (input_ids != cls_id) & (input_ids != sep_id)).sum(axis=1)
    num_predictions = weights.sum(axis=1).astype(np.int64)
    expected = np.minimum(MAX_PREDICTIONS, np.maximum(1, np.round(0.15 * non_special)))
    np.testing.assert_array_equal(num_predictions, expected)
    below_cap = np.round(0.15 * non_special) < MAX_PREDICTIONS
    assert below_cap.mean() > 0.99
    selected_share = num_predictions[below_cap].sum() / non_special[below_cap].sum()
    assert abs(selected_share - 0.15) < 0.005, selected_share

    # [CLS], [SEP] and [PAD] are never selected; positions are real, unique and ascending.
    valid = weights > 0
    assert not np.isin(labels[valid], [cls_id, sep_id, tokenizer.pad_id]).any()
    lengths = input_mask.sum(axis=1)
    assert (positions[valid] < np.broadcast_to(lengths[:, None], positions.shape)[valid]).all()
    assert (positions[valid] > 0).all()
    assert (np.diff(valid.astype(np.int8), axis=1) <= 0).all()  # real slots come first
    assert (np.diff(positions, axis=1)[valid[:, 1:]] > 0).all()
    assert (positions[~valid] == 0).all() and (labels[~valid] == 0).all()

    # 80% [MASK] / 10% random / 10% unchanged.
    at_positions = np.take_along_axis(input_ids, positions, axis=1)[valid]
    masked_share = (at_positions == mask_id).mean()
    kept_share = (at_positions == labels[valid]).mean()
    random_share = 1.0 - masked_share - kept_share
    assert abs(masked_share - 0.8) < 0.015, masked_share
    assert abs(kept_share - 0.1) < 0.015, kept_share
    assert abs(random_share - 0.1) < 0.015, random_share
    replaced = at_positions[(at_positions != mask_id) & (at_positions != labels[valid])]
    assert np.isin(replaced, tokenizer.ordinary_ids).all()
    print(
        f"\nselected {selected_share:.4f} of non-special tokens over {len(instances)} instances; "
        f"[MASK] {masked_share:.4f}, random {random_share:.4f}, unchanged {kept_share:.4f}"
    )


def test_segments_and_input_mask_are_consistent(static_instances):
    _, _, arrays = static_instances
    tokenizer = embedded_spm()
    input_ids, input_mask, segment_ids = (
        arrays["input_ids"],
        arrays["input_mask"],
        arrays["segment_ids"],
    )
    lengths = input_mask.sum(axis=1)
    positions = np.arange(MAX_SEQ_LENGTH)[None, :]
    np.testing.assert_array_equal(input_mask, (positions < lengths[:, None]).astype(np.int32))
    assert (input_ids[input_mask == 0] == tokenizer.pad_id).all()
    assert (segment_ids[input_mask == 0] == 0).all()
    assert (input_ids[:, 0] == tokenizer.cls_id).all()
    rows = np.arange(len(lengths))
    assert (input_ids[rows, lengths - 1] == tokenizer.sep_id).all()
    assert ((input_ids == tokenizer.sep_id) & (input_mask == 1)).sum(axis=1).tolist() == [2] * len(
        rows
    )
    # Segment 0 is [CLS] A [SEP], segment 1 is B [SEP]; both A and B hold at least one token.
    first_b = np.argmax(segment_ids == 1, axis=1)
    assert (segment_ids[rows, lengths - 1] == 1).all()
    assert (input_ids[rows, first_b - 1] == tokenizer.sep_id).all()
    assert (first_b >= 3).all() and (lengths - first_b >= 2).all()
    in_b = (positions >= first_b[:, None]) & (positions < lengths[:, None])
    np.testing.assert_array_equal(segment_ids == 1, in_b)
    assert (lengths <= MAX_SEQ_LENGTH).all() and arrays["input_ids"].dtype == np.int32


def test_next_sentences_come_from_the_right_documents(static_instances):
    documents, instances, arrays = static_instances
    restored = _restore(arrays)
    streams = [np.concatenate([np.asarray(s, dtype=np.int32) for s in d]) for d in documents]
    labels = arrays["next_sentence_labels"]
    random_next = np.array([i.is_random_next for i in instances])
    forced = np.array([i.forced_random_next for i in instances])
    np.testing.assert_array_equal(labels, random_next.astype(np.int32))
    assert not (forced & ~random_next).any()
    for row, instance in enumerate(instances[:3000]):
        length = int(arrays["input_mask"][row].sum())
        first_b = int(np.argmax(arrays["segment_ids"][row] == 1))
        tokens_a = restored[row, 1 : first_b - 1]
        tokens_b = restored[row, first_b : length - 1]
        assert _is_slice_of(tokens_a, streams[instance.document_index])
        if instance.is_random_next:
            assert instance.random_document_index != instance.document_index
            assert _is_slice_of(tokens_b, streams[instance.random_document_index])
        else:
            assert instance.random_document_index == -1
            assert _is_slice_of(tokens_b, streams[instance.document_index])

    # Random next is a fair coin where the chunk holds two or more sentences...
    share = random_next[~forced].mean()
    assert abs(share - 0.5) < 0.02, share
    # ... and forced where it holds one, which lifts the overall share above one half.
    forced_share = forced.mean()
    overall = random_next.mean()
    assert overall == pytest.approx(forced_share + (1 - forced_share) * share)
    print(
        f"\nrandom next {share:.4f} where chunks hold >= 2 sentences; forced {forced_share:.4f} "
        f"of all instances; overall {overall:.4f}"
    )


def test_random_next_on_a_corpus_of_long_sentences():
    """Sentences near or above the target length: many single-sentence chunks, forced random."""
    rng = np.random.default_rng(0)
    ordinary = embedded_spm().ordinary_ids
    documents = [
        [rng.choice(ordinary, size=int(n)).tolist() for n in rng.integers(20, 200, size=12)]
        for _ in range(600)
    ]
    instances = create_instances(
        documents, masking_config(), max_seq_length=128, short_seq_prob=0.1, seed=3
    )
    random_next = np.array([i.is_random_next for i in instances])
    forced = np.array([i.forced_random_next for i in instances])
    assert len(instances) > 5_000
    assert 0.3 < forced.mean() < 0.8
    assert abs(random_next[~forced].mean() - 0.5) < 0.02
    assert random_next.mean() > 0.6
    print(
        f"\nlong sentences: forced {forced.mean():.4f}, random among the rest "
        f"{random_next[~forced].mean():.4f}, overall {random_next.mean():.4f}"
    )


def test_short_target_share_is_short_seq_prob_per_document_pass():
    """Like the original, the short target is drawn once per document per pass."""
    documents = embedded_tokenized()
    rng = random.Random(11)
    draws = short = short_instances = total_instances = 0
    for _ in range(5):
        for index in range(len(documents)):
            instances = create_instances_from_document(documents, index, 128, 0.1, 2, 3, rng)
            draws += 1
            targets = {i.target_seq_length for i in instances}
            assert len(targets) == 1
            target = targets.pop()
            short += target < 125
            short_instances += sum(i.is_short_target for i in instances)
            total_instances += len(instances)
            assert 2 <= target <= 125
    share = short / draws
    tolerance = 3 * np.sqrt(0.1 * 0.9 / draws)
    assert abs(share - 0.1) < tolerance, (share, tolerance)
    print(
        f"\nshort target in {share:.4f} of {draws} document passes; short instances "
        f"{short_instances / total_instances:.4f} of {total_instances}"
    )


def test_instances_are_deterministic_by_seed_and_truncated_to_fit():
    documents = list(embedded_tokenized()[:80])
    masking = masking_config()

    def make(seed):
        return instances_to_arrays(
            create_instances(documents, masking, max_seq_length=64, dupe_factor=2, seed=seed),
            64,
            20,
        )

    first, again, other = make(1), make(1), make(2)
    for name in first:
        np.testing.assert_array_equal(first[name], again[name])
    assert not np.array_equal(first["input_ids"][:50], other["input_ids"][:50])
    assert first["input_mask"].sum(axis=1).max() == 64


def test_truncation_keeps_both_segments_and_cuts_the_longer_side():
    rng = random.Random(0)
    tokens_a, tokens_b = list(range(100)), list(range(1000, 1010))
    a, b = instances_lib._truncate_pair(tokens_a, tokens_b, 30, rng)
    assert (len(a), len(b)) == (20, 10) and b == tokens_b
    assert a == tokens_a[a[0] : a[0] + 20]  # a contiguous window: cut from both ends
    a, b = instances_lib._truncate_pair(list(range(20)), list(range(20)), 15, rng)
    assert (len(a), len(b)) == (8, 7)  # on a tie B loses first, so B loses the odd token
    fronts = [
        instances_lib._truncate_pair(list(range(50)), [1], 11, rng)[0][0] for _ in range(2000)
    ]
    assert abs(np.mean(fronts) - 20) < 1.0  # 40 cuts, half from the front on average


def test_bad_settings_are_refused():
    documents = list(embedded_tokenized()[:3])
    with pytest.raises(ValueError, match="masked_lm_prob must be in"):
        masking_config(masked_lm_prob=1.5)
    with pytest.raises(ValueError, match="max_seq_length must be >= 5"):
        create_instances(documents, masking_config(), max_seq_length=4)
    with pytest.raises(ValueError, match="exceeds max_seq_length"):
        create_instances(documents, masking_config(max_predictions_per_seq=80), max_seq_length=64)
    with pytest.raises(ValueError, match="at least two non-empty documents"):
        create_instances(documents[:1], masking_config())
    with pytest.raises(ValueError, match="dupe_factor"):
        create_instances(documents, masking_config(), dupe_factor=0)
