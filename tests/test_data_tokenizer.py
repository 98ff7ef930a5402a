"""Tokenizers behind one interface: load errors, the vocabulary check, pair encoding, training."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from bert_jax import cli
from bert_jax.data.sources import embedded as corpus
from bert_jax.data.tokenizers.load_or_train import load_tokenizer
from bert_jax.data.tokenizers.pair_encoding import encode_pair, encode_pairs
from tests.data_fixtures import minilm_vocab_path


def test_missing_special_tokens_are_clear_errors(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"lacks the special token\(s\) \[MASK\]"):
        load_tokenizer(vocab)
    # A SentencePiece model trained without BERT's pieces.
    import sentencepiece as spm

    text = tmp_path / "text.txt"
    text.write_text("\n".join(corpus.embedded_documents("eval")[0]) * 5, encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(tmp_path / "plain"), vocab_size=60, minloglevel=2
    )
    with pytest.raises(ValueError, match=r"\[PAD\].*\[CLS\], \[SEP\], \[MASK\]"):
        load_tokenizer(tmp_path / "plain.model")


def test_vocabulary_larger_than_the_model_is_refused():
    tokenizer = load_tokenizer(minilm_vocab_path())
    tokenizer.check_vocab_size(30522)
    tokenizer.check_vocab_size(30592)
    with pytest.raises(ValueError, match="30522 entries but the model's vocab_size is 30000"):
        tokenizer.check_vocab_size(30000)


def test_encode_pair_matches_hugging_face_truncation_and_padding():
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

    vocab = minilm_vocab_path()
    ours = load_tokenizer(vocab)
    reference = BertTokenizerLegacy(vocab, do_lower_case=True)
    cases = [(10, 10), (30, 5), (5, 30), (20, 21), (7, 8), (8, 7), (1, 40), (3, None), (40, None)]
    for length_a, length_b in cases:
        text_a = " ".join(["word"] * length_a)
        text_b = None if length_b is None else " ".join(["thing"] * length_b)
        encoded = encode_pair(ours, text_a, text_b, max_seq_length=16)
        expected = reference(
            text_a,
            text_b,
            truncation="longest_first",
            max_length=16,
            padding="max_length",
            return_token_type_ids=True,
        )
        np.testing.assert_array_equal(encoded["input_ids"], expected["input_ids"])
        np.testing.assert_array_equal(encoded["input_mask"], expected["attention_mask"])
        np.testing.assert_array_equal(encoded["segment_ids"], expected["token_type_ids"])
        assert all(v.dtype == np.int32 and v.shape == (16,) for v in encoded.values())
    batch = encode_pairs(ours, ["a b", "c"], ["d", "e f g"], max_seq_length=8)
    assert batch["input_ids"].shape == (2, 8) and batch["segment_ids"][1].tolist() == [
        0,
        0,
        0,
        1,
        1,
        1,
        1,
        0,
    ]


def test_cli_tokenizer_train_writes_a_loadable_directory(tmp_path, capsys):
    text = tmp_path / "sentences.txt"
    documents = corpus.embedded_documents("eval")
    text.write_text("\n\n".join("\n".join(d) for d in documents), encoding="utf-8")
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text(json.dumps({"text": " ".join(documents[0])}) + "\n", encoding="utf-8")
    output = tmp_path / "tok"
    args = ["tokenizer", "train", "--input", str(text), str(jsonl), "--vocab-size", "300"]
    assert cli.main([*args, "--output", str(output), "--lowercase"]) == 0
    tokenizer = load_tokenizer(output)
    assert tokenizer.vocab_size == 300 and tokenizer.lowercase
    assert tokenizer.special_ids["[MASK]"] == 4
    assert not any(name.startswith(".") for name in os.listdir(output))  # temp files cleaned

    assert (
        cli.main(
            ["tokenizer", "train", "--input", str(tmp_path / "nope.txt")]
            + args[4:]
            + ["--output", str(output)]
        )
        == 2
    )
    assert "nope.txt" in capsys.readouterr().err
