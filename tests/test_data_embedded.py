"""The embedded corpus: real English prose, deterministic, with a stable held-out split."""

from __future__ import annotations

from bert_jax.data.embedded import embedded_document_names, embedded_documents
from bert_jax.data.sources import read_documents


def test_embedded_corpus_is_real_deterministic_and_split():
    train = embedded_documents("train")
    held_out = embedded_documents("eval")
    everything = embedded_documents("all")
    assert train == embedded_documents("train")
    assert len(train) + len(held_out) == len(everything)
    assert len(train) > 300 and 0.02 < len(held_out) / len(everything) < 0.1
    train_names = set(embedded_document_names("train"))
    eval_names = set(embedded_document_names("eval"))
    assert not train_names & eval_names
    assert any(name.startswith("pydoc:") for name in train_names | eval_names)
    sentences = [s for d in everything for s in d]
    assert len(sentences) > 10_000
    assert sum(len(s.split()) for s in sentences) > 200_000  # words of running English prose
    assert all(isinstance(s, str) and s == s.strip() and s for s in sentences)
    assert not any(s.startswith(">>>") for s in sentences)
    # Multi-sentence documents dominate: sentence pairs need them.
    assert sum(len(d) >= 2 for d in everything) > 0.7 * len(everything)
    documents, stats = read_documents(["embedded:eval"])
    assert documents == held_out and stats.documents == len(held_out)
