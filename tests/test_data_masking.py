"""Masked-LM masking (static): whole words, and random replacements from ordinary tokens only."""

from __future__ import annotations

import numpy as np

from bert_jax.data import instances as instances_lib
from bert_jax.data import sources
from bert_jax.data.instances import create_instances, instances_to_arrays
from bert_jax.data.masking import MaskingConfig, mask_instance
from bert_jax.data.tokenizer import load_tokenizer
from tests.data_fixtures import embedded_spm, embedded_tokenized, masking_config, minilm_vocab_path


def _restore(arrays: dict) -> np.ndarray:
    """Original (unmasked) ids: the masked positions get their labels back."""
    restored = arrays["input_ids"].copy()
    rows, slots = np.nonzero(arrays["masked_lm_weights"])
    restored[rows, arrays["masked_lm_positions"][rows, slots]] = arrays["masked_lm_ids"][
        rows, slots
    ]
    return restored


def test_whole_word_masking_masks_whole_words_and_decides_per_word():
    tokenizer = embedded_spm()
    masking = masking_config(whole_word_mask=True)
    instances = create_instances(embedded_tokenized(), masking, max_seq_length=128, seed=5)
    arrays = instances_to_arrays(instances, 128, 20)
    restored = _restore(arrays)
    word_start = tokenizer.word_start_table
    special = np.isin(restored, [tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id])
    starts = word_start[restored] | special | np.roll(special, 1, axis=1)
    word_ids = np.cumsum(starts, axis=1)
    word_counts = {"mask": 0, "random": 0, "keep": 0}
    for row in range(len(instances)):
        valid = arrays["masked_lm_weights"][row] > 0
        positions = arrays["masked_lm_positions"][row][valid]
        assert len(positions) <= 20
        selected_words = np.unique(word_ids[row][positions])
        word_positions = np.flatnonzero(np.isin(word_ids[row], selected_words))
        np.testing.assert_array_equal(positions, word_positions)  # whole words only
        for word in selected_words:
            at = np.flatnonzero(word_ids[row] == word)
            seen = arrays["input_ids"][row][at]
            if (seen == tokenizer.mask_id).all():
                word_counts["mask"] += 1
            elif (seen == restored[row][at]).all():
                word_counts["keep"] += 1
            else:
                assert not (seen == tokenizer.mask_id).any()  # one decision per word
                word_counts["random"] += 1
    total = sum(word_counts.values())
    assert total > 10_000
    assert abs(word_counts["mask"] / total - 0.8) < 0.015
    assert abs(word_counts["random"] / total - 0.1) < 0.015
    assert abs(word_counts["keep"] / total - 0.1) < 0.015


def test_wordpiece_random_replacements_avoid_special_and_unused_tokens():
    tokenizer = load_tokenizer(minilm_vocab_path())
    documents = instances_lib.tokenize_documents(sources.embedded_documents("eval"), tokenizer)
    masking = MaskingConfig.from_tokenizer(tokenizer, 0.15, 20)
    rng = np.random.default_rng(0)
    input_ids = np.asarray([tokenizer.cls_id, *documents[0][0], tokenizer.sep_id], dtype=np.int32)
    replacements = []
    for _ in range(3000):
        masked, positions, labels = mask_instance(input_ids, masking, rng)
        np.testing.assert_array_equal(input_ids[positions], labels)
        changed = masked[positions]
        replacements.extend(changed[(changed != tokenizer.mask_id) & (changed != labels)].tolist())
    assert len(replacements) > 500
    vocab = tokenizer.vocab
    assert not any(vocab[i].startswith("[") and vocab[i].endswith("]") for i in replacements)


def test_masking_with_known_candidates_draws_the_same():
    """Candidates given by the caller (the instance layout) or found by a scan: same masking."""
    from bert_jax.data.masking import mask_ids

    tokenizer = load_tokenizer(minilm_vocab_path())
    for whole_word_mask in (False, True):
        masking = MaskingConfig.from_tokenizer(tokenizer, 0.15, 20, whole_word_mask)
        documents = instances_lib.tokenize_documents(sources.embedded_documents("eval"), tokenizer)
        scanned, given, arrays = (np.random.default_rng(1) for _ in range(3))
        cls_id, sep_id = tokenizer.cls_id, tokenizer.sep_id
        for sentences in documents[:20]:
            a, b = sentences[0][:40], sentences[-1][:40]
            ids = [cls_id, *a, sep_id, *b, sep_id]
            candidates = [*range(1, len(a) + 1), *range(len(a) + 2, len(ids) - 1)]
            expected = mask_ids(ids, masking, scanned)
            assert mask_ids(ids, masking, given, candidates) == expected
            masked, positions, labels = mask_instance(np.asarray(ids), masking, arrays)
            assert masked.tolist() == expected[0] and positions.tolist() == expected[1]
            assert masked.dtype == positions.dtype == labels.dtype == np.int32
