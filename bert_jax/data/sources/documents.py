"""Reading sources: what kind a data source is, and the documents (lists of sentences) it holds.

Public API:

- ``source_kind(source) -> "records" | "tfds" | "embedded" | "text"``: the one place that decides
  what a path or name is (``records``: prepared TFRecords, a directory holding ``*.tfrecord*``
  files or a path/glob naming them; ``text``: anything else on disk, i.e. text or JSONL files).
- ``corpus_format(source)``: how a corpus source is read, one of ``CORPUS_FORMATS`` (the file's
  format told by its name); the readers here and the splits read this one decision.
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
    * ``embedded[:train|eval|all]`` (``embedded.embedded_documents``, re-exported here).
- ``expand_sources(sources) -> list[str]``: directories and globs to files, special sources kept.
- The same inputs cut into splits that workers read apart, each byte once, with the same
  documents and counts: ``splits.py`` (it reads through this module's line readers).

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

Why this file is long: every source kind (text, JSONL, TFDS, embedded, Parquet, Wikipedia
dumps) resolves, opens and reports its bad input through the same few helpers, and the worker
pool that splits prose in input order serves all of them; the readers of their own formats
live in parquet.py and wikipedia.py.
"""

from __future__ import annotations

import dataclasses
import glob
import itertools
import json
import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Literal

from bert_jax.data.layout import RECORD_SUFFIX
from bert_jax.data.sentences import DEFAULT_SPLITTER, split_sentences, splitter
from bert_jax.data.sources import parquet
from bert_jax.data.sources import wikipedia_dump as wikipedia
from bert_jax.data.sources.embedded import Document, embedded_document_names, embedded_documents
from bert_jax.runtime import fs
from bert_jax.runtime.errors import UserError, user_path

__all__ = [
    "CORPUS_FORMATS",
    "CorpusStats",
    "Document",
    "corpus_format",
    "embedded_document_names",
    "embedded_documents",
    "expand_sources",
    "is_original_format",
    "is_text_file",
    "iter_documents",
    "read_documents",
    "source_kind",
    "split_sentences",
]

SourceKind = Literal["records", "tfds", "embedded", "text"]

EMBEDDED = "embedded"
TFDS_PREFIX = "tfds:"
DEFAULT_MAX_LINE_BYTES = 200_000
# How this version turns prose into sentences (wikitext stripping and sentence splitting), recorded
# as ``text_extraction`` beside the splitter in prepared data: records made by another version
# hold other words, so a resume or a merge over them is refused (``manifest.check_resumable``).
# 1: every version before it (not recorded); 2: splitters only cut, never rewrite ("don't" had
# become "donot" with syntok), and wikitext is stripped without markup left or prose lost.
TEXT_EXTRACTION_VERSION = 2
_MAX_PROBLEM_EXAMPLES = 20


def source_kind(source: str | os.PathLike) -> SourceKind:
    """What ``source`` is; nothing else in the package inspects a source's name or contents.

    ``tfds:...`` and ``embedded[:SPLIT]`` by name; a directory is ``records`` when it holds any
    ``*.tfrecord*`` file; a file or glob is ``records`` when its name contains ``.tfrecord``;
    everything else is ``text`` (original-format text or JSONL, told apart per file by name).
    """
    source = os.fspath(source)
    if source.startswith(TFDS_PREFIX):
        return "tfds"
    if source.split(":", 1)[0] == EMBEDDED:
        return "embedded"
    if fs.is_remote(source) and RECORD_SUFFIX in os.path.basename(source):
        return "records"  # by its name alone: no request to the bucket
    if fs.isdir(source):
        return "records" if any(RECORD_SUFFIX in f for f in fs.listdir(source)) else "text"
    return "records" if RECORD_SUFFIX in os.path.basename(source) else "text"


def _is_jsonl(path: str) -> bool:
    base = path[:-3] if path.endswith(".gz") else path
    return base.endswith(".jsonl")


# What a corpus source is read as (``corpus_format``): a named corpus, or a file's format.
CORPUS_FORMATS = ("text", "jsonl", "parquet", "wikipedia", "embedded", "tfds")


