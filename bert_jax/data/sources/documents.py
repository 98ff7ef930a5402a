"""A corpus's documents (lists of sentences), read from any source in order.

Public API:

- ``read_documents(sources, **options) -> (list[Document], CorpusStats)`` and the streaming
  ``iter_documents(sources, stats, **options)``. What a source is read as is ``kinds.py``'s one
  decision (``corpus_format``); the readers are ``readers.py``'s, the worker pool that cuts prose
  into sentences ``prose_pool.py``'s, the counts ``corpus_stats.py``'s. A source is
- ``read_documents(sources, **options) -> (list[Document], CorpusStats)`` and the streaming
  ``iter_documents(sources, stats, **options)``. A source is
    * a path, directory or glob of text files in the original format (one sentence per line, a
      blank line between documents); ``.gz`` files are read transparently;
    * a ``.jsonl`` (or ``.jsonl.gz``) file with one JSON object per line holding a ``text`` field,
      split into sentences (by ``splitter``, one of ``sentences.SPLITTERS``);
    * a ``.parquet`` file, one row = one document: its ``text_field`` column, split into sentences
      (``parquet.py``: streamed a batch of rows at a time);
    * a Wikipedia XML dump (``.xml.bz2`` or ``.xml``), one article = one document, its running
      text split into sentences, paragraph by paragraph (``wikipedia.py``: streamed a page at a
      time, or, with workers, a multistream dump in chunks of whole bz2 streams that the workers
      read; redirects, disambiguation and non-article pages are counted in ``skipped_pages``);
    * ``tfds:NAME[/CONFIG][:SPLIT]`` (split defaults to "train"), read offline from
      ``tfds_data_dir`` (or TFDS's default data dir) — it must already be prepared;
    * ``embedded[:train|eval|all]`` (``embedded.embedded_documents``).
- ``TEXT_EXTRACTION_VERSION``: how this version turns prose into sentences (recorded).
- The same inputs cut into splits that workers read apart, each byte once, with the same
  documents and counts: ``splits.py`` (it reads through the same readers).

Bad input is handled and counted in ``CorpusStats`` rather than crashing hours into a run:
bytes that are not UTF-8 are dropped from their line (``invalid_utf8_lines``), empty files are
skipped (``empty_files``), documents without sentences are skipped (``empty_documents``),
one-sentence documents are kept (``one_sentence_documents``; they still make instances, with a
forced random next), lines longer than ``max_line_bytes`` are dropped without ever being held in
memory whole (``long_lines``), and JSONL lines that are not objects with a string text field are
skipped (``bad_records``, as are Parquet rows whose text is null). ``strict=True`` turns each of
these (except empty and one-sentence documents) into a ``UserError`` naming the file and line. A
missing file, a glob that matches nothing, an unknown TFDS dataset, and a damaged bz2 or Parquet
file are always a ``UserError`` naming it (``bert-jax`` prints one line and exits 2).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence

from bert_jax.data.sentences import DEFAULT_SPLITTER, splitter
from bert_jax.data.sources.corpus_stats import CorpusStats
from bert_jax.data.sources.embedded import Document, embedded_documents
from bert_jax.data.sources.kinds import corpus_format, expand_sources
from bert_jax.data.sources.prose_pool import _PROSE, _DocumentMaker, _dump_documents
from bert_jax.data.sources.readers import (
    DEFAULT_MAX_LINE_BYTES,
    DEFAULT_TEXT_FIELD,
    _iter_jsonl_file,
    _iter_parquet_file,
    _iter_text_file,
    _iter_tfds,
)

# How this version turns prose into sentences (wikitext stripping and sentence splitting), recorded
# as ``text_extraction`` beside the splitter in prepared data: records made by another version
# hold other words, so a resume or a merge over them is refused (``manifest.check_resumable``).
# 1: every version before it (not recorded); 2: splitters only cut, never rewrite ("don't" had
# become "donot" with syntok), and wikitext is stripped without markup left or prose lost.
TEXT_EXTRACTION_VERSION = 2


def iter_documents(
    sources: Sequence[str | os.PathLike] | str,
    stats: CorpusStats | None = None,
    *,
    tfds_data_dir: str | None = None,
    text_field: str = DEFAULT_TEXT_FIELD,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    strict: bool = False,
    sentence_split: bool = False,
    splitter_name: str = DEFAULT_SPLITTER,
    num_workers: int = 1,
) -> Iterator[Document]:
    """Stream documents from ``sources`` in order, counting into ``stats`` (see module docstring).

    Prose (JSONL, Parquet, TFDS, Wikipedia) is cut into sentences by the splitter
    ``splitter_name`` (``sentences.SPLITTERS``). ``sentence_split=True`` also splits the lines of
    original-format text files (for files that hold a paragraph per line); by default each line
    is one sentence, as in the original format. With ``num_workers`` > 1 the prose of JSONL,
    Parquet and Wikipedia files is split (and wikitext stripped) in that many processes, while
    this one reads; the documents and their order are the same.
    """
    stats = CorpusStats() if stats is None else stats
    split = splitter(splitter_name)  # an unknown name fails here, before anything is read
    maker = _DocumentMaker(splitter_name, num_workers)
    try:
        for source in expand_sources(sources):
            for document in _source_documents(
                source,
                stats,
                maker,
                split,
                tfds_data_dir,
                text_field,
                max_line_bytes,
                strict,
                sentence_split,
            ):
                if document is None:
                    stats.skipped_pages += 1  # a disambiguation page
                elif not document:
                    stats.empty_documents += 1
                else:
                    stats.add_document(document)
                    yield document
    finally:
        maker.close()


def _source_documents(
    source: str,
    stats: CorpusStats,
    maker: _DocumentMaker,
    split: Callable[[str], list[str]],
    tfds_data_dir: str | None,
    text_field: str,
    max_line_bytes: int,
    strict: bool,
    sentence_split: bool,
) -> Iterator[Document | None]:
    """The documents of one source (``[]``: an empty one; ``None``: a page that is no article)."""
    kind = corpus_format(source)
    if kind == "tfds":
        return _iter_tfds(source, stats, tfds_data_dir, text_field, strict, split)
    stats.files += 1
    if kind == "embedded":
        _, _, embedded_split = source.partition(":")
        return iter(embedded_documents(embedded_split or "train"))
    if kind == "jsonl":
        prose = _iter_jsonl_file(source, stats, max_line_bytes, strict, text_field)
        return maker.documents(_PROSE, prose)
    if kind == "parquet":
        return maker.documents(_PROSE, _iter_parquet_file(source, stats, strict, text_field))
    if kind == "wikipedia":
        return _dump_documents(source, stats, maker)
    return _iter_text_file(source, stats, max_line_bytes, strict, split if sentence_split else None)


def read_documents(
    sources: Sequence[str | os.PathLike] | str,
    **options,
) -> tuple[list[Document], CorpusStats]:
    """All documents from ``sources`` in memory, plus what was counted on the way.

    ``options`` are those of ``iter_documents``. For corpora larger than memory use
    ``iter_documents`` (``prepare_records`` does).
    """
    stats = CorpusStats()
    documents = list(iter_documents(sources, stats, **options))
    return documents, stats
