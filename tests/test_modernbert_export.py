"""A ModernBERT model directory exported with `bert-jax convert --to hf`, loaded the way a
transformers user loads it: `AutoTokenizer.from_pretrained(dir)` gives bert-jax's ids ([CLS] text
[SEP], and pairs) on real sentences and on every word of them, and `pipeline("fill-mask",
model=dir)` gives bert-jax's fill-mask answers (ids and probabilities). Tokenizers: SentencePiece
trained here with `bert-jax tokenizer train` (unigram uncased, BPE cased) and the real
all-MiniLM-L6-v2 WordPiece vocabulary. The BERT family's exports are held to the same pipeline in
tests/test_fill_mask.py and to the same special tokens in tests/test_data_special_tokens.py."""

from __future__ import annotations

import numpy as np
import pytest
import transformers

from bert_jax import cli
from bert_jax.convert.model_dir import save_model_dir
from bert_jax.core.modernbert_config import ModernBertConfig
from bert_jax.data.sources import embedded as corpus
from bert_jax.data.tokenizers.load_or_train import load_tokenizer
from bert_jax.inference.fill_mask import fill_mask
from tests.helpers import REAL_SENTENCES, minilm_dir
from tests.modernbert_fixtures import TINY, hf_masked_lm, params_from_hf

TOKENIZERS = {
    "unigram-uncased": ["--lowercase"],
    "bpe-cased": ["--model-type", "bpe"],
    "wordpiece": None,  # all-MiniLM-L6-v2's vocab.txt
}
# Sentences the SentencePiece models were not trained on (the corpus's eval split), with
# accents, digits, quotes, runs of spaces and special tokens written in the text.
SENTENCES = [
    *REAL_SENTENCES,
    *[s for d in corpus.embedded_documents("eval")[:3] for s in d][:12],
    "Café  naïve ``quoted'' 3,000 km, (x) — über [MASK].",
    "the [MASK] sat on [SEP] the mat [UNK]",
]
FILL = [
    "The capital of France is [MASK].",
    "[MASK] people went to the market to buy [MASK] and bread.",
    "the  [MASK]   of the story",
]


@pytest.fixture(scope="module", params=list(TOKENIZERS))
def exported(request, tmp_path_factory):
    """(bert-jax model directory, its export, its tokenizer): the tokenizer trained with the
    CLI (or MiniLM's), a random ModernBERT model with it, exported with the CLI."""
    root = tmp_path_factory.mktemp(request.param)
    if TOKENIZERS[request.param] is None:
        tokenizer_dir = minilm_dir()
    else:
        text = root / "corpus.txt"
        sentences = [s for d in corpus.embedded_documents("train")[:60] for s in d]
        text.write_text("\n".join(sentences) + "\n", encoding="utf-8")
        tokenizer_dir = root / "tokenizer"
        train = ["tokenizer", "train", "--input", str(text), "--vocab-size", "400"]
        assert cli.main([*train, "--output", str(tokenizer_dir), *TOKENIZERS[request.param]]) == 0
    tokenizer = load_tokenizer(tokenizer_dir)
    special = dict(pad_token_id=tokenizer.pad_id, cls_token_id=tokenizer.cls_id)
    special |= dict(sep_token_id=tokenizer.sep_id, bos_token_id=tokenizer.cls_id)
    special |= dict(eos_token_id=tokenizer.sep_id, vocab_size=tokenizer.vocab_size)
    config = ModernBertConfig(**{**TINY, **special})
    params = params_from_hf(hf_masked_lm(config, seed=len(request.param)), config)
    save_model_dir(root / "model", config, params, tokenizer=tokenizer)
    argv = ["convert", "--from", "bert-jax", str(root / "model"), "--to", "hf", str(root / "hf")]
    assert cli.main(argv) == 0
    return root / "model", root / "hf", tokenizer


def test_auto_tokenizer_gives_bert_jax_ids(exported):
    _, hf_dir, ours = exported
    theirs = transformers.AutoTokenizer.from_pretrained(hf_dir)
    words = sorted({word for sentence in SENTENCES for word in sentence.split()})
    assert len(words) > 150
    for text in [*SENTENCES, *words]:
        assert theirs(text)["input_ids"] == [ours.cls_id, *ours.encode(text), ours.sep_id], text
    first, second = SENTENCES[0], SENTENCES[-3]
    pair = theirs(first, second)
    assert pair["input_ids"] == [
        *[ours.cls_id, *ours.encode(first), ours.sep_id],
        *[*ours.encode(second), ours.sep_id],
    ]
    assert "token_type_ids" not in pair  # ModernBERT's forward takes none


def test_fill_mask_pipeline_gives_bert_jax_answers(exported):
    model, hf_dir, _ = exported
    pipe = transformers.pipeline("fill-mask", model=str(hf_dir), top_k=5, device="cpu")
    for text, filled in zip(FILL, fill_mask(str(model), FILL, top_k=5), strict=True):
        expected = pipe(text)
        expected = expected if isinstance(expected[0], list) else [expected]
        assert len(filled.masks) == len(expected) > 0
        for mask, candidates in zip(filled.masks, expected):
            assert [c.token_id for c in mask.candidates] == [c["token"] for c in candidates]
            np.testing.assert_allclose(
                [c.score for c in mask.candidates], [c["score"] for c in candidates], atol=1e-5
            )
