"""Inputs cut into splits that a runner can read apart: every input byte read once, by one split.

The one reader of documents: ``preparation/local_runner.py``'s pool, the Beam pipeline and
``documents.iter_documents`` (a source read whole is one split) all read through ``read_split``.

Public API:

- ``Split(source_index, source, kind, start, stop)``: one piece of one input. ``source_index`` is
  the source's position in ``kinds.expand_sources(sources)``, ``source`` that expanded source,
  ``kind`` one of ``KINDS``. ``start``/``stop``: for ``text``, ``jsonl`` and a multistream
  ``wikipedia`` dump the bytes ``[start, stop)`` of the file; for ``parquet`` the row groups
  ``[start, stop)``; a source read whole (``.gz`` files, ``.xml`` and single-stream ``.bz2``
  dumps, ``embedded``, ``tfds``) is one split ``(0, -1)``. The splits of one source are
  contiguous and cover it exactly (split k's ``stop`` is split k+1's ``start``). Splits sort in
  input order.
- ``cut_splits(sources, *, target_bytes=64 MiB, byte_count=None, **reader_options) ->
  list[Split]``: deterministic, it depends only on the inputs and ``target_bytes`` (never on how
  many workers read them). Cheap: it lists files and reads only small windows: a Parquet
  file's footer; a multistream dump's first streams (``wikipedia.multistream_header``, which
  tells it from a dump that must be read whole) and, near each cut, the bytes up to the next bz2
  stream start; in text, up to the next document start (a line after a blank line) and in JSONL
  up to the end of the next whole line (not over-long). The cut near ``k * target_bytes`` is
  the first such boundary at or after it; none within ``PROBE_LIMIT`` bytes of it (a document
  longer than that) means no cut there. Parquet files are cut after the row group that brings
  a split to ``target_bytes`` on disk.
- ``read_split(split, stats, *, byte_count=None, **reader_options) -> Iterator[(DocKey,
  Document)]``: the documents of exactly this split, in file order, with their keys. The
  documents, their sentences and the ``CorpusStats`` counts (summed over a source's splits with
  ``CorpusStats.merge``, in split order) are the same however the source was cut, into one
  split or many. Only real documents are yielded: empty documents and pages that are no
  articles are counted in ``stats`` (``_counted``: the one place that decides what is kept).
  ``reader_options`` (``reader_option_names()``): ``text_field``, ``max_line_bytes``,
  ``strict``, ``sentence_split``, ``splitter_name``, ``tfds_data_dir``. It reads only the
  split's bytes (or row groups) through ``bert_jax.runtime.fs``, so ``gs://`` works, and runs
  no processes: the caller runs splits in parallel.
- ``DocKey``: a tuple of ints, unique in the corpus, sortable into input order and the same
  however the source was cut: text and JSONL ``(source_index, byte offset of the document's
  first line)``; Parquet ``(source_index, row group, row in it)``; a multistream dump
  ``(source_index, byte offset of the bz2 stream, page number in the stream)``; a source read
  whole ``(source_index, ordinal of the document as read)``.
- ``split_bytes(split) -> int``: the bytes on storage the split covers (a Parquet split: its row
  groups' column chunks; 0 for ``embedded`` and ``tfds``), for progress and benchmarks.
- ``ByteCount``: what was read from storage, for tests and benchmarks: ``content`` (the split's
  own bytes: over all splits of a text, JSONL or multistream input, exactly its size; of a
  Parquet input, every chunk of the text column once) and ``extra`` (anything else: cutting's
  probes, a Parquet split's footer, a later dump split's first stream, which holds the header).

Bad input is what ``documents.py`` says, in one line: a split that starts inside a text or
JSONL file does not know its line numbers, so it names the line by its byte offset (``FILE: line
at byte N``); the first split of a file (a file read whole) names it ``FILE:LINE``.

Why this file is long: each kind's cut and its read of one split must agree on where a
document starts; keeping both halves of every kind side by side is what keeps them agreeing.
"""

from __future__ import annotations

import functools
import gzip
import inspect
import io
import os
import re
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from bert_jax.data.sentences import DEFAULT_SPLITTER, splitter
from bert_jax.data.sources import kinds, parquet, readers, text_check
from bert_jax.data.sources import wikipedia_dump as wikipedia
from bert_jax.data.sources.corpus_stats import CorpusStats
from bert_jax.data.sources.embedded import Document, embedded_documents
from bert_jax.runtime import fs
from bert_jax.runtime.errors import UserError, user_path

