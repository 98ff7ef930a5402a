"""Special tokens written in text ("[MASK]", "[SEP]", ...) encode to the same ids in bert-jax's
tokenizers and in the Hugging Face tokenizer that `convert --to hf` exports, for both kinds; data
preparation (``allow_special=False``, ``encode_batch``) keeps them ordinary text, as the original
BERT's create_pretraining_data.py does."""

from __future__ import annotations

import pytest
import transformers

from bert_jax.convert.between_formats import convert
from bert_jax.convert.model_dir import save_model_dir
from bert_jax.data.sources import embedded as corpus
from bert_jax.data.tokenizers.load_or_train import load_tokenizer
from bert_jax.data.tokenizers.sentencepiece import train_sentencepiece
from tests.convert_fixtures import random_params
from tests.data_fixtures import minilm_vocab_path
from tests.helpers import REAL_SENTENCES, tiny_config

SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

# Every special token at the start, the end, inside a word, between words with no, one and
# several spaces, repeated, beside punctuation and next to look-alikes that are not special.
TEXTS = [
    *(f"{token} the cat sat on the mat." for token in SPECIAL),
    *(f"the cat sat on the {token}" for token in SPECIAL),
    *(f"the cat{token}sat on the mat." for token in SPECIAL),
    *(f"The  {token}   cat sat, {token}{token} on the mat" for token in SPECIAL),
    "[CLS] The capital of France is [MASK]. [SEP] It is [MASK] [SEP]",
    "two [MASK] [MASK] masks and a [mask], a [ MASK ] and [MASK",
    " [MASK] ",
    "[MASK]",
    "[MASK].[SEP],[CLS]!",
    "Café [MASK] naïve, 3,000 [UNK]s (x)[PAD]",
    "[[MASK]] and [[SEP]]",
    "",
    *REAL_SENTENCES[:3],
]


def _exported(tmp_path, tokenizer, name: str):
    """The tokenizer as `convert --to hf` exports it (beside a tiny model), read back by
    transformers' AutoTokenizer."""
    config = tiny_config(
        vocab_size=tokenizer.vocab_size,
        num_hidden_layers=1,
        hidden_size=8,
        num_attention_heads=1,
        intermediate_size=8,
    )
    params = random_params(config)
    save_model_dir(tmp_path / name, config, {"bert": params["bert"]}, tokenizer=tokenizer)
    convert("bert-jax", tmp_path / name, "hf", tmp_path / f"{name}-hf")
    return transformers.AutoTokenizer.from_pretrained(tmp_path / f"{name}-hf")


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    sentences = [s for d in corpus.embedded_documents("train")[:40] for s in d]
    path.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("lowercase", [True, False], ids=["uncased", "cased"])
def test_sentencepiece_special_tokens_encode_as_the_exported_tokenizer(
    tmp_path, small_corpus, lowercase
):
    ours = train_sentencepiece(
        [small_corpus], 300, tmp_path / "spm", lowercase=lowercase, num_threads=1
    )
    theirs = _exported(tmp_path, ours, "model")
    for text in TEXTS:
        expected = theirs(text, add_special_tokens=False)["input_ids"]
        assert ours.encode(text) == expected, (text, ours.tokenize(text))
        assert load_tokenizer(tmp_path / "model-hf").encode(text) == expected, text
    ids = ours.encode("the cat [MASK] sat [SEP]")
    assert ids.count(ours.mask_id) == 1 and ids[-1] == ours.sep_id
    assert ours.tokenize("x[MASK]")[-1] == "[MASK]"


@pytest.mark.parametrize("lowercase", [True, False], ids=["uncased", "cased"])
def test_wordpiece_special_tokens_encode_as_the_exported_tokenizer(tmp_path, lowercase):
    ours = load_tokenizer(minilm_vocab_path(), lowercase=lowercase)
    theirs = _exported(tmp_path, ours, "model")
    for text in TEXTS:
        assert ours.encode(text) == theirs(text, add_special_tokens=False)["input_ids"], text


def test_data_preparation_keeps_special_tokens_as_text(tmp_path, small_corpus):
    """create_pretraining_data.py's FullTokenizer has no special tokens: "[MASK]" in a corpus
    is "[", "mask", "]" there, and in prepared records here, whichever tokenizer."""
    wordpiece = load_tokenizer(minilm_vocab_path())
    sentencepiece = train_sentencepiece([small_corpus], 300, tmp_path / "spm", num_threads=1)
    for tokenizer in (wordpiece, sentencepiece):
        specials = set(tokenizer.special_ids.values()) - {tokenizer.unk_id}
        for text in TEXTS:
            plain = tokenizer.encode(text, allow_special=False)
            assert not set(plain) & specials, text
            assert tokenizer.encode_batch([text]) == [plain], text
    assert wordpiece.tokenize("a [MASK] b", allow_special=False) == ["a", "[", "mask", "]", "b"]
