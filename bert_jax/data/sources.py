"""Reading sources: what kind a data source is, and the documents (lists of sentences) it holds.

Public API:

- ``source_kind(source) -> "records" | "tfds" | "embedded" | "text"``: the one place that decides
  what a path or name is (``records``: prepared TFRecords, a directory holding ``*.tfrecord*``
  files or a path/glob naming them; ``text``: anything else on disk, i.e. text or JSONL files).
- ``read_documents(sources, **options) -> (list[Document], CorpusStats)`` and the streaming
  ``iter_documents(sources, stats, **options)``. A source is
    * a path, directory or glob of text files in the original format (one sentence per line, a
      blank line between documents); ``.gz`` files are read transparently;
    * a ``.jsonl`` (or ``.jsonl.gz``) file with one JSON object per line holding a ``text`` field,
      split into sentences (``sentences.split_sentences``);
    * ``tfds:NAME[/CONFIG][:SPLIT]`` (split defaults to "train"), read offline from
      ``tfds_data_dir`` (or TFDS's default data dir) — it must already be prepared;
    * ``embedded[:train|eval|all]`` (``embedded.embedded_documents``, re-exported here).
- ``expand_sources(sources) -> list[str]``: directories and globs to files, special sources kept.

Bad input is handled and counted in ``CorpusStats`` rather than crashing hours into a run:
bytes that are not UTF-8 are dropped from their line (``invalid_utf8_lines``), empty files are
skipped (``empty_files``), documents without sentences are skipped (``empty_documents``),
one-sentence documents are kept (``one_sentence_documents``; they still make instances, with a
forced random next), lines longer than ``max_line_bytes`` are dropped without ever being held in
memory whole (``long_lines``), and JSONL lines that are not objects with a string text field are
skipped (``bad_records``). ``strict=True`` turns each of these (except empty and one-sentence
documents) into a ``ValueError`` naming the file and line. A missing file, a glob that matches
nothing, or an unknown TFDS dataset is always an error.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Literal

from bert_jax import fs
from bert_jax.data.embedded import Document, embedded_document_names, embedded_documents
from bert_jax.data.layout import RECORD_SUFFIX
from bert_jax.data.sentences import split_sentences

__all__ = [
    "CorpusStats",
    "Document",
    "embedded_document_names",
    "embedded_documents",
    "expand_sources",
    "iter_documents",
    "read_documents",
    "source_kind",
    "split_sentences",
]

SourceKind = Literal["records", "tfds", "embedded", "text"]

EMBEDDED = "embedded"
TFDS_PREFIX = "tfds:"
DEFAULT_MAX_LINE_BYTES = 200_000
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
    if fs.is_remote(source) and RECORD_SUFFIX in fs.basename(source):
        return "records"  # by its name alone: no request to the bucket
    if fs.isdir(source):
        return "records" if any(RECORD_SUFFIX in f for f in fs.listdir(source)) else "text"
    return "records" if RECORD_SUFFIX in fs.basename(source) else "text"


def _is_jsonl(path: str) -> bool:
    base = path[:-3] if path.endswith(".gz") else path
    return base.endswith(".jsonl")


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
    """Resolve paths, directories and globs to files (sorted per pattern); keep special sources."""
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    resolved: list[str] = []
    for source in sources:
        source = os.fspath(source)
        if source_kind(source) in ("tfds", "embedded"):
            resolved.append(source)
        elif fs.isdir(source):
            files = sorted(
                fs.join(source, f)
                for f in fs.listdir(source)
                if not f.startswith(".") and fs.isfile(fs.join(source, f))
            )
            if not files:
                raise ValueError(f"input directory {source} holds no files")
            resolved.extend(files)
        elif glob.has_magic(source):
            files = sorted(f for f in fs.glob(source) if fs.isfile(f))
            if not files:
                raise ValueError(f"input pattern {source} matches no files")
            resolved.extend(files)
        elif fs.isfile(source):
            resolved.append(source)
        else:
            raise FileNotFoundError(f"input not found: {source}")
    if not resolved:
        raise ValueError("no input sources given")
    return resolved


def _open_binary(path: str) -> IO[bytes]:
    if path.endswith(".gz"):
        return fs.open_gzip(path)
    return fs.open(path, "rb")


def _iter_lines(
    path: str, stats: CorpusStats, max_line_bytes: int, strict: bool
) -> Iterator[tuple[int, str]]:
    """(line number, decoded line) with over-long lines skipped and bad bytes dropped.

    Reads in pieces of at most ``max_line_bytes`` so that a multi-gigabyte line (a corrupted or
    minified file) never has to fit in memory.
    """
    with _open_binary(path) as f:
        lineno = 0
        while True:
            raw = f.readline(max_line_bytes + 1)
            if not raw:
                return
            lineno += 1
            if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
                if strict:
                    raise ValueError(f"{path}:{lineno}: line longer than {max_line_bytes} bytes")
                stats.note("long_lines", f"{path}:{lineno}")
                while raw and not raw.endswith(b"\n"):
                    raw = f.readline(max_line_bytes + 1)
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                if strict:
                    raise ValueError(f"{path}:{lineno}: invalid UTF-8 ({err.reason})") from err
                stats.note("invalid_utf8_lines", f"{path}:{lineno}")
                text = raw.decode("utf-8", errors="replace").replace("\ufffd", "")
            yield lineno, text


def _iter_text_file(
    path: str, stats: CorpusStats, max_line_bytes: int, strict: bool, sentence_split: bool
) -> Iterator[Document]:
    document: Document = []
    saw_blank = False
    any_line = False
    for _, line in _iter_lines(path, stats, max_line_bytes, strict):
        any_line = True
        line = line.strip()
        if not line:
            if document:
                yield document
                document = []
            elif saw_blank:
                # A second blank line in a row encloses a document with no sentences.
                stats.empty_documents += 1
            saw_blank = True
            continue
        saw_blank = False
        if sentence_split:
            document.extend(split_sentences(line))
        else:
            document.append(line)
    if document:
        yield document
    if not any_line:
        stats.note("empty_files", path)


def _iter_jsonl_file(
    path: str,
    stats: CorpusStats,
    max_line_bytes: int,
    strict: bool,
    text_field: str,
) -> Iterator[Document]:
    any_line = False
    for lineno, line in _iter_lines(path, stats, max_line_bytes, strict):
        any_line = True
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            if strict:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({err.msg})") from err
            stats.note("bad_records", f"{path}:{lineno}")
            continue
        text = record.get(text_field) if isinstance(record, dict) else None
        if not isinstance(text, str):
            if strict:
                raise ValueError(
                    f"{path}:{lineno}: expected a JSON object with a string {text_field!r} field"
                )
            stats.note("bad_records", f"{path}:{lineno}")
            continue
        document = split_sentences(text)
        if document:
            yield document
        else:
            stats.empty_documents += 1
    if not any_line:
        stats.note("empty_files", path)


def parse_tfds_source(source: str) -> tuple[str, str]:
    """``tfds:NAME[/CONFIG][:SPLIT]`` -> (``NAME[/CONFIG]``, split)."""
    spec = source[len(TFDS_PREFIX) :]
    name, _, split = spec.partition(":")
    if not name:
        raise ValueError(f"{source}: expected tfds:NAME[/CONFIG][:SPLIT]")
    return name, split or "train"


def _iter_tfds(
    source: str,
    stats: CorpusStats,
    data_dir: str | None,
    text_field: str,
    strict: bool,
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
        raise ValueError(f"{source}: TFDS dataset {name!r} not found ({reason})") from err
    if not builder.is_prepared():
        raise ValueError(
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
            raise ValueError(
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
                    raise ValueError(f"{source}#{index}: invalid UTF-8 ({err.reason})") from err
                stats.note("invalid_utf8_lines", f"{source}#{index}")
                value = value.decode("utf-8", errors="replace").replace("\ufffd", "")
        document = split_sentences(str(value))
        if document:
            yield document
        else:
            stats.empty_documents += 1


def iter_documents(
    sources: Sequence[str | os.PathLike] | str,
    stats: CorpusStats | None = None,
    *,
    tfds_data_dir: str | None = None,
    text_field: str = "text",
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    strict: bool = False,
    sentence_split: bool = False,
) -> Iterator[Document]:
    """Stream documents from ``sources`` in order, counting into ``stats`` (see module docstring).

    ``sentence_split=True`` also splits the lines of original-format text files into sentences
    (for files that hold a paragraph per line); by default each line is one sentence, as in the
    original format.
    """
    stats = CorpusStats() if stats is None else stats
    for source in expand_sources(sources):
        kind = source_kind(source)
        if kind == "tfds":
            documents: Iterator[Document] = _iter_tfds(
                source, stats, tfds_data_dir, text_field, strict
            )
        elif kind == "embedded":
            _, _, split = source.partition(":")
            stats.files += 1
            documents = iter(embedded_documents(split or "train"))
        else:
            stats.files += 1
            if _is_jsonl(source):
                documents = _iter_jsonl_file(source, stats, max_line_bytes, strict, text_field)
            else:
                documents = _iter_text_file(source, stats, max_line_bytes, strict, sentence_split)
        for document in documents:
            stats.add_document(document)
            yield document


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
