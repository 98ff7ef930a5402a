"""A pretraining run's preparation of a raw corpus: ``prepare_cached(sources, tokenizer, settings,
cache_dir) -> record files``, prepared once into a directory named by a hash of what shapes the
records, and reused from there (restarts, later phases, every host of a job).

The key holds the sources (their content included), the tokenizer, what decides the groups'
count, and the settings whose declarations say they shape the records (``PrepareSettings``).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Sequence

from bert_jax.data.preparation.local_runner import prepare_records
from bert_jax.data.preparation.settings import PrepareSettings
from bert_jax.data.preparation.stage import FORMAT_VERSION
from bert_jax.data.records import manifest
from bert_jax.data.sources.documents import TEXT_EXTRACTION_VERSION
from bert_jax.data.sources.kinds import expand_sources
from bert_jax.data.tokenizers.interface import Tokenizer
from bert_jax.data.tokenizers.load_or_train import load_tokenizer
from bert_jax.runtime import fs
from bert_jax.runtime.outputs import write_json_atomic

# Written by ``prepare_cached`` when a preparation is complete: the list of its record files.
_COMPLETE_MARKER = "prepared-complete.json"
# The records settings in ``prepare_cached``'s key from its first version. Another is in the key
# only off the value every preparation had before it was keyed (``_BEFORE_KEYED``: what records
# had before it was recorded, ``manifest.BEFORE_RECORDED``; ``sentence_split``, recorded from the
# start, was never set by a pretraining run), so a cache made before it is still found.
KEYED_FROM_THE_START = (
    "max_seq_length",
    "max_predictions_per_seq",
    "masked_lm_prob",
    "short_seq_prob",
    "dupe_factor",
    "whole_word_mask",
    "seed",
    "splitter",
)
_BEFORE_KEYED = {**manifest.BEFORE_RECORDED, "sentence_split": False}
_UNSET = object()


def cache_key(items: list[str], tokenizer: Tokenizer, settings: PrepareSettings) -> dict:
    """What names a preparation in the cache: the sources (their content too: a changed corpus
    is prepared anew, never served stale), the tokenizer, what decides the groups' count before
    anything is read, and every setting that shapes the records (``PrepareSettings.recorded``).
    A setting keyed later leaves the key of the preparations made before it alone while it has
    the value they were made with: a finished preparation is still found."""
    key = {
        "items": items,
        "inputs": manifest.input_identity(expand_sources(items)),
        "tokenizer": tokenizer.fingerprint(),
        "text_extraction": TEXT_EXTRACTION_VERSION,
        "format_version": FORMAT_VERSION,
        "num_groups": settings.num_groups,
        "group_bytes": settings.group_bytes,
    }
    for name, value in settings.recorded().items():
        if name in KEYED_FROM_THE_START or value != _BEFORE_KEYED.get(name, _UNSET):
            key[name] = value
    return key


def prepare_cached(
    sources: Sequence[str | os.PathLike] | str | os.PathLike,
    tokenizer: Tokenizer | str | os.PathLike,
    settings: PrepareSettings,
    cache_dir: str | os.PathLike | None = None,
    *,
    write_marker: bool = True,
) -> list[str]:
    """Record files for a raw corpus: prepared once into ``cache_dir``, then reused.

    The directory is ``prepared-<hash>`` of the sources (their content included), the tokenizer
    and the settings that shape the instances; a finished preparation leaves a marker listing its
    files, so restarts and later phases reuse it (reading the corpus only to hash it). Every host
    of a job prepares the same bytes; only the one given ``write_marker`` (the first) writes the
    marker.
    ``cache_dir`` defaults to ``bert_jax_data`` in the system's temporary directory.
    """
    if not isinstance(tokenizer, Tokenizer):
        tokenizer = load_tokenizer(tokenizer)
    items = (
        [os.fspath(sources)]
        if isinstance(sources, (str, os.PathLike))
        else [os.fspath(s) for s in sources]
    )
    key = hashlib.sha256(
        json.dumps(cache_key(items, tokenizer, settings), sort_keys=True).encode()
    ).hexdigest()
    if cache_dir is None:
        cache_dir = os.path.join(tempfile.gettempdir(), "bert_jax_data")
    output_dir = os.path.join(os.fspath(cache_dir), f"prepared-{key[:16]}")
    marker = os.path.join(output_dir, _COMPLETE_MARKER)
    if fs.exists(marker):
        with fs.open(marker, encoding="utf-8") as f:
            return [os.path.join(output_dir, name) for name in json.load(f)["files"]]
    files = prepare_records(
        items, tokenizer, output_dir, settings, output_what="config.data.cache_dir"
    ).files
    if not files:
        raise manifest.InputError(
            f"preparing {', '.join(items)} produced no instances (too little text for the "
            "sentence pairs); give a larger corpus"
        )
    if write_marker:
        write_json_atomic(marker, {"files": [os.path.basename(f) for f in files]})
    return files
