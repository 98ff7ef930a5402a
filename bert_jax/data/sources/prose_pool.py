"""Prose cut into documents of sentences (wikitext stripped first, a multistream dump's chunk
read first) in this process or in worker processes, always in input order: the documents do
not depend on the number of workers (``_DocumentMaker``)."""

from __future__ import annotations

import itertools
import multiprocessing
from collections import deque
from collections.abc import Iterator

from bert_jax.data.sentences import splitter
from bert_jax.data.sources import wikipedia_dump as wikipedia
from bert_jax.data.sources.corpus_stats import CorpusStats
from bert_jax.data.sources.embedded import Document
from bert_jax.data.sources.readers import _iter_wikipedia_dump

# What a reader hands on: prose, a Wikipedia page's (title, wikitext) (None: no article), or a
# chunk of a multistream dump's bz2 streams (path, the dump's XML header, compressed bytes).
_PROSE, _WIKITEXT, _DUMP_CHUNK = "prose", "wikitext", "dump chunk"
_CHUNK = 32  # pieces of prose per task sent to a worker (dump chunks: one)


def _make_document(kind: str, splitter_name: str, item) -> Document | None:
    """Prose (or a page's wikitext) -> its sentences; None: a page that is no article."""
    if kind == _WIKITEXT:
        item = None if item is None else wikipedia.article_text(*item)
        if item is None:
            return None
    return splitter(splitter_name)(item)


def _make_documents(kind: str, splitter_name: str, items: list) -> list[Document | None]:
    if kind == _DUMP_CHUNK:
        kind, items = _WIKITEXT, [p for item in items for p in wikipedia.chunk_candidates(*item)]
    return [_make_document(kind, splitter_name, item) for item in items]


class _DocumentMaker:
    """Cuts prose into documents (strips wikitext first; reads a dump chunk first) in this
    process or, with ``num_workers`` > 1, in that many processes; either way in input order, so
    the output does not depend on the number of workers. At most two tasks per worker are in
    flight."""

    def __init__(self, splitter_name: str, num_workers: int):
        self.splitter_name, self.num_workers = splitter_name, num_workers
        self.pool = None

    def documents(self, kind: str, items: Iterator) -> Iterator[Document | None]:
        if self.num_workers <= 1:
            for item in items:
                yield from _make_documents(kind, self.splitter_name, [item])
            return
        if self.pool is None:
            # spawn, not fork: the caller may hold TensorFlow or JAX threads.
            context = multiprocessing.get_context("spawn")
            self.pool = context.Pool(self.num_workers)
        in_flight: deque = deque()
        per_task = 1 if kind == _DUMP_CHUNK else _CHUNK
        for chunk in iter(lambda: list(itertools.islice(items, per_task)), []):
            task = (kind, self.splitter_name, chunk)
            in_flight.append(self.pool.apply_async(_make_documents, task))
            while len(in_flight) >= 2 * self.num_workers:
                yield from in_flight.popleft().get()
        while in_flight:
            yield from in_flight.popleft().get()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()
            self.pool = None


def _dump_documents(source: str, stats: CorpusStats, maker: _DocumentMaker) -> Iterator:
    """A dump's documents. With workers, a multistream dump is read in chunks of whole streams,
    each decompressed, parsed and stripped by a worker; any other dump is read here (bz2 and
    XML) and its wikitext stripped by the workers."""
    header = wikipedia.multistream_header(source) if maker.num_workers > 1 else None
    if header is None:
        yield from maker.documents(_WIKITEXT, _iter_wikipedia_dump(source, stats))
        return
    chunks = ((source, header, chunk) for chunk in wikipedia.iter_chunks(source))
    empty = True
    for document in maker.documents(_DUMP_CHUNK, chunks):
        empty = False
        yield document
    if empty:
        stats.note("empty_files", source)