def corpus_format(source: str) -> str:
    """How a corpus source (``source_kind`` other than "records") is read, one of
    ``CORPUS_FORMATS``: ``tfds`` and ``embedded`` by ``source_kind``, a file by its name
    (``.jsonl[.gz]``, ``.parquet``, a Wikipedia dump's ``.xml[.bz2]``), else original-format
    text. The one decision: the readers and the splits (``splits.Split.kind``) read it."""
    kind = source_kind(source)
    if kind in ("tfds", "embedded"):
        return kind
    if _is_jsonl(source):
        return "jsonl"
    if parquet.is_parquet(source):
        return "parquet"
    if wikipedia.is_wikipedia_dump(source):
        return "wikipedia"
    return "text"


def is_original_format(path: str) -> bool:
    """Whether a corpus file (``source_kind`` "text") is in the original format as it lies on
    disk (one sentence per line), not JSONL, gzip, Parquet or a Wikipedia dump."""
    return corpus_format(path) == "text" and not path.endswith(".gz")


def is_text_file(path: str) -> bool:
    """Whether a corpus file is UTF-8 text as it lies on disk (or gzipped text): not a Parquet
    file nor a bz2-compressed dump, whose own readers check them."""
    return not (parquet.is_parquet(path) or path.endswith(".bz2"))


@dataclass
class CorpusStats:
    """Counts of what was read, kept and skipped; ``problems`` holds the first few locations."""

    files: int = 0
    empty_files: int = 0
    documents: int = 0
    sentences: int = 0
    empty_documents: int = 0
    one_sentence_documents: int = 0
    invalid_utf8_lines: int = 0
    long_lines: int = 0
    bad_records: int = 0
    skipped_pages: int = 0  # Wikipedia pages that are not articles (redirects, talk, ...)
    problems: list[str] = field(default_factory=list)

    def note(self, counter: str, where: str) -> None:
        setattr(self, counter, getattr(self, counter) + 1)
        if len(self.problems) < _MAX_PROBLEM_EXAMPLES:
            self.problems.append(f"{where}: {counter.replace('_', ' ')}")

    def add_document(self, document: Document) -> None:
        self.documents += 1
        self.sentences += len(document)
        if len(document) == 1:
            self.one_sentence_documents += 1

    def merge(self, other: CorpusStats) -> None:
        for f in dataclasses.fields(self):
            if f.name == "problems":
                room = _MAX_PROBLEM_EXAMPLES - len(self.problems)
                self.problems.extend(other.problems[: max(0, room)])
            else:
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        counts = {k: v for k, v in self.as_dict().items() if k != "problems" and v}
        return ", ".join(f"{k}={v}" for k, v in counts.items()) or "nothing read"


def expand_sources(sources: Sequence[str | os.PathLike]) -> list[str]:
    """Resolve paths, directories and globs to files (sorted per pattern); keep special sources.
    A path that exists is that path, even with glob characters in its name."""
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    resolved: list[str] = []
    for source in sources:
        source = os.fspath(source)
        if source_kind(source) in ("tfds", "embedded"):
            resolved.append(source)
        elif fs.isdir(source):
            files = sorted(
                os.path.join(source, f)
                for f in fs.listdir(source)
                if not f.startswith(".") and fs.isfile(os.path.join(source, f))
            )
            if not files:
                raise UserError(f"input directory {source} holds no files")
            resolved.extend(files)
        elif fs.isfile(source):  # before globbing: "corpus [2020].txt" is that file
            resolved.append(source)
        elif glob.has_magic(source):
            files = sorted(f for f in fs.glob(source) if fs.isfile(f))
            if not files:
                raise UserError(f"input pattern {source} matches no files")
            resolved.extend(files)
        else:
            raise UserError(f"input not found: {source}")
    if not resolved:
        raise UserError("no input sources given")
    return resolved


def _open_binary(path: str) -> IO[bytes]:
    with user_path(path, "input"):
        if path.endswith(".gz"):
            return fs.open_gzip(path)
        return fs.open(path, "rb")


