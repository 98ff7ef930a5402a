"""Corrupt TFRecord files (truncated, flipped bytes): found and named, or skipped and counted.

TensorFlow reports a damaged record as a ``DataLossError`` giving a byte offset but not the
file. When the pipeline meets one, ``find_corrupt`` reads this host's files once more to find
which file and which record (the records before it are intact; the CRC of each record's length
and data is checked), and ``corrupt_error`` says so as a ``CorruptRecordError`` (a user error:
one line, exit status 2). With ``config.data.skip_corrupt_records`` the pipeline instead keeps
each damaged file's intact records before the damage and counts the files cut short.
"""

from __future__ import annotations

from collections.abc import Sequence

from bert_jax.runtime.errors import UserError


class CorruptRecordError(UserError):
    """A TFRecord file that cannot be read to its end."""


def is_data_loss(error: BaseException) -> bool:
    """TensorFlow's DataLossError (a truncated or corrupted record), without importing it."""
    return type(error).__name__ == "DataLossError"


def data_loss_message(error: BaseException) -> str:
    """TensorFlow's DataLossError message without its op and function names."""
    message = str(error).split("}}", 1)[-1].split("[Op:", 1)[0].strip(" '")
    return message.split("' failed", 1)[0]


def _intact_records(path: str) -> tuple[int, str | None]:
    """(records read before the first damaged one, TensorFlow's message), or (n, None)."""
    from bert_jax.data.records.tfrecord import READ_BUFFER_BYTES, import_tensorflow

    tf = import_tensorflow()
    count = 0
    iterator = iter(tf.data.TFRecordDataset([path], buffer_size=READ_BUFFER_BYTES))
    while True:
        try:
            next(iterator)
        except StopIteration:
            return count, None
        except Exception as err:
            if not is_data_loss(err):
                raise
            return count, data_loss_message(err)
        count += 1


def find_corrupt(files: Sequence[str]) -> dict[str, tuple[int, str]]:
    """Damaged files among `files`: path -> (index of the first bad record, the problem)."""
    found = {}
    for path in files:
        intact, problem = _intact_records(path)
        if problem is not None:
            found[path] = (intact, problem)
    return found


def corrupt_error(path: str, index: int, problem: str) -> CorruptRecordError:
    return CorruptRecordError(
        f"{path}: record {index} is damaged ({problem}); re-create the file, or set "
        "config.data.skip_corrupt_records=True to train on without its damaged part"
    )


def first_record(files: Sequence[str], skip_corrupt: bool) -> tuple[str, bytes | None]:
    """The first record of the first file (of the first readable one when `skip_corrupt`),
    for the pipeline's up-front shape check; a damaged one is named unless skipping."""
    from bert_jax.data.records.tfrecord import READ_BUFFER_BYTES, import_tensorflow

    tf = import_tensorflow()
    for path in files:
        first = tf.data.TFRecordDataset([path], buffer_size=READ_BUFFER_BYTES)
        try:
            return path, next(iter(first.take(1).as_numpy_iterator()), None)
        except Exception as err:
            if not is_data_loss(err):
                raise
            if not skip_corrupt:
                raise corrupt_error(path, 0, data_loss_message(err)) from None
    return files[0], None
