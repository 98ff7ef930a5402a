"""A corpus's documents (lists of sentences), read from any source in order.

Public API:

- ``read_documents(sources, **options) -> (list[Document], CorpusStats)`` and the streaming
  ``iter_documents(sources, stats, **options)``: every source read through ``splits.py``'s
  ``read_split``, the one reader of documents (``data prepare`` reads the same splits in its
  workers), so that what is kept, skipped and counted (``CorpusStats``, ``corpus_stats.py``) is
  decided in one place. What a source is read as is ``kinds.py``'s one decision
  (``corpus_format``); the format readers are ``readers.py``'s. A source is
    * a path, directory or glob of text files in the original format (one sentence per line, a
      blank line between documents); ``.gz`` files are read transparently;
    * a ``.jsonl`` (or ``.jsonl.gz``) file with one JSON object per line holding a ``text`` field,
      split into sentences (by ``splitter``, one of ``sentences.SPLITTERS``);
    * a ``.parquet`` file, one row = one document: its ``text_field`` column, split into sentences
      (``parquet.py``: streamed a batch of rows at a time);
    * a Wikipedia XML dump (``.xml.bz2`` or ``.xml``), one article = one document, its running
      text split into sentences, paragraph by paragraph (``wikipedia_dump.py``: streamed a page
      at a time; redirects, disambiguation and non-article pages are counted in
      ``skipped_pages``);
    * ``tfds:NAME[/CONFIG][:SPLIT]`` (split defaults to "train"), read offline from
      ``tfds_data_dir`` (or TFDS's default data dir) — it must already be prepared;
    * ``embedded[:train|eval|all]`` (``embedded.embedded_documents``).
- ``TEXT_EXTRACTION_VERSION``: how this version turns prose into sentences (recorded).

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

import multiprocessing
import os
from collections import deque
from collections.abc import Iterator, Sequence

from bert_jax.data.sentences import DEFAULT_SPLITTER, splitter
from bert_jax.data.sources import splits
from bert_jax.data.sources.corpus_stats import CorpusStats
from bert_jax.data.sources.embedded import Document

# How this version turns prose into sentences (wikitext stripping and sentence splitting), recorded
# as ``text_extraction`` beside the splitter in prepared data: records made by another version
# hold other words, so a resume or a merge over them is refused (``manifest.check_resumable``).
# 1: every version before it (not recorded); 2: splitters only cut, never rewrite ("don't" had
# become "donot" with syntok), and wikitext is stripped without markup left or prose lost.
TEXT_EXTRACTION_VERSION = 2

# A source read in one process is one split (no probes); read by workers, it is cut into splits of
# about this many bytes (a multistream dump at its bz2 streams), each read by one worker.
WORKER_SPLIT_BYTES = 1 << 20
_WHOLE = 1 << 62


def iter_documents(
    sources: Sequence[str | os.PathLike] | str,
    stats: CorpusStats | None = None,
    *,
    num_workers: int = 1,
    **reader_options,
) -> Iterator[Document]:
    """Stream documents from ``sources`` in order, counting into ``stats`` (see module docstring).

    ``reader_options`` are ``splits.read_split``'s (``splits.reader_option_names()``):
    ``tfds_data_dir``, ``text_field``, ``max_line_bytes``, ``strict``, ``sentence_split`` (also
    split the lines of original-format text files, for files that hold a paragraph per line; by
    default each line is one sentence) and ``splitter_name`` (``sentences.SPLITTERS``: how prose
    is cut into sentences). With ``num_workers`` > 1 the sources are cut into splits of about
    ``WORKER_SPLIT_BYTES`` (``splits.cut_splits``) read in that many processes; the documents,
    their order and the counts are the same (a bad line in a split that starts inside a text or
    JSONL file is named by its byte offset, its line number unknown there).
    """
    stats = CorpusStats() if stats is None else stats
    # An unknown splitter fails here, before anything is read (or any process started).
    splitter(reader_options.get("splitter_name", DEFAULT_SPLITTER))
    target = WORKER_SPLIT_BYTES if num_workers > 1 else _WHOLE
    pieces = splits.cut_splits(sources, target_bytes=target, **reader_options)
    if num_workers <= 1:
        for piece in pieces:
            for _, document in splits.read_split(piece, stats, **reader_options):
                yield document
        return
    # spawn, not fork: the caller may hold TensorFlow or JAX threads. At most two splits per
    # worker in flight; their counts merged in split order, as one process counts them.
    with multiprocessing.get_context("spawn").Pool(num_workers) as pool:
        in_flight: deque = deque()
        for piece in pieces:
            in_flight.append(pool.apply_async(_read_whole_split, (piece, reader_options)))
            while len(in_flight) >= 2 * num_workers:
                yield from _merged(in_flight.popleft().get(), stats)
        while in_flight:
            yield from _merged(in_flight.popleft().get(), stats)


def _read_whole_split(piece: splits.Split, reader_options: dict):
    """(documents, counts) of one split, in a worker process."""
    stats = CorpusStats()
    documents = [document for _, document in splits.read_split(piece, stats, **reader_options)]
    return documents, stats


def _merged(result: tuple[list[Document], CorpusStats], stats: CorpusStats):
    documents, split_stats = result
    stats.merge(split_stats)
    yield from documents


def read_documents(
    sources: Sequence[str | os.PathLike] | str,
    **options,
) -> tuple[list[Document], CorpusStats]:
    """All documents from ``sources`` in memory, plus what was counted on the way.

    ``options`` are those of ``iter_documents``. For corpora larger than memory use
    ``iter_documents`` (the tokenizer's training does).
    """
    stats = CorpusStats()
    documents = list(iter_documents(sources, stats, **options))
    return documents, stats
