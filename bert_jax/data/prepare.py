"""``bert-jax data prepare``: corpus -> masked sentence pairs -> TFRecord shards, in parallel.

Public API::

    prepare_records(sources, tokenizer, output_dir, *, max_seq_length=128,
                    max_predictions_per_seq=20, masked_lm_prob=0.15, short_seq_prob=0.1,
                    dupe_factor=1, seed=12345, whole_word_mask=False, num_workers=1,
                    shard_index=0, num_shards=1, documents_per_shard=1000, ...) -> PrepareResult

How it scales. Documents are streamed from the sources and cut into consecutive groups of
``documents_per_shard`` documents (a final group of one document joins the group before it).
Group ``g`` becomes the output file ``part-{g:05d}.tfrecord``: a worker process (without
TensorFlow) tokenizes its documents, makes ``dupe_factor`` passes of masked instances (random next
sentences are drawn from the other documents of the same group), shuffles and serializes them;
the driver writes the file. Memory is therefore bounded by the group size times the groups in
flight (two per worker), never by the corpus. Group ``g`` is seeded by
``(seed, g)`` alone, so the output is byte-identical whatever ``num_workers`` is and however the
work is split across machines: machine ``shard_index`` of ``num_shards`` writes the groups with
``g % num_shards == shard_index`` (every machine streams the whole input, which is cheap next to
tokenization and masking).

Nothing already written is lost: each shard is written under a hidden temporary name and renamed
when complete, next to a small ``part-{g:05d}.json`` with its counts. A re-run with the same
settings skips finished groups (resuming an interrupted job); different settings in the same
output directory are refused unless ``overwrite=True``, which rewrites this machine's groups. The
settings are recorded in ``prepare_config.json``, the tokenizer is saved in ``tokenizer/`` (so the
pipeline can re-mask dynamically), and a summary goes to
``stats-{shard_index}-of-{num_shards}.json``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import multiprocessing
import os
import re
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from bert_jax.data import corpus as corpus_lib
from bert_jax.data import pretraining
from bert_jax.data.files import write_json_atomic
from bert_jax.data.tokenizer import Tokenizer, load_tokenizer

logger = logging.getLogger(__name__)

CONFIG_FILE = "prepare_config.json"
TOKENIZER_SUBDIR = "tokenizer"
FORMAT_VERSION = 1
_PART_RE = re.compile(r"^part-(\d{5,})\.(tfrecord|json)$")

# Settings that change the bytes written; a resumed run must agree on all of them.
_OUTPUT_SETTINGS = (
    "format_version",
    "max_seq_length",
    "max_predictions_per_seq",
    "masked_lm_prob",
    "short_seq_prob",
    "dupe_factor",
    "seed",
    "whole_word_mask",
    "documents_per_shard",
    "sentence_split",
    "text_field",
    "tokenizer_fingerprint",
    "sources",
)


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


@dataclass
class PrepareResult:
    output_dir: str
    files: list[str]
    groups_written: int
    groups_skipped: int
    corpus_stats: corpus_lib.CorpusStats
    instance_stats: InstanceStats
    wall_seconds: float
    settings: dict = field(default_factory=dict)

    @property
    def instances_per_worker_second(self) -> float:
        """Instances per worker CPU second (tokenize + pair + mask + serialize)."""
        if self.instance_stats.cpu_seconds <= 0:
            return 0.0
        return self.instance_stats.instances / self.instance_stats.cpu_seconds

    def summary(self) -> str:
        s = self.instance_stats
        random_share = s.random_next / s.instances if s.instances else 0.0
        forced_share = s.forced_random_next / s.instances if s.instances else 0.0
        return (
            f"wrote {self.groups_written} shard(s), skipped {self.groups_skipped} finished "
            f"shard(s) in {self.output_dir}: {s.instances} instances from {s.documents} documents "
            f"(random next {random_share:.1%}, forced {forced_share:.1%}); "
            f"{self.instances_per_worker_second:.0f} instances/s per worker, "
            f"{self.wall_seconds:.1f}s wall. Input: {self.corpus_stats.summary()}"
        )


def _check_settings(
    max_seq_length: int,
    max_predictions_per_seq: int,
    masked_lm_prob: float,
    short_seq_prob: float,
    dupe_factor: int,
    num_workers: int,
    shard_index: int,
    num_shards: int,
    documents_per_shard: int,
) -> None:
    problems = []
    if max_seq_length < 5:
        problems.append(f"--max-seq-length {max_seq_length} must be at least 5")
    if not 1 <= max_predictions_per_seq <= max_seq_length:
        problems.append(
            f"--max-predictions-per-seq {max_predictions_per_seq} must be in [1, "
            f"--max-seq-length {max_seq_length}]"
        )
    if not 0.0 < masked_lm_prob < 1.0:
        problems.append(f"--masked-lm-prob {masked_lm_prob} must be in (0, 1)")
    if not 0.0 <= short_seq_prob <= 1.0:
        problems.append(f"--short-seq-prob {short_seq_prob} must be in [0, 1]")
    if dupe_factor < 1:
        problems.append(f"--dupe-factor {dupe_factor} must be at least 1")
    if num_workers < 1:
        problems.append(f"--num-workers {num_workers} must be at least 1")
    if num_shards < 1 or not 0 <= shard_index < num_shards:
        problems.append(
            f"--shard-index {shard_index} must be in [0, --num-shards {num_shards}) and "
            "--num-shards at least 1"
        )
    if documents_per_shard < 2:
        problems.append(f"--documents-per-shard {documents_per_shard} must be at least 2")
    if problems:
        raise ValueError("invalid data prepare settings: " + "; ".join(problems))


def _group_seed(seed: int, group_index: int) -> int:
    return int(np.random.SeedSequence([seed, group_index]).generate_state(1, np.uint64)[0])


def part_name(group_index: int, suffix: str = "tfrecord") -> str:
    return f"part-{group_index:05d}.{suffix}"


# --- worker side ------------------------------------------------------------------------------

_WORKER_TOKENIZER: Tokenizer | None = None


def _init_worker(tokenizer: Tokenizer) -> None:
    global _WORKER_TOKENIZER
    _WORKER_TOKENIZER = tokenizer


def _process_group(
    group_index: int, documents: list[list[str]], settings: dict
) -> tuple[dict, list[bytes]]:
    """Tokenize, pair, mask and serialize one group; returns its counts and its records.

    Runs in a worker without TensorFlow; the driver writes the records.
    """
    from bert_jax.data import records

    started, started_cpu = time.perf_counter(), time.process_time()
    tokenizer = _WORKER_TOKENIZER
    assert tokenizer is not None, "worker not initialised"
    tokenized = pretraining.tokenize_documents(documents, tokenizer)
    counts = {"groups": 1, "documents": len(tokenized)}
    if len(tokenized) < 2:
        logger.warning(
            "group %d: fewer than two documents left after tokenization; nothing written",
            group_index,
        )
        counts["seconds"] = time.perf_counter() - started
        counts["cpu_seconds"] = time.process_time() - started_cpu
        return counts, []
    masking = pretraining.MaskingConfig.from_tokenizer(
        tokenizer,
        settings["masked_lm_prob"],
        settings["max_predictions_per_seq"],
        settings["whole_word_mask"],
    )
    instances = pretraining.create_instances(
        tokenized,
        masking,
        max_seq_length=settings["max_seq_length"],
        short_seq_prob=settings["short_seq_prob"],
        dupe_factor=settings["dupe_factor"],
        seed=_group_seed(settings["seed"], group_index),
    )
    arrays = pretraining.instances_to_arrays(
        instances, settings["max_seq_length"], settings["max_predictions_per_seq"]
    )
    serialized = records.serialize_arrays(arrays)
    counts.update(
        instances=len(instances),
        random_next=sum(i.is_random_next for i in instances),
        forced_random_next=sum(i.forced_random_next for i in instances),
        short_target_instances=sum(i.is_short_target for i in instances),
        tokens=int(arrays["input_mask"].sum()),
        masked_lm_predictions=int(arrays["masked_lm_weights"].sum()),
        seconds=time.perf_counter() - started,
        cpu_seconds=time.process_time() - started_cpu,
    )
    return counts, serialized


def _write_group(output_dir: str, group_index: int, counts: dict, serialized: list[bytes]) -> None:
    from bert_jax.data import records

    if not serialized:
        return
    # The sidecar goes first: a shard under its final name always has its counts next to it.
    write_json_atomic(os.path.join(output_dir, part_name(group_index, "json")), counts)
    records.write_records(os.path.join(output_dir, part_name(group_index)), serialized)


# --- driver side ------------------------------------------------------------------------------


def _document_groups(
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


def _existing_parts(output_dir: str) -> dict[int, set[str]]:
    parts: dict[int, set[str]] = {}
    for name in os.listdir(output_dir):
        match = _PART_RE.match(name)
        if match:
            parts.setdefault(int(match.group(1)), set()).add(match.group(2))
    return parts


def prepare_records(
    sources: Sequence[str | os.PathLike] | str,
    tokenizer: Tokenizer | str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    max_seq_length: int = 128,
    max_predictions_per_seq: int = 20,
    masked_lm_prob: float = 0.15,
    short_seq_prob: float = 0.1,
    dupe_factor: int = 1,
    seed: int = 12345,
    whole_word_mask: bool = False,
    num_workers: int = 1,
    shard_index: int = 0,
    num_shards: int = 1,
    documents_per_shard: int = 1000,
    tfds_data_dir: str | None = None,
    text_field: str = "text",
    sentence_split: bool = False,
    max_line_bytes: int = corpus_lib.DEFAULT_MAX_LINE_BYTES,
    strict: bool = False,
    overwrite: bool = False,
) -> PrepareResult:
    """Write masked pretraining instances from ``sources`` as TFRecord shards (module docstring).

    ``tokenizer`` is a ``Tokenizer`` or anything ``load_tokenizer`` accepts. Returns counts of
    the input (``corpus_stats``) and of the instances written by this call (``instance_stats``).
    """
    started = time.perf_counter()
    _check_settings(
        max_seq_length,
        max_predictions_per_seq,
        masked_lm_prob,
        short_seq_prob,
        dupe_factor,
        num_workers,
        shard_index,
        num_shards,
        documents_per_shard,
    )
    if not isinstance(tokenizer, Tokenizer):
        tokenizer = load_tokenizer(tokenizer)
    # Resolve inputs before touching the output directory: a typo must not leave debris.
    sources = corpus_lib.expand_sources(
        [sources] if isinstance(sources, (str, os.PathLike)) else sources
    )
    output_dir = os.path.abspath(os.fspath(output_dir))
    os.makedirs(output_dir, exist_ok=True)
    settings = {
        "format_version": FORMAT_VERSION,
        "max_seq_length": max_seq_length,
        "max_predictions_per_seq": max_predictions_per_seq,
        "masked_lm_prob": masked_lm_prob,
        "short_seq_prob": short_seq_prob,
        "dupe_factor": dupe_factor,
        "seed": seed,
        "whole_word_mask": whole_word_mask,
        "documents_per_shard": documents_per_shard,
        "sentence_split": sentence_split,
        "text_field": text_field,
        "tokenizer_fingerprint": tokenizer.fingerprint(),
        "vocab_size": tokenizer.vocab_size,
        "sources": [
            s
            if s.startswith(corpus_lib.TFDS_PREFIX) or s.startswith(corpus_lib.EMBEDDED)
            else os.path.basename(s)
            for s in sources
        ],
    }
    config_path = os.path.join(output_dir, CONFIG_FILE)
    if os.path.exists(config_path):
        with open(config_path, encoding="utf-8") as f:
            previous = json.load(f)
        changed = [
            f"{key}: {previous.get(key)!r} -> {settings[key]!r}"
            for key in _OUTPUT_SETTINGS
            if previous.get(key) != settings[key]
        ]
        if changed and not overwrite:
            raise ValueError(
                f"{output_dir} already holds data prepared with different settings "
                f"({'; '.join(changed)}); choose a new --output directory or pass --overwrite"
            )
    existing = _existing_parts(output_dir)
    if overwrite:
        for group_index, suffixes in existing.items():
            if group_index % num_shards == shard_index:
                for suffix in suffixes:
                    os.remove(os.path.join(output_dir, part_name(group_index, suffix)))
        existing = _existing_parts(output_dir)
    write_json_atomic(config_path, settings)
    tokenizer_dir = os.path.join(output_dir, TOKENIZER_SUBDIR)
    if not os.path.exists(os.path.join(tokenizer_dir, "bert_jax_tokenizer.json")) or overwrite:
        tokenizer.save(tokenizer_dir)

    corpus_stats = corpus_lib.CorpusStats()
    documents = corpus_lib.iter_documents(
        sources,
        corpus_stats,
        tfds_data_dir=tfds_data_dir,
        text_field=text_field,
        max_line_bytes=max_line_bytes,
        strict=strict,
        sentence_split=sentence_split,
    )
    instance_stats = InstanceStats()
    files: list[str] = []
    groups_written = groups_skipped = 0

    def finished(group_index: int, counts: dict, serialized: list[bytes]) -> None:
        nonlocal groups_written
        _write_group(output_dir, group_index, counts, serialized)
        instance_stats.add(counts)
        if counts.get("instances"):
            files.append(os.path.join(output_dir, part_name(group_index)))
            groups_written += 1
        logger.info("group %d: %d instances", group_index, counts.get("instances", 0))

    total_groups = 0
    mine = (
        (g, docs)
        for g, docs in _document_groups(documents, documents_per_shard)
        if g % num_shards == shard_index
    )
    if num_workers == 1:
        _init_worker(tokenizer)
        for group_index, group in mine:
            total_groups += 1
            if "tfrecord" in existing.get(group_index, ()):
                groups_skipped += 1
                files.append(os.path.join(output_dir, part_name(group_index)))
                continue
            finished(group_index, *_process_group(group_index, group, settings))
    else:
        # spawn, not fork: the parent may already hold TensorFlow or JAX threads. Workers do the
        # CPU-heavy part (tokenize, pair, mask, serialize) without TensorFlow; this process
        # writes, which costs a few microseconds per record.
        context = multiprocessing.get_context("spawn")
        with context.Pool(num_workers, initializer=_init_worker, initargs=(tokenizer,)) as pool:
            in_flight: deque = deque()
            for group_index, group in mine:
                total_groups += 1
                if "tfrecord" in existing.get(group_index, ()):
                    groups_skipped += 1
                    files.append(os.path.join(output_dir, part_name(group_index)))
                    continue
                in_flight.append(
                    (
                        group_index,
                        pool.apply_async(_process_group, (group_index, group, settings)),
                    )
                )
                # Bounded look-ahead keeps memory at a few groups per worker.
                while len(in_flight) >= 2 * num_workers:
                    index, result = in_flight.popleft()
                    finished(index, *result.get())
            while in_flight:
                index, result = in_flight.popleft()
                finished(index, *result.get())

    if corpus_stats.documents < 2:
        raise ValueError(
            f"inputs {', '.join(sources)} hold {corpus_stats.documents} usable document(s); "
            f"sentence pairs need at least two ({corpus_stats.summary()})"
        )
    if total_groups == 0 and num_shards > 1:
        logger.warning(
            "shard %d of %d received no document groups: the input has fewer groups than shards",
            shard_index,
            num_shards,
        )
    result = PrepareResult(
        output_dir=output_dir,
        files=sorted(files),
        groups_written=groups_written,
        groups_skipped=groups_skipped,
        corpus_stats=corpus_stats,
        instance_stats=instance_stats,
        wall_seconds=time.perf_counter() - started,
        settings=settings,
    )
    write_json_atomic(
        os.path.join(output_dir, f"stats-{shard_index}-of-{num_shards}.json"),
        {
            "corpus": corpus_stats.as_dict(),
            "instances": dataclasses.asdict(instance_stats),
            "groups_written": groups_written,
            "groups_skipped": groups_skipped,
            "wall_seconds": result.wall_seconds,
            "instances_per_worker_second": result.instances_per_worker_second,
            "num_workers": num_workers,
        },
    )
    return result
