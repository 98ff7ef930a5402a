"""Prepare's unit of work: one group of documents -> one TFRecord shard ``part-NNNNN.tfrecord``.

A worker process (no TensorFlow) tokenizes a group, makes ``dupe_factor`` passes of masked
instances (``instances.create_instance_rows``; random next sentences come from the same group),
shuffles and serializes them (``process_group``); the driver writes the shard and its counts
(``write_group``). ``document_groups`` cuts the document stream into groups and
``existing_parts`` lists what an earlier run already wrote. Group ``g`` is seeded by
``(seed, g)`` alone, so a shard's bytes never depend on which worker or machine made it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from bert_jax.data import instances as instances_lib
from bert_jax.data import records as records_lib
from bert_jax.data import single_instances
from bert_jax.data.files import write_json_atomic
from bert_jax.data.masking import MaskingConfig
from bert_jax.data.tokenizer import Tokenizer
from bert_jax.runtime import fs

logger = logging.getLogger(__name__)

_PART_RE = re.compile(r"^part-(\d{5,})\.(tfrecord|json)$")


@dataclass
class InstanceStats:
    """What instance creation produced; summed over groups."""

    groups: int = 0
    documents: int = 0
    instances: int = 0
    random_next: int = 0
    forced_random_next: int = 0
    short_target_instances: int = 0
    tokens: int = 0
    masked_lm_predictions: int = 0
    # Worker CPU time, immune to other load on the machine; wall time of the same work.
    cpu_seconds: float = 0.0
    seconds: float = 0.0

    def add(self, other: dict) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + other.get(f.name, 0))


def _group_seed(seed: int, group_index: int) -> int:
    return int(np.random.SeedSequence([seed, group_index]).generate_state(1, np.uint64)[0])


def part_name(group_index: int, suffix: str = "tfrecord") -> str:
    return f"part-{group_index:05d}.{suffix}"


# --- worker side (no TensorFlow) ------------------------------------------------------------------

_WORKER_TOKENIZER: Tokenizer | None = None


def init_worker(tokenizer: Tokenizer) -> None:
    global _WORKER_TOKENIZER
    _WORKER_TOKENIZER = tokenizer


def process_group(
    group_index: int, documents: list[list[str]], settings: dict
) -> tuple[dict, list[bytes]]:
    """Tokenize, pair, mask and serialize one group; returns its counts and its records.

    Runs in a worker without TensorFlow; the driver writes the records.
    """
    started, started_cpu = time.perf_counter(), time.process_time()
    tokenizer = _WORKER_TOKENIZER
    assert tokenizer is not None, "worker not initialised"
    tokenized = instances_lib.tokenize_documents(documents, tokenizer)
    counts = {"groups": 1, "documents": len(tokenized)}
    # Pairs need a second document for random next sentences; single sequences need text.
    pairs = settings.get("instance_format", "sentence_pairs") == "sentence_pairs"
    if len(tokenized) < (2 if pairs else 1):
        logger.warning(
            "group %d: too few documents left after tokenization; nothing written", group_index
        )
        counts["seconds"] = time.perf_counter() - started
        counts["cpu_seconds"] = time.process_time() - started_cpu
        return counts, []
    masking = MaskingConfig.from_tokenizer(
        tokenizer,
        settings["masked_lm_prob"],
        settings["max_predictions_per_seq"],
        settings["whole_word_mask"],
        mask_share=settings.get("mask_share", 0.8),
        same_share=settings.get("same_share", 0.1),
        random_share=settings.get("random_share", 0.1),
    )
    instance_format = settings.get("instance_format", "sentence_pairs")
    make_rows = instances_lib.create_instance_rows
    extra = {}
    if instance_format != "sentence_pairs":  # no NSP: [CLS] text [SEP] rows
        make_rows = single_instances.create_single_rows
        extra = {
            "instance_format": instance_format,
            "mask": settings.get("objective") != "ltr",  # a left-to-right LM reads text as is
        }
    batches, order = make_rows(
        tokenized,
        masking,
        max_seq_length=settings["max_seq_length"],
        short_seq_prob=settings["short_seq_prob"],
        dupe_factor=settings["dupe_factor"],
        seed=_group_seed(settings["seed"], group_index),
        **extra,
    )
    serialized: list[bytes] = []
    tally = dict.fromkeys(
        (
            "random_next",
            "forced_random_next",
            "short_target_instances",
            "tokens",
            "masked_lm_predictions",
        ),
        0,
    )
    for batch in batches:
        serialized.extend(records_lib.serialize_arrays(batch.arrays))
        tally["random_next"] += int((batch.random_document_index >= 0).sum())
        tally["forced_random_next"] += int(batch.forced_random_next.sum())
        tally["short_target_instances"] += int(
            (batch.target_seq_length < batch.max_num_tokens).sum()
        )
        tally["tokens"] += int(batch.lengths.sum())
        tally["masked_lm_predictions"] += int(batch.arrays["masked_lm_weights"].sum())
    serialized = [serialized[i] for i in order]  # the shuffle
    counts.update(
        instances=len(serialized),
        **tally,
        seconds=time.perf_counter() - started,
        cpu_seconds=time.process_time() - started_cpu,
    )
    return counts, serialized


def write_group(output_dir: str, group_index: int, counts: dict, serialized: list[bytes]) -> None:
    if not serialized:
        return
    # The sidecar goes first: a shard under its final name always has its counts next to it.
    write_json_atomic(os.path.join(output_dir, part_name(group_index, "json")), counts)
    records_lib.write_records(os.path.join(output_dir, part_name(group_index)), serialized)


# --- driver side ----------------------------------------------------------------------------------


def document_groups(
    documents: Iterator[list[str]], documents_per_shard: int
) -> Iterator[tuple[int, list[list[str]]]]:
    """Consecutive groups; a trailing group of a single document joins the previous group.

    One full group is held back until the next document arrives so that the merge decision can
    be made; every machine makes the same decision because every machine reads the same stream.
    """
    pending: list[list[str]] | None = None
    current: list[list[str]] = []
    index = 0
    for document in documents:
        current.append(document)
        if len(current) == documents_per_shard:
            if pending is not None:
                yield index, pending
                index += 1
            pending, current = current, []
    if pending is not None:
        if len(current) == 1:
            pending.extend(current)
            current = []
        yield index, pending
        index += 1
    if current:
        yield index, current


def existing_parts(output_dir: str) -> dict[int, set[str]]:
    parts: dict[int, set[str]] = {}
    for name in fs.listdir(output_dir):
        match = _PART_RE.match(name)
        if match:
            parts.setdefault(int(match.group(1)), set()).add(match.group(2))
    return parts
