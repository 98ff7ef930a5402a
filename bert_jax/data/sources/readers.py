"""The pieces of the corpus formats' readers that ``splits.read_split`` (the one reader of
documents) puts together: a file's lines (bad bytes dropped, over-long lines skipped without
being held whole), original-format text as documents, JSONL texts, TFDS examples; bad input
counted in ``CorpusStats`` or, with ``strict``, a ``UserError`` naming the file and line.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import IO

from bert_jax.data.sources.corpus_stats import CorpusStats
from bert_jax.data.sources.embedded import Document
from bert_jax.data.sources.kinds import parse_tfds_source
from bert_jax.runtime.errors import UserError

# `data prepare --max-line-bytes`: longer lines are skipped (counted as long_lines).
DEFAULT_MAX_LINE_BYTES = 200_000
# `data prepare --text-field`: the field (JSONL, TFDS) or column (Parquet) that holds the text.
DEFAULT_TEXT_FIELD = "text"


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