__all__ = [
    "DEFAULT_TARGET_BYTES",
    "KINDS",
    "ByteCount",
    "DocKey",
    "Split",
    "cut_splits",
    "read_split",
    "split_bytes",
]

KINDS = kinds.CORPUS_FORMATS  # a split's kind is its source's format
DEFAULT_TARGET_BYTES = 64 << 20
PROBE_LIMIT = 1 << 20  # bytes searched for a boundary after a cut point
CUT_THREADS = 16  # cutting's requests in flight at once
_PROBE_BLOCK = 1 << 10  # the first block a probe reads; each next one twice as long
# A blank line that the text reader sees as one: ASCII whitespace only, short (never "long").
_BLANK_LINE = re.compile(rb"\n[ \t\r\x0b\x0c]{0,16}\n")

DocKey = tuple[int, ...]


def reader_option_names() -> frozenset[str]:
    """``read_split``'s options besides ``byte_count`` and ``check_text``, from its signature:
    ``cut_splits`` takes them too (``PrepareSettings.reader_options`` gives their values). Read
    from the function as this module defines it, so a wrapper put in its place (a test counting
    the bytes read) does not change what ``cut_splits`` accepts."""
    return _READER_OPTION_NAMES


def _keyword_options(function: Callable[..., object]) -> frozenset[str]:
    parameters = inspect.signature(function).parameters.values()
    named = {p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY}
    return frozenset(named - {"byte_count", "check_text"})


@dataclass(frozen=True, order=True)
class Split:
    """One piece of one input (see the module docstring)."""

    source_index: int
    source: str
    kind: str
    start: int
    stop: int


@dataclass
class ByteCount:
    """Bytes read from storage: a split's own (``content``) and anything else (``extra``)."""

    content: int = 0
    extra: int = 0

    def add(self, other: ByteCount) -> None:
        self.content += other.content
        self.extra += other.extra


# --- Planning ---


def _probe(
    path: str, size: int, start: int, stop: int, find: Callable[[bytes], int]
) -> tuple[int, int]:
    """(the file position of the first boundary ``find`` sees in ``[start, stop)`` of the file
    ``path`` of ``size`` bytes, or -1; the bytes read), read in blocks that double."""
    with user_path(path, "--input"), fs.RangeFile(path, start, stop, size) as stream:
        data, block_size = b"", _PROBE_BLOCK
        while block := stream.read(block_size):
            data, block_size = data + block, 2 * block_size  # most boundaries: the first block
            found = find(data)
            if found >= 0:
                return start + found, stream.bytes_read
        return -1, stream.bytes_read


def _text_boundary(data: bytes) -> int:
    """After a blank line (the data starts one byte before the cut point)."""
    match = _BLANK_LINE.search(data)
    return -1 if match is None else match.end()


def _line_boundary(max_line_bytes: int) -> Callable[[bytes], int]:
    """After the first whole line that the reader takes (not over-long) in the data, which
    starts one byte before the cut point: the split before the cut then holds a line the
    reader yields, so a file's first split that yields none is the whole file (empty)."""

    def find(data: bytes) -> int:
        end = data.find(b"\n")
        while end >= 0:
            after = data.find(b"\n", end + 1)
            if after < 0:
                return -1
            if after - end <= max_line_bytes + 1:  # as _lines reads it: whole, not too long
                return after + 1
            end = after
        return -1

    return find


@dataclass
class _Layout:
    """What cutting learnt of one source: its splits when they are known without probes;
    otherwise the file's size and how to find a boundary near each cut point."""

    index: int
    source: str
    kind: str
    splits: list[Split] | None = None
    size: int = 0
    back: int = 0  # bytes before a cut point that ``find`` sees (the line end before it)
    find: Callable[[bytes], int] | None = None
    bytes_read: int = 0


def _layout(index: int, source: str, target: int, max_line_bytes: int) -> _Layout:
    kind = kinds.corpus_format(source)
    if kind in ("tfds", "embedded") or source.endswith(".gz"):
        return _Layout(index, source, kind, [Split(index, source, kind, 0, -1)])
    if kind == "parquet":
        return _cut_parquet(index, source, target)
    if kind == "wikipedia":
        return _cut_dump(index, source)
    with user_path(source, "--input"):
        size = fs.getsize(source)
    if kind == "jsonl":
        return _Layout(index, source, kind, size=size, back=1, find=_line_boundary(max_line_bytes))
    if max_line_bytes <= 17:  # a blank line the reader skips as over-long is no boundary
        return _Layout(index, source, kind, [Split(index, source, kind, 0, size)])
    return _Layout(index, source, kind, size=size, back=1, find=_text_boundary)


