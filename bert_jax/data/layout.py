"""Names on disk of prepared pretraining data, shared by every stage that reads or writes it.

A directory written by ``bert-jax data prepare`` holds ``part-NNNNN.tfrecord`` shards (each with a
``part-NNNNN.json`` of counts), the settings in ``prepare_config.json``, the tokenizer in
``tokenizer/`` and the held-out records in ``heldout/``. Records from the original
``create_pretraining_data.py`` are recognised by the same ``.tfrecord`` in their names.
"""

from __future__ import annotations

import json
import os

from bert_jax.runtime import fs

RECORD_SUFFIX = ".tfrecord"
CONFIG_FILE = "prepare_config.json"
TOKENIZER_SUBDIR = "tokenizer"
# `data prepare --group-bytes`: input bytes per group of documents (a shard; what one worker
# holds at a time) when ``--num-groups`` is not given.
DEFAULT_GROUP_BYTES = 8 << 20
# Documents `data prepare` sets aside for held-out evaluation (chosen by a hash of their key, so
# every runner sets aside the same ones) are a records directory of their own inside the output:
# the same files and manifest as the training records, read by the same readers.
HELDOUT_SUBDIR = "heldout"
# `data prepare --heldout-share`: the share of documents held out (0: none) ...
DEFAULT_HELDOUT_SHARE = 0.01
# ... and its floor, so that a small corpus still has some: while the share is above 0, at least
# this many documents are held out, never more than 1 in HELDOUT_FLOOR_CAP of the corpus's.
HELDOUT_MIN_DOCUMENTS = 100
HELDOUT_FLOOR_CAP = 10


def heldout_dir(records_dir: str | os.PathLike) -> str:
    """Where the held-out records of the records directory ``records_dir`` are (or would be)."""
    return os.path.join(os.fspath(records_dir), HELDOUT_SUBDIR)


def read_prepare_config(directory: str | os.PathLike) -> dict | None:
    """The settings ``data prepare`` recorded in ``directory``, or None for foreign records."""
    path = os.path.join(os.fspath(directory), CONFIG_FILE)
    if not fs.exists(path):
        return None
    with fs.open(path, encoding="utf-8") as f:
        return json.load(f)
