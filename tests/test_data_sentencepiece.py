"""SentencePiece: training with BERT's special pieces, round trips, batch encoding."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

from bert_jax.data.sources import embedded as corpus
from bert_jax.data.tokenizers.load_or_train import load_tokenizer
from bert_jax.data.tokenizers.sentencepiece import SentencePieceTokenizer, train_sentencepiece
from tests.data_fixtures import embedded_spm, embedded_spm_dir


def test_trained_sentencepiece_has_fixed_special_ids_and_round_trips(tmp_path):
    tokenizer = embedded_spm()
    assert isinstance(tokenizer, SentencePieceTokenizer)
    assert tokenizer.special_ids == {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
    assert tokenizer.vocab_size == 3000 and tokenizer.lowercase
    text = "The Statement is executed Unconditionally, [MASK] or not."
    ids = tokenizer.encode(text, allow_special=False)
    assert ids == tokenizer.encode(text.lower(), allow_special=False)  # case folded
    assert not set(ids) & {2, 3, 4}  # control pieces never come from data text
    assert tokenizer.decode(ids) == text.lower()
    pieces = tokenizer.convert_ids_to_tokens(ids)
    np.testing.assert_array_equal(tokenizer.word_start(ids), [p.startswith("▁") for p in pieces])
    assert not set(tokenizer.ordinary_ids.tolist()) & {0, 1, 2, 3, 4}
    # Allowed, a special token written in text is its id (tests/test_data_special_tokens.py).
    ids = tokenizer.encode(text)
    assert (
        ids.count(tokenizer.mask_id) == 1 and tokenizer.word_start(ids).sum() == 8
    )  # 7 words and [MASK]

    reloaded = load_tokenizer(embedded_spm_dir())
    assert reloaded.fingerprint() == tokenizer.fingerprint() and reloaded.lowercase
    assert (
        load_tokenizer(os.path.join(embedded_spm_dir(), "spiece.model"), lowercase=True).encode(
            text
        )
        == ids
    )
    assert pickle.loads(pickle.dumps(tokenizer)).encode(text) == ids
    tokenizer.save(tmp_path / "copy")
    assert sorted(os.listdir(tmp_path / "copy")) == ["bert_jax_tokenizer.json", "spiece.model"]
    assert load_tokenizer(tmp_path / "copy").encode(text) == ids


def test_sentencepiece_encode_batch_is_encode_per_sentence():
    tokenizer = embedded_spm()
    documents = corpus.embedded_documents("all")[:50]
    documents += [["two\nlines", "[SEP] stays text", "", "Ünïcödé — text"], []]
    for document in documents:
        expected = [tokenizer.encode(s, allow_special=False) for s in document]
        assert tokenizer.encode_batch(document) == expected


def test_train_sentencepiece_rejects_a_tiny_vocabulary(tmp_path):
    with pytest.raises(ValueError, match="--vocab-size 3"):
        train_sentencepiece([tmp_path / "x.txt"], 3, tmp_path / "out")