def _cut_parquet(index: int, path: str, target: int) -> _Layout:
    """Runs of row groups of about ``target`` bytes on disk, from the footer."""
    with user_path(path, "--input"), fs.RangeFile(path) as stream:
        try:
            metadata = parquet.read_metadata(path, stream)
        finally:
            bytes_read = stream.bytes_read
    cuts, size = [0], 0
    for group in range(metadata.num_row_groups):
        size += _row_group_bytes(metadata, group)
        if size >= target and group + 1 < metadata.num_row_groups:
            cuts.append(group + 1)
            size = 0
    cuts.append(metadata.num_row_groups)
    splits = _ranges(index, path, "parquet", cuts)
    return _Layout(index, path, "parquet", splits, bytes_read=bytes_read)


def _row_group_bytes(metadata, group: int) -> int:
    row_group = metadata.row_group(group)
    return sum(row_group.column(c).total_compressed_size for c in range(row_group.num_columns))


def _cut_dump(index: int, path: str) -> _Layout:
    """A multistream dump is cut at bz2 stream starts; any other dump is read whole."""
    whole = _Layout(index, path, "wikipedia", [Split(index, path, "wikipedia", 0, -1)])
    if not path.endswith(".bz2"):
        return whole
    with user_path(path, "--input"), fs.RangeFile(path) as stream:
        try:
            header = wikipedia.multistream_header(path, wikipedia.probe_head(stream))
        finally:
            whole.bytes_read = stream.bytes_read
    if header is None:  # one stream, or streams cut mid-page
        return whole
    return _Layout(
        index,
        path,
        "wikipedia",
        size=stream.size,
        find=wikipedia.next_stream_start,
        bytes_read=whole.bytes_read,
    )


def _ranges(index: int, source: str, kind: str, cuts: list[int]) -> list[Split]:
    return [Split(index, source, kind, a, b) for a, b in zip(cuts, cuts[1:])]


def cut_splits(
    sources: Sequence[str | os.PathLike] | str,
    *,
    target_bytes: int = DEFAULT_TARGET_BYTES,
    byte_count: ByteCount | None = None,
    max_line_bytes: int = readers.DEFAULT_MAX_LINE_BYTES,
    **reader_options,
) -> list[Split]:
    """The splits of ``sources`` in input order (see the module docstring). ``byte_count``
    (its ``extra``) counts the bytes the probes read. ``reader_options``: ``read_split``'s,
    accepted so that callers pass one set; only ``max_line_bytes`` matters here. Its requests
    (sizes, footers, probes) run ``CUT_THREADS`` at a time: in a bucket each one waits for
    the network, and a large corpus asks thousands."""
    unknown = set(reader_options) - reader_option_names()
    if unknown:
        raise TypeError(f"cut_splits() got unexpected options {sorted(unknown)}")
    if target_bytes < 1:
        raise UserError(f"split size must be at least 1 byte, not {target_bytes}")
    count = ByteCount() if byte_count is None else byte_count
    expanded = kinds.expand_sources(sources)
    with ThreadPoolExecutor(CUT_THREADS) as pool:
        layouts = list(
            pool.map(
                lambda indexed: _layout(*indexed, target_bytes, max_line_bytes),
                enumerate(expanded),
            )
        )
        # The cut near k * target: the first boundary at or after it (and within the probe
        # limit), each probe on its own, so that they all run at once.
        probes = [
            (layout, point)
            for layout in layouts
            if layout.splits is None
            for point in range(target_bytes, layout.size, target_bytes)
        ]

        def probe(task: tuple[_Layout, int]) -> tuple[int, int]:
            layout, point = task
            stop = min(layout.size, point + min(target_bytes, PROBE_LIMIT))
            return _probe(layout.source, layout.size, point - layout.back, stop, layout.find)

        found = list(pool.map(probe, probes))
    cuts: dict[int, list[int]] = {layout.index: [0] for layout in layouts}
    for (layout, _), (position, bytes_read) in zip(probes, found):
        count.extra += bytes_read
        if cuts[layout.index][-1] < position < layout.size:
            cuts[layout.index].append(position)
    every: list[Split] = []
    for layout in layouts:
        count.extra += layout.bytes_read
        if layout.splits is None:
            cut = [*cuts[layout.index], layout.size]
            layout.splits = _ranges(layout.index, layout.source, layout.kind, cut)
        every.extend(layout.splits)
    return every


