"""What a source is: ``source_kind`` (records, TFDS, the embedded corpus, or text on disk), a
corpus's format (``corpus_format``, one of ``CORPUS_FORMATS``: text, JSONL, Parquet, a Wikipedia
dump, embedded, TFDS), and sources resolved to files (``expand_sources``). The one place that
inspects a source's name or contents: the readers, the splits, preparation and training read it.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from typing import Literal

from bert_jax.data.layout import RECORD_SUFFIX
from bert_jax.data.sources import parquet
from bert_jax.data.sources import wikipedia_dump as wikipedia
from bert_jax.runtime import fs
from bert_jax.runtime.errors import UserError

SourceKind = Literal["records", "tfds", "embedded", "text"]

EMBEDDED = "embedded"
TFDS_PREFIX = "tfds:"


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


def parse_tfds_source(source: str) -> tuple[str, str]:
    """``tfds:NAME[/CONFIG][:SPLIT]`` -> (``NAME[/CONFIG]``, split)."""
    spec = source[len(TFDS_PREFIX) :]
    name, _, split = spec.partition(":")
    if not name:
        raise UserError(f"{source}: expected tfds:NAME[/CONFIG][:SPLIT]")
    return name, split or "train"