def _where(path: str, lineno: int, offset: int, numbered: bool) -> str:
    """Where a line is, for a message: ``path:LINE``, or, in a split that starts inside the file
    (its line numbers unknown), ``path: line at byte OFFSET``."""
    return f"{path}:{lineno}" if numbered else f"{path}: line at byte {offset}"


def _lines(
    stream: IO[bytes],
    path: str,
    stats: CorpusStats,
    max_line_bytes: int,
    strict: bool,
    start: int = 0,
    numbered: bool = True,
) -> Iterator[tuple[int, int, str]]:
    """(line number, byte offset, decoded line) of each line of ``stream`` (which is at byte
    ``start`` of ``path``), with over-long lines skipped and bad bytes dropped.

    Reads in pieces of at most ``max_line_bytes`` so that a multi-gigabyte line (a corrupted or
    minified file) never has to fit in memory.
    """
    lineno, offset = 0, start
    while True:
        raw = stream.readline(max_line_bytes + 1)
        if not raw:
            return
        lineno += 1
        line_offset, offset = offset, offset + len(raw)
        if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
            where = _where(path, lineno, line_offset, numbered)
            if strict:
                raise UserError(
                    f"{where}: line longer than {max_line_bytes} bytes "
                    "(--max-line-bytes; without --strict it is skipped)"
                )
            stats.note("long_lines", where)
            while raw and not raw.endswith(b"\n"):
                raw = stream.readline(max_line_bytes + 1)
                offset += len(raw)
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            where = _where(path, lineno, line_offset, numbered)
            if strict:
                raise UserError(f"{where}: invalid UTF-8 ({err.reason})") from err
            stats.note("invalid_utf8_lines", where)
            text = raw.decode("utf-8", errors="replace").replace("\ufffd", "")
        yield lineno, line_offset, text


def _iter_lines(
    path: str, stats: CorpusStats, max_line_bytes: int, strict: bool
) -> Iterator[tuple[int, int, str]]:
    """``_lines`` of the whole file ``path``."""
    with _open_binary(path) as f:
        yield from _lines(f, path, stats, max_line_bytes, strict)


def _noting_empty(lines: Iterator, stats: CorpusStats, path: str) -> Iterator:
    """``lines`` passed on; an empty file noted in ``stats`` once they end."""
    empty = True
    for line in lines:
        empty = False
        yield line
    if empty:
        stats.note("empty_files", path)


def _text_documents(
    lines: Iterator[tuple[int, int, str]],
    stats: CorpusStats,
    split: Callable[[str], list[str]] | None,
    after_blank: bool = False,
) -> Iterator[tuple[int, Document]]:
    """(byte offset of its first line, document) of original-format text. ``after_blank``: the
    lines start right after a blank line (a split that starts inside a file)."""
    document: Document = []
    first = -1
    saw_blank = after_blank
    for _, offset, line in lines:
        line = line.strip()
        if not line:
            if document:
                yield first, document
                document = []
            elif saw_blank:
                # A second blank line in a row encloses a document with no sentences.
                stats.empty_documents += 1
            saw_blank = True
            first = -1
            continue
        saw_blank = False
        if first < 0:
            first = offset
        if split is not None:
            document.extend(split(line))
        else:
            document.append(line)
    if document:
        yield first, document


def _iter_text_file(
    path: str,
    stats: CorpusStats,
    max_line_bytes: int,
    strict: bool,
    split: Callable[[str], list[str]] | None,
) -> Iterator[Document]:
    lines = _noting_empty(_iter_lines(path, stats, max_line_bytes, strict), stats, path)
    for _, document in _text_documents(lines, stats, split):
        yield document


def _jsonl_texts(
    lines: Iterator[tuple[int, int, str]],
    path: str,
    stats: CorpusStats,
    strict: bool,
    text_field: str,
    numbered: bool = True,
) -> Iterator[tuple[int, str]]:
    """(byte offset of its line, text) of each JSONL record."""
    for lineno, offset, line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            where = _where(path, lineno, offset, numbered)
            if strict:
                raise UserError(f"{where}: not valid JSON ({err.msg})") from err
            stats.note("bad_records", where)
            continue
        text = record.get(text_field) if isinstance(record, dict) else None
        if not isinstance(text, str):
            where = _where(path, lineno, offset, numbered)
            if strict:
                raise UserError(
                    f"{where}: expected a JSON object with a string {text_field!r} field "
                    "(--text-field)"
                )
            stats.note("bad_records", where)
            continue
        yield offset, text


