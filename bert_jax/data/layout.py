"""Names on disk of prepared pretraining data, shared by every stage that reads or writes it.

A directory written by ``bert-jax data prepare`` holds ``part-NNNNN.tfrecord`` shards (each with a
``part-NNNNN.json`` of counts), the settings in ``prepare_config.json`` and the tokenizer in
``tokenizer/``. Records from the original ``create_pretraining_data.py`` are recognised by the
same ``.tfrecord`` in their names.
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


def read_prepare_config(directory: str | os.PathLike) -> dict | None:
    """The settings ``data prepare`` recorded in ``directory``, or None for foreign records."""
    path = os.path.join(os.fspath(directory), CONFIG_FILE)
    if not fs.exists(path):
        return None
    with fs.open(path, encoding="utf-8") as f:
        return json.load(f)
