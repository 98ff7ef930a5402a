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