def _iter_jsonl_file(
    path: str,
    stats: CorpusStats,
    max_line_bytes: int,
    strict: bool,
    text_field: str,
) -> Iterator[str]:
    lines = _noting_empty(_iter_lines(path, stats, max_line_bytes, strict), stats, path)
    for _, text in _jsonl_texts(lines, path, stats, strict, text_field):
        yield text


def _iter_parquet_file(
    path: str, stats: CorpusStats, strict: bool, text_field: str
) -> Iterator[str]:
    any_row = False
    for row, text in parquet.iter_texts(path, text_field):
        any_row = True
        if text is None:
            if strict:
                raise UserError(f"{path}: row {row}: no string in column {text_field!r}")
            stats.note("bad_records", f"{path}: row {row}")
            continue
        yield text
    if not any_row:
        stats.note("empty_files", path)


def _iter_wikipedia_dump(path: str, stats: CorpusStats) -> Iterator[tuple[str, str]]:
    counts = wikipedia.Counts()
    try:
        yield from wikipedia.iter_candidates(path, counts)
    finally:
        stats.skipped_pages += counts.skipped_pages
    if counts.pages == 0:
        stats.note("empty_files", path)


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


def parse_tfds_source(source: str) -> tuple[str, str]:
    """``tfds:NAME[/CONFIG][:SPLIT]`` -> (``NAME[/CONFIG]``, split)."""
    spec = source[len(TFDS_PREFIX) :]
    name, _, split = spec.partition(":")
    if not name:
        raise UserError(f"{source}: expected tfds:NAME[/CONFIG][:SPLIT]")
    return name, split or "train"


def _iter_tfds(
    source: str,
    stats: CorpusStats,
    data_dir: str | None,
    text_field: str,
    strict: bool,
    split_text: Callable[[str], list[str]],
) -> Iterator[Document]:
    import tensorflow as tf

    tf.config.set_visible_devices([], "GPU")
    import tensorflow_datasets as tfds

    name, split = parse_tfds_source(source)
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except Exception as err:  # TFDS raises several types for an unknown name or config
        # TFDS appends the list of every known dataset; its first line says what went wrong.
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UserError(f"{source}: TFDS dataset {name!r} not found ({reason})") from err
    if not builder.is_prepared():
        raise UserError(
            f"{source}: TFDS dataset {name!r} is not prepared in "
            f"{data_dir or 'the default TFDS data dir'}; nothing is downloaded at run time, so "
            f"build it first (e.g. `tfds build {name} --data_dir DIR`) and pass that data dir"
        )
    features = builder.info.features
    keys = list(features.keys()) if hasattr(features, "keys") else []
    field_name = text_field
    if field_name not in keys:
        text_keys = [k for k in keys if isinstance(features[k], tfds.features.Text)]
        if len(text_keys) != 1:
            raise UserError(
                f"{source}: no {text_field!r} feature; features are {keys}. Choose one with "
                "text_field (--text-field)."
            )
        field_name = text_keys[0]
    dataset = builder.as_dataset(split=split, shuffle_files=False)
    stats.files += 1
    for index, example in enumerate(tfds.as_numpy(dataset)):
        value = example[field_name]
        if isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError as err:
                if strict:
                    raise UserError(f"{source}#{index}: invalid UTF-8 ({err.reason})") from err
                stats.note("invalid_utf8_lines", f"{source}#{index}")
                value = value.decode("utf-8", errors="replace").replace("\ufffd", "")
        yield split_text(str(value))


def iter_documents(
    sources: Sequence[str | os.PathLike] | str,
    stats: CorpusStats | None = None,
    *,
    tfds_data_dir: str | None = None,
    text_field: str = "text",
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
