"""The embedded corpus: real English prose, deterministic, with a stable held-out split."""

from __future__ import annotations

from bert_jax.data.sources.documents import read_documents
from bert_jax.data.sources.embedded import embedded_document_names, embedded_documents


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


def test_the_corpus_is_cached_on_disk_and_a_damaged_cache_is_rebuilt(tmp_path, monkeypatch):
    from bert_jax.data.sources import embedded

    corpus = (("pydoc:a", ("First sentence.", "Second one.")), ("stdlib:b.py", ("Third.",)))
    builds = []
    monkeypatch.setattr(embedded, "_build", lambda *args: builds.append(args) or corpus)
    monkeypatch.setenv("BERT_JAX_CACHE_DIR", str(tmp_path / "cache"))
    embedded._embedded_corpus.cache_clear()
    try:
        assert embedded._embedded_corpus() == corpus and len(builds) == 1  # built, written
        (cached,) = (tmp_path / "cache").glob("embedded-corpus-*.json")
        embedded._embedded_corpus.cache_clear()
        assert embedded._embedded_corpus() == corpus and len(builds) == 1  # read back
        cached.write_text('[["pydoc:a", ["First sentence."')
        embedded._embedded_corpus.cache_clear()
        assert embedded._embedded_corpus() == corpus and len(builds) == 2  # damaged: rebuilt
        assert embedded._read_cache(str(cached)) == corpus  # and rewritten whole
    finally:
        embedded._embedded_corpus.cache_clear()