def split_bytes(split: Split) -> int:
    """The bytes on storage ``split`` covers; 0 where it has none (``embedded``, ``tfds``)."""
    if split.kind in ("embedded", "tfds"):
        return 0
    if split.kind == "parquet":
        metadata = _parquet_metadata(split.source)
        return sum(_row_group_bytes(metadata, g) for g in range(split.start, split.stop))
    if split.stop < 0:
        with user_path(split.source, "--input"):
            return fs.getsize(split.source)
    return split.stop - split.start


@functools.lru_cache(maxsize=16)
def _parquet_metadata(path: str):
    with user_path(path, "--input"), fs.RangeFile(path) as stream:
        return parquet.read_metadata(path, stream)


# --- Reading ---


def _counted(stats: CorpusStats, items: Iterator[tuple[DocKey, Document | None]]):
    """Real documents passed on; empty ones and pages that are no article counted (what every
    reader of documents keeps and counts is decided here)."""
    for key, document in items:
        if document is None:
            stats.skipped_pages += 1
        elif not document:
            stats.empty_documents += 1
        else:
            stats.add_document(document)
            yield key, document


def read_split(
    split: Split,
    stats: CorpusStats,
    *,
    byte_count: ByteCount | None = None,
    tfds_data_dir: str | None = None,
    text_field: str = readers.DEFAULT_TEXT_FIELD,
    max_line_bytes: int = readers.DEFAULT_MAX_LINE_BYTES,
    strict: bool = False,
    sentence_split: bool = False,
    splitter_name: str = DEFAULT_SPLITTER,
    check_text: bool = False,
) -> Iterator[tuple[DocKey, Document]]:
    """The documents of ``split`` with their keys, counting into ``stats`` and ``byte_count``
    (see the module docstring). ``check_text``: a text or JSONL split that starts its file
    refuses the file if its first bytes are not text (``text_check.sniffed``), as they are
    read, instead of counting bad lines."""
    split_text = splitter(splitter_name)  # an unknown name fails here, before anything is read
    count = ByteCount() if byte_count is None else byte_count
    index, path = split.source_index, split.source
    if split.kind == "tfds":
        items = readers._iter_tfds(path, stats, tfds_data_dir, text_field, strict, split_text)
        yield from _counted(stats, (((index, n), d) for n, d in enumerate(items)))
        return
    if split.kind == "embedded":
        stats.files += 1
        documents = embedded_documents(path.partition(":")[2] or "train")
        yield from _counted(stats, (((index, n), d) for n, d in enumerate(documents)))
        return
    if split.start == 0:
        stats.files += 1
    if split.kind == "parquet":
        items = _parquet_documents(split, stats, count, text_field, strict, split_text)
    elif split.kind == "wikipedia" and split.stop < 0:
        items = _whole_dump_documents(split, stats, count, split_text)
    elif split.kind == "wikipedia":
        items = _dump_range_documents(split, stats, count, split_text)
    else:
        lines_split = split_text if sentence_split else None
        items = _line_documents(
            split,
            stats,
            count,
            max_line_bytes,
            strict,
            text_field,
            split_text,
            lines_split,
            check_text,
        )
    yield from _counted(stats, items)


_READER_OPTION_NAMES = _keyword_options(read_split)


