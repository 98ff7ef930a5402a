"""WordPiece: parity with Hugging Face's slow BertTokenizer, tokenizer.json, batch encoding."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from bert_jax.data.sources import embedded as corpus
from bert_jax.data.tokenizers.hf_bpe import HfBpeTokenizer
from bert_jax.data.tokenizers.load_or_train import load_tokenizer
from bert_jax.data.tokenizers.wordpiece import WordPieceTokenizer
from bert_jax.runtime.errors import UserError
from tests.data_fixtures import minilm_vocab_path

# Text that exercises every branch of BERT's basic tokenizer: accents (composed and combining),
# CJK ideographs, control and zero-width characters, unusual whitespace, a word over 100
# characters, special tokens inside text, full-width forms, emoji and punctuation classes.
HARD_TEXTS = [
    "Héllo Wörld! Ça va? naïve café, résumé and Ångström.",
    "e\u0301cole vs \u00e9cole: combining accents normalise the same way.",
    "北京欢迎你 and 東京タワー are CJK; 한국어 is Hangul, not split per character.",
    "tab\there\x00nul\x07bell \u200b zero-width \u2028 line-sep \x85 next-line end",
    "x" * 101 + " is too long for one word, but " + "y" * 100 + " is not.",
    "[CLS] special[SEP]tokens [mask] lower-case [MASK] stay whole [UNK][PAD]",
    "a [SE\x00P] b and é [MA\x07SK] ü: a control character inside a special token",
    "Ǆ ﬁ ﬀ ＡＢＣ ｈｅｌｌｏ ﾊﾝｶｸ: compatibility forms are not NFKC-folded.",
    "¿Qué? «quotes» — dashes … ellipsis ‘single’ “double” • bullet",
    "Grüße aus München, Straße; Μεγάλη Ελλάδα; Москва — ПРИВЕТ.",
    "\u00a0non-breaking\u3000ideographic space\ufeffBOM \ufffdreplacement",
    "emoji 🙂👍🏽 and math ∑ℝ≠ and currency €£¥$ and ~^`|\\ symbols",
    "It's the U.S.A.'s 3.14159 best-in-class e-mail: a@b.co (really!)",
    "ΟΔΟΣ ΟΔΟΣ. σΣ: a capital sigma ending a word lower-cases to a final sigma",
    "x[SE\x00P]y [MA\x00SK] ascii controls around special tokens",
    "",
    "   ",
]


@pytest.fixture(scope="module")
def real_sentences() -> list[str]:
    sentences = [s for d in corpus.embedded_documents("all") for s in d]
    return sentences[::40] + HARD_TEXTS


@pytest.mark.parametrize("lowercase", [True, False], ids=["uncased", "cased"])
def test_wordpiece_matches_hugging_face_slow_tokenizer(real_sentences, lowercase):
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

    vocab = minilm_vocab_path()
    ours = load_tokenizer(vocab, lowercase=lowercase)
    reference = BertTokenizerLegacy(vocab, do_lower_case=lowercase)
    assert len(real_sentences) > 300
    mismatches = [
        (text, ours.tokenize(text), reference.tokenize(text))
        for text in real_sentences
        if ours.tokenize(text) != reference.tokenize(text)
    ]
    assert not mismatches, mismatches[:3]
    for text in real_sentences:
        assert ours.encode(text) == reference.encode(text, add_special_tokens=False), text
    ids = ours.encode(HARD_TEXTS[0])
    assert ours.decode(ids) == reference.decode(ids)
    assert ours.convert_ids_to_tokens(ids) == reference.convert_ids_to_tokens(ids)


@pytest.mark.parametrize("lowercase", [True, False], ids=["uncased", "cased"])
def test_encode_batch_is_encode_without_special_tokens_on_every_document(lowercase):
    tokenizer = load_tokenizer(minilm_vocab_path(), lowercase=lowercase)
    documents = corpus.embedded_documents("all")
    documents += [HARD_TEXTS, ["two\nlines", "[SEP] stays text", ""], ["plain ascii [CLS]"], []]
    for document in documents:
        expected = [tokenizer.encode(s, allow_special=False) for s in document]
        assert tokenizer.encode_batch(document) == expected, document
    (ids,) = tokenizer.encode_batch(["a [SEP] b"])
    assert len(ids) == 5 and tokenizer.sep_id not in ids  # "[", "sep" (or [UNK] if cased), "]"


@pytest.mark.parametrize("lowercase", [True, False], ids=["uncased", "cased"])
def test_hugging_face_tokenizer_json_loads_as_its_vocab_txt(tmp_path, real_sentences, lowercase):
    """transformers 5 saves BertTokenizer as tokenizer.json alone; it reads as the vocab.txt."""
    import transformers

    path = minilm_vocab_path()
    lines = open(path, encoding="utf-8").read().splitlines()
    vocab = {token: index for index, token in enumerate(lines)}
    saved = tmp_path / "hf"
    transformers.BertTokenizerFast(vocab=vocab, do_lower_case=lowercase).save_pretrained(saved)
    assert "vocab.txt" not in os.listdir(saved)
    reference = load_tokenizer(path, lowercase=lowercase)
    for tokenizer in (load_tokenizer(saved), load_tokenizer(saved / "tokenizer.json")):
        assert isinstance(tokenizer, WordPieceTokenizer) and tokenizer.lowercase is lowercase
        assert tokenizer.fingerprint() == reference.fingerprint()
        assert [tokenizer.encode(t) for t in real_sentences] == [
            reference.encode(t) for t in real_sentences
        ]
    assert load_tokenizer(saved, lowercase=not lowercase).lowercase is not lowercase

    spec = json.loads((saved / "tokenizer.json").read_text(encoding="utf-8"))
    spec["normalizer"]["strip_accents"] = not lowercase
    (saved / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    with pytest.raises(ValueError, match="strips accents exactly when it lower-cases"):
        load_tokenizer(saved)
    spec["model"] = {"type": "BPE", "vocab": {}, "merges": []}
    (saved / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    with pytest.raises(ValueError, match="a 'BPE' tokenizer model; only BERT's WordPiece"):
        WordPieceTokenizer.from_hf_json(str(saved / "tokenizer.json"))
    # A BPE tokenizer.json with BERT's special tokens is ModernBERT's kind, read as such.
    assert isinstance(load_tokenizer(saved / "tokenizer.json"), HfBpeTokenizer)
    os.remove(saved / "tokenizer.json")
    with pytest.raises(UserError, match="vocab.txt or tokenizer.json"):
        load_tokenizer(saved)


def test_cased_wordpiece_composes_accents_like_the_reference(tmp_path):
    """A cased vocabulary sees "e" + U+0301 as "é" (NFC), as the reference does; Hugging Face's
    Rust pipeline does not (one reason the hand-written tokenizer stays, see wordpiece.py)."""
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\ncaf\n##é\n##e\n##\u0301\n")
    ours = load_tokenizer(vocab, lowercase=False)
    reference = BertTokenizerLegacy(str(vocab), do_lower_case=False)
    for text in ("cafe\u0301", "caf\u00e9", "CAFE\u0301"):
        assert ours.tokenize(text) == reference.tokenize(text), text
    assert ours.tokenize("cafe\u0301") == ["caf", "##é"]


def test_wordpiece_lowercase_is_inferred_and_read_from_hugging_face_config(tmp_path):
    vocab = minilm_vocab_path()
    assert load_tokenizer(vocab).lowercase is True  # uncased vocabulary, even with "ℝ" in it
    cased_vocab = tmp_path / "cased" / "vocab.txt"
    cased_vocab.parent.mkdir()
    lines = open(vocab, encoding="utf-8").read().splitlines()
    cased_vocab.write_text("\n".join(lines + ["Paris", "##The"]) + "\n", encoding="utf-8")
    cased = load_tokenizer(cased_vocab)
    assert cased.lowercase is False and cased.vocab_size == len(lines) + 2
    assert cased.tokenize("Paris") == ["Paris"]
    (tmp_path / "cased" / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    assert load_tokenizer(tmp_path / "cased").lowercase is True


def test_wordpiece_word_starts_special_ids_and_ordinary_ids():
    tokenizer = load_tokenizer(minilm_vocab_path())
    assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.cls_id) == (0, 100, 101)
    assert (tokenizer.sep_id, tokenizer.mask_id, tokenizer.vocab_size) == (102, 103, 30522)
    tokens = tokenizer.tokenize("unaffable tokenization")
    assert any(t.startswith("##") for t in tokens)
    starts = tokenizer.word_start(tokenizer.convert_tokens_to_ids(tokens))
    np.testing.assert_array_equal(starts, [not t.startswith("##") for t in tokens])
    ordinary = set(tokenizer.ordinary_ids.tolist())
    vocab = tokenizer.vocab
    assert not ordinary & {0, 100, 101, 102, 103}
    assert not any(vocab[i].startswith("[unused") for i in ordinary)
    assert vocab.index("the") in ordinary and vocab.index("##ing") in ordinary
    assert len(ordinary) == 30522 - 5 - 994  # 994 [unusedN] entries


def test_special_tokens_in_text_can_be_switched_off_for_pretraining():
    tokenizer = load_tokenizer(minilm_vocab_path())
    assert tokenizer.tokenize("a [SEP] b") == ["a", "[SEP]", "b"]
    assert tokenizer.tokenize("a [SEP] b", allow_special=False) == ["a", "[", "sep", "]", "b"]


def test_wordpiece_save_and_load_round_trip(tmp_path):
    tokenizer = load_tokenizer(minilm_vocab_path())
    tokenizer.save(tmp_path / "model_dir")
    reloaded = load_tokenizer(tmp_path / "model_dir")
    assert isinstance(reloaded, WordPieceTokenizer)
    assert reloaded.fingerprint() == tokenizer.fingerprint() and reloaded.lowercase
    text = HARD_TEXTS[2]
    assert reloaded.encode(text) == tokenizer.encode(text)
