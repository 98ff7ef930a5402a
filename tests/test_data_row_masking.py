"""Masking many rows at once draws exactly what ``mask_ids`` draws row by row.

``mask_ids`` (NumPy's Generator called per row) is the reference: same masked ids, positions and
labels, and the Generator left in the same state, on rows with special ids inside, rows where
every candidate is picked, a Generator holding a waiting 32-bit half, and a replacement table
large enough that NumPy redraws (rejection) several times.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from bert_jax.data.masking import static_rows as row_masking
from bert_jax.data.masking.static_sequence import mask_ids
from bert_jax.data.tokenizers.load_or_train import load_tokenizer
from tests.data_fixtures import masking_config, minilm_vocab_path


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(minilm_vocab_path())  # BERT's uncased WordPiece vocabulary


def _rows(rng: np.random.Generator, count: int, width: int, tokenizer) -> tuple:
    ids = rng.integers(5, tokenizer.vocab_size, size=(count, width)).astype(np.int32)
    lengths = rng.integers(min(3, width), width + 1, size=count)
    specials = rng.random((count, width)) < 0.05  # [CLS] / [SEP] / [PAD] inside the text too
    ids[specials] = rng.choice(
        [tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id], specials.sum()
    )
    ids[:, 0] = tokenizer.cls_id
    ids[np.arange(count), lengths - 1] = tokenizer.sep_id
    return ids, lengths


def _assert_same_as_mask_ids(ids, lengths, masking, seed: int, waiting_half: bool = False):
    batch_rng, row_rng = np.random.default_rng(seed), np.random.default_rng(seed)
    if waiting_half:  # one 32-bit draw leaves the other half of a 64-bit output waiting
        batch_rng.integers(0, 7, dtype=np.uint32)
        row_rng.integers(0, 7, dtype=np.uint32)
    masked, positions, labels, counts = row_masking.mask_rows(ids, lengths, masking, batch_rng)
    for row, length in enumerate(lengths.tolist()):
        want_ids, want_positions, want_labels = mask_ids(
            ids[row, :length].tolist(), masking, row_rng
        )
        count = len(want_positions)
        assert masked[row, :length].tolist() == want_ids, row
        assert positions[row].tolist() == want_positions + [0] * (len(positions[row]) - count)
        assert labels[row].tolist() == want_labels + [0] * (len(labels[row]) - count)
        assert counts[row] == count
    np.testing.assert_array_equal(masked[:, lengths.max() :], ids[:, lengths.max() :])
    assert batch_rng.bit_generator.state == row_rng.bit_generator.state
    assert batch_rng.random() == row_rng.random()


@pytest.mark.parametrize(
    ("width", "prob", "slots", "waiting_half"),
    [(128, 0.15, 20, False), (40, 0.5, 40, True), (6, 0.9, 6, False), (64, 0.01, 3, True)],
)
def test_rows_are_masked_as_mask_ids_masks_them_one_by_one(
    tokenizer, width, prob, slots, waiting_half
):
    ids, lengths = _rows(np.random.default_rng(width), 600, width, tokenizer)
    masking = masking_config(tokenizer, masked_lm_prob=prob, max_predictions_per_seq=slots)
    _assert_same_as_mask_ids(ids, lengths, masking, seed=width, waiting_half=waiting_half)


def test_redraws_and_other_paths_give_the_same_masking(tokenizer, monkeypatch):
    masking = masking_config(tokenizer, masked_lm_prob=0.15, max_predictions_per_seq=20)
    ids, lengths = _rows(np.random.default_rng(1), 1500, 128, tokenizer)
    # 6,700,417 replacement ids: NumPy redraws about 1 in 640 replacement draws
    # (2**32 mod 6,700,417 is 6,700,416), so a few rows here meet a redraw.
    many = dataclasses.replace(masking, ordinary_ids=np.arange(6_700_417, dtype=np.int32))
    one_by_one = []
    mask_one = row_masking._mask_one
    monkeypatch.setattr(
        row_masking,
        "_mask_one",
        lambda *args: one_by_one.append(args[2]) or mask_one(*args),
    )
    _assert_same_as_mask_ids(ids, lengths, many, seed=2)
    assert len(one_by_one) >= 2, one_by_one  # rows with a redraw went through mask_ids
    # A single replacement id: ``integers(0, 1)`` draws nothing.
    single = dataclasses.replace(masking, ordinary_ids=np.asarray([7], dtype=np.int32))
    _assert_same_as_mask_ids(ids[:300], lengths[:300], single, seed=3)
    # Whole-word masking, and any other bit generator, go row by row through mask_ids.
    one_by_one.clear()
    whole_words = masking_config(tokenizer, max_predictions_per_seq=20, whole_word_mask=True)
    _assert_same_as_mask_ids(ids[:50], lengths[:50], whole_words, seed=4)
    assert len(one_by_one) == 50
    mt_masked = row_masking.mask_rows(
        ids[:20], lengths[:20], masking, np.random.Generator(np.random.MT19937(5))
    )
    mt_rng = np.random.Generator(np.random.MT19937(5))
    for row in range(20):
        assert (
            mt_masked[0][row, : lengths[row]].tolist()
            == (mask_ids(ids[row, : lengths[row]].tolist(), masking, mt_rng)[0])
        )