def _line_documents(
    split: Split,
    stats: CorpusStats,
    count: ByteCount,
    max_line_bytes: int,
    strict: bool,
    text_field: str,
    split_text: Callable[[str], list[str]],
    split_lines: Callable[[str], list[str]] | None,
    check_text: bool = False,
) -> Iterator[tuple[DocKey, Document]]:
    """Text or JSONL: a byte range, or a ``.gz`` file whole (keyed by ordinal)."""
    path, index, whole = split.source, split.source_index, split.stop < 0
    with user_path(path, "input"):
        raw = fs.RangeFile(path, split.start, None if whole else split.stop)
    try:
        stream: io.BufferedIOBase = io.BufferedReader(raw, buffer_size=1 << 20)
        if path.endswith(".gz"):
            stream = gzip.GzipFile(fileobj=stream)
        with stream:
            numbered = split.start == 0
            # A file's first bytes checked to be text as they are read: no read of their own.
            opener = fs.open_gzip if path.endswith(".gz") else lambda p: fs.open(p, "rb")
            sniff = check_text and numbered
            checked = text_check.sniffed(stream, path, opener) if sniff else stream
            lines = readers._lines(
                checked, path, stats, max_line_bytes, strict, split.start, numbered
            )
            if split.start == 0:
                lines = readers._noting_empty(lines, stats, path)
            if split.kind == "jsonl":
                texts = readers._jsonl_texts(lines, path, stats, strict, text_field, numbered)
                keyed = ((offset, split_text(text)) for offset, text in texts)
            else:
                keyed = readers._text_documents(lines, stats, split_lines, split.start > 0)
            for ordinal, (offset, document) in enumerate(keyed):
                yield (index, ordinal if whole else offset), document
    finally:
        count.content += raw.bytes_read
        raw.close()


def _parquet_documents(
    split: Split,
    stats: CorpusStats,
    count: ByteCount,
    text_field: str,
    strict: bool,
    split_text: Callable[[str], list[str]],
) -> Iterator[tuple[DocKey, Document]]:
    path = split.source
    with user_path(path, "--input"):
        stream = fs.RangeFile(path)
    footer = 0
    try:
        metadata = parquet.read_metadata(path, stream)
        footer = stream.bytes_read
        if split.start == 0 and metadata.num_rows == 0:
            stats.note("empty_files", path)
        rows = parquet.row_group_texts(path, stream, metadata, text_field, split.start, split.stop)
        for group, in_group, row, text in rows:
            if text is None:
                if strict:
                    raise UserError(f"{path}: row {row}: no string in column {text_field!r}")
                stats.note("bad_records", f"{path}: row {row}")
                continue
            yield (split.source_index, group, in_group), split_text(text)
    finally:
        count.extra += footer
        count.content += stream.bytes_read - footer
        stream.close()


def _whole_dump_documents(
    split: Split,
    stats: CorpusStats,
    count: ByteCount,
    split_text: Callable[[str], list[str]],
) -> Iterator[tuple[DocKey, Document | None]]:
    """An ``.xml`` dump, or a ``.bz2`` one in one stream (or cut mid-page): read whole."""
    path = split.source
    with user_path(path, "--input"):
        raw = fs.RangeFile(path)
    counts = wikipedia.Counts()
    try:
        stream = io.BufferedReader(raw, buffer_size=1 << 20)
        candidates = wikipedia.iter_candidates(path, counts, stream)
        for ordinal, (title, wikitext) in enumerate(candidates):
            text = wikipedia.article_text(title, wikitext)
            yield (split.source_index, ordinal), None if text is None else split_text(text)
    finally:
        stats.skipped_pages += counts.skipped_pages
        count.content += raw.bytes_read
        raw.close()
    if counts.pages == 0:
        stats.note("empty_files", path)


def _dump_range_documents(
    split: Split,
    stats: CorpusStats,
    count: ByteCount,
    split_text: Callable[[str], list[str]],
) -> Iterator[tuple[DocKey, Document | None]]:
    """Whole bz2 streams of a multistream dump, each parsed under the dump's header (from the
    first stream: this split's own, or read apart for a later split)."""
    path, header, pages = split.source, None, 0
    if split.start > 0:
        with user_path(path, "--input"), fs.RangeFile(path) as first:
            try:
                header = wikipedia.first_stream_header(path, first)
            finally:
                count.extra += first.bytes_read
    with user_path(path, "--input"):
        raw = fs.RangeFile(path, split.start, split.stop)
    try:
        for offset, data in wikipedia.iter_streams(raw, split.start):
            if header is None:
                header = wikipedia.first_stream_header(path, io.BytesIO(data))
            candidates = wikipedia.chunk_candidates(path, header, data)
            for page, candidate in enumerate(candidates):
                pages += 1
                text = None if candidate is None else wikipedia.article_text(*candidate)
                document = None if text is None else split_text(text)
                yield (split.source_index, offset, page), document
    finally:
        count.content += raw.bytes_read
        whole = split.start == 0 and raw.stop == raw.size
        raw.close()
    if pages == 0 and whole:
        stats.note("empty_files", path)
