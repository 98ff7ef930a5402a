"""Parquet files (``*.parquet``) -> the text of each row, one row = one document.

Public API:

- ``is_parquet(path)``: by name, the sources ``sources`` hands here.
- ``read_metadata(stream)``: the footer of the Parquet file open as ``stream`` (a seekable
  ``fs.RangeFile``), reading exactly the footer; ``row_group_texts(path, stream, metadata,
  text_field, first, stop)``: (row group, row in it, row in the file, text) of the row groups
  ``[first, stop)`` only, reading only their chunks of the one column (``splits`` cuts a file
  into such runs of row groups; ``None`` for a null). The column holds text: string,
  large_string, string_view or a dictionary of them (pandas' ``category``).

The file is read through ``bert_jax.runtime.fs`` (local or ``gs://``) with pyarrow, one batch of
``BATCH_ROWS`` rows of the one column at a time, so memory is bounded by a row group's column
chunk, never by the file. A file that is not Parquet (or is damaged), a missing column and a
column of another type are ``UserError`` naming the file (and ``--text-field``).
"""

from __future__ import annotations

from collections.abc import Iterator

from bert_jax.runtime.errors import UserError

BATCH_ROWS = 256


def _reason(err: Exception) -> str:
    """pyarrow's message on one printable line (it may quote the damaged bytes)."""
    return " ".join("".join(c if c.isprintable() else " " for c in str(err)).split())[:300]


def is_parquet(path: str) -> bool:
    return path.endswith(".parquet")


def _is_text(column_type) -> bool:
    """string, large_string, string_view, or a dictionary of them (what pandas writes for a
    ``category`` column)."""
    import pyarrow as pa

    if pa.types.is_dictionary(column_type):
        column_type = column_type.value_type
    is_string_view = getattr(pa.types, "is_string_view", None)  # pyarrow 16 and later
    return (
        pa.types.is_string(column_type)
        or pa.types.is_large_string(column_type)
        or (is_string_view is not None and is_string_view(column_type))
    )


def _check_column(path: str, schema, text_field: str) -> None:
    names = schema.names
    if text_field not in names:
        raise UserError(
            f"--input {path}: no column {text_field!r} (columns: {', '.join(names)}); "
            "choose one with --text-field"
        )
    column_type = schema.field(text_field).type
    if not _is_text(column_type):
        raise UserError(
            f"--input {path}: column {text_field!r} holds {column_type}, not text; "
            "choose a text column with --text-field"
        )


def _unreadable(path: str, err: Exception) -> UserError:
    # ArrowInvalid ("Parquet magic bytes not found", a corrupt page) or an I/O error.
    return UserError(f"--input {path}: not a readable Parquet file ({_reason(err)})")


_FOOTER_TAIL = 8  # the footer's length (4 bytes, little-endian) and the magic "PAR1"


def read_metadata(path: str, stream):
    """The ``FileMetaData`` of the Parquet file ``path`` open as the seekable ``stream``, read
    with two exact reads (the tail, then the footer). A file that is no Parquet is a
    ``UserError`` naming it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    size = stream.seek(0, 2)
    try:
        if size >= 4 + _FOOTER_TAIL:
            stream.seek(size - _FOOTER_TAIL)
            tail = stream.read(_FOOTER_TAIL)
            length = int.from_bytes(tail[:4], "little")
            if tail[4:] == b"PAR1" and length <= size - 4 - _FOOTER_TAIL:
                stream.seek(size - _FOOTER_TAIL - length)
                footer = stream.read(length)
                return pq.read_metadata(pa.BufferReader(b"PAR1" + footer + tail))
        stream.seek(0)
        return pq.ParquetFile(stream).metadata  # no Parquet file: pyarrow says why
    except (pa.ArrowException, OSError) as err:
        raise _unreadable(path, err) from err


def row_group_texts(
    path: str, stream, metadata, text_field: str, first: int, stop: int
) -> Iterator[tuple[int, int, int, str | None]]:
    """(row group, row within it from 0, row number in the file from 1, text or None) of every
    row of the row groups ``[first, stop)`` of the Parquet file ``path`` open as ``stream``,
    whose footer ``read_metadata`` gave."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(stream, metadata=metadata)
        _check_column(path, parquet.schema_arrow, text_field)
        row = sum(metadata.row_group(g).num_rows for g in range(first))
        for group in range(first, stop):
            in_group = 0
            batches = parquet.iter_batches(
                batch_size=BATCH_ROWS, row_groups=[group], columns=[text_field]
            )
            for batch in batches:
                for value in batch.column(0).to_pylist():
                    row += 1
                    yield group, in_group, row, value if isinstance(value, str) else None
                    in_group += 1
    except (pa.ArrowException, OSError) as err:
        raise _unreadable(path, err) from err
