"""``bert-jax data prepare``: corpus -> masked sentence pairs -> TFRecord shards, in parallel.

Public API::

    prepare_records(sources, tokenizer, output_dir, settings) -> PrepareResult
    prepare_cached(sources, tokenizer, settings, cache_dir=None) -> list of record files

``PrepareSettings`` (``settings.py``) declares every setting of ``bert-jax data prepare``.
``prepare_cached`` is preparation for a pretraining run given a raw corpus: the records go to a
directory of ``cache_dir`` named by a hash of the settings, and a finished preparation is reused.

How it scales. The inputs are cut into splits (``splits.cut_splits``: Wikipedia multistream
dumps by bz2 stream range, Parquet by row group, text and JSONL by byte range cut at a document
boundary) and every split is read once. Each document goes to group ``g = group_of(seed, key) %
num_groups`` by a hash of its key (its source and position, whatever split it was read in;
``groups.py``), so every group is a random sample of the whole corpus and random next sentences
come from across it. ``num_groups`` is ``--num-groups`` or one per ``--group-bytes`` of input
(8 MiB by default), fixed before anything is read and recorded in ``prepare_config.json``.
Group ``g`` becomes ``part-{g:05d}.tfrecord``: its documents in key order are tokenized, made
into ``dupe_factor`` passes of masked instances, shuffled and serialized, seeded by ``(seed, g)``
alone. The local path is a map (splits read in ``num_workers`` processes, documents spilled by
group to a hidden folder of the output) and a reduce (groups made into shards by the same
workers, written by this process); the Apache Beam pipeline (``beam_pipeline.py``) runs the same
functions on a runner's workers. Either way the bytes are the same, whatever ``num_workers`` is
or whichever engine runs it. Memory per worker is bounded by a split and by a group, never by
the corpus. Past one machine, the Beam pipeline is the one way (a runner such as Dataflow spreads
the splits and groups over its workers); the flags of an earlier scheme of several machines
(``--shard-index``, ``--num-shards``, ``--merge``) are refused, and directories it merged still
read (``manifest.require_complete``).

A share of the documents (``heldout_share``) is held out by a hash of their key into the records
directory ``heldout/`` (``layout.heldout_dir``): the same files, manifest and completion mark as
the training records, so every reader reads it unchanged (``groups.Heldout``).

Nothing already written is lost: each shard is written under a hidden temporary name and renamed
when complete, next to a small ``part-{g:05d}.json`` with its counts. A re-run with the same
settings skips finished groups (resuming an interrupted job); different settings in the same
output directory are refused unless ``overwrite=True``, which rewrites the groups (the old
shards are set aside in a hidden folder, removed once the new ones are complete). The settings
are recorded in ``prepare_config.json`` (``manifest.Manifest``: built, checked against the
directory's and written once per run), the tokenizer is saved in ``tokenizer/`` (so the pipeline
can re-mask dynamically), and a summary goes to ``stats-0-of-1.json``
(``manifest.COMPLETION_MARK``), written last.

Why this file is long: one run of the stage (settings, the output opened for it, the groups in
flight, the held-out records, the completion marks) and a pretraining run's cached preparation
read as one story; the work itself lives in ``groups``, the manifest's checks in ``manifest``.
``check_run``, ``start_run`` and ``finish_run`` are the steps that the Beam pipeline shares.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import logging
import math
import multiprocessing
import os
import pickle
import re
import shutil
import socket
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from bert_jax.data.layout import (
    TOKENIZER_SUBDIR,
    heldout_dir,
)
from bert_jax.data.preparation import groups as groups_lib
from bert_jax.data.preparation.groups import InstanceStats, part_name
from bert_jax.data.preparation.settings import PrepareSettings
from bert_jax.data.records import manifest
from bert_jax.data.records import tfrecord as records_lib
from bert_jax.data.sources import documents as sources_lib
from bert_jax.data.sources import splits as splits_lib
from bert_jax.data.tokenizers.interface import Tokenizer
from bert_jax.data.tokenizers.load_or_train import load_tokenizer
from bert_jax.runtime import fs
from bert_jax.runtime.errors import UserError, user_path
from bert_jax.runtime.outputs import write_json_atomic

logger = logging.getLogger(__name__)

# The records' format (manifest.FORMAT_KEY): 2 = documents grouped by a hash of their key
# (groups.group_of) into ``num_groups`` groups; 1 = consecutive groups of documents_per_shard
# documents. Records of another format are refused on resume and merge (manifest.check_format).
FORMAT_VERSION = 2
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


@dataclass
class PrepareResult:
    output_dir: str
    files: list[str]
    groups_written: int
    groups_skipped: int
    corpus_stats: sources_lib.CorpusStats
    instance_stats: InstanceStats
    wall_seconds: float
    settings: dict = field(default_factory=dict)
    num_workers: int = 0  # the local path's processes (0: a runner's, not known here)
    # The held-out records (``heldout/``; None: none, or none asked for: ``heldout_stats`` None)
    # and what went into them.
    heldout_dir: str | None = None
    heldout_stats: InstanceStats | None = None

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
        pairs = f"random next {random_share:.1%}, forced {forced_share:.1%}"
        instance_format = self.settings.get("instance_format", "sentence_pairs")
        if instance_format != "sentence_pairs":  # no next sentence to be random
            pairs = f"{instance_format}, {self.settings.get('objective', 'mlm')}"
        return (
            f"wrote {self.groups_written} shard(s), skipped {self.groups_skipped} finished "
            f"shard(s) in {self.output_dir}: {s.instances} instances from {s.documents} documents "
            f"({pairs}); {self._rates()}.{self._heldout_summary()} "
            f"Input: {self.corpus_stats.summary()}"
        )

    def _rates(self) -> str:
        """Two rates that add up: instances over the wall time of the whole run (reading
        included), and over the CPU time the workers spent making them."""
        s, wall = self.instance_stats, max(self.wall_seconds, 1e-9)
        workers = f", {self.num_workers} worker(s)" if self.num_workers else ""
        rates = f"{s.instances / wall:.0f} instances/s over {self.wall_seconds:.1f}s wall{workers}"
        if s.cpu_seconds > 0:
            rates += (
                f"; making them (tokenize, pair, mask, serialize) took {s.cpu_seconds:.3g} "
                f"worker CPU-s, {self.instances_per_worker_second:.0f} instances per CPU-second"
            )
        return rates

    def _heldout_summary(self) -> str:
        if self.heldout_stats is None:
            return ""
        held = self.heldout_stats
        if self.heldout_dir is None:
            return " Held out no documents (too few for a share of them: --heldout-share)."
        if not held.instances:
            return f" Held-out records: {self.heldout_dir}, finished before."
        return (
            f" Held out {held.documents} documents ({held.instances} instances, from "
            f"{held.groups} group(s)) in {self.heldout_dir}."
        )


def _recorded_settings(
    settings: PrepareSettings, tokenizer: Tokenizer, sources: list[str], num_groups: int
) -> dict:
    """What ``prepare_config.json`` holds: the settings that shape the records (their
    declarations say so: ``PrepareSettings.recorded``), and what the run derived from its
    inputs (``settings.DERIVED``)."""
    return {
        "format_version": FORMAT_VERSION,
        "num_groups": num_groups,
        **settings.recorded(),
        "text_extraction": sources_lib.TEXT_EXTRACTION_VERSION,
        "tokenizer_fingerprint": tokenizer.fingerprint(),
        "vocab_size": tokenizer.vocab_size,
        "sources": [
            s if sources_lib.source_kind(s) in ("tfds", "embedded") else os.path.basename(s)
            for s in sources
        ],
    }


# Where ``--overwrite`` sets the old shards aside (the name of earlier versions' one machine).
_ASIDE = ".old-parts-0-of-1"


def _set_aside_parts(output_dir: str, existing: dict[int, set[str]]) -> None:
    """``--overwrite``: moves the old shards into a hidden folder (no reader or resumed run sees
    them; ``_drop_set_aside`` removes it once the new shards are complete)."""
    aside = os.path.join(output_dir, _ASIDE)
    for group, suffixes in existing.items():
        fs.makedirs(aside, exist_ok=True)
        for suffix in sorted(suffixes):
            name = part_name(group, suffix)
            fs.rename(os.path.join(output_dir, name), os.path.join(aside, name))


def _drop_set_aside(output_dir: str) -> None:
    """After a complete run: the old shards (``_set_aside_parts``) are removed."""
    fs.rmtree(os.path.join(output_dir, _ASIDE), True)


def _start_stage(
    output_dir: str, wanted: manifest.Manifest, settings: PrepareSettings, tokenizer: Tokenizer
) -> dict[int, set[str]]:
    """Open ``output_dir`` for a run (checked by ``manifest.check_resumable``): its completion
    marks removed, the manifest written, the tokenizer saved.

    Returns the parts already there (``groups.existing_parts``) to keep: none with ``overwrite``.
    """
    fs.makedirs(output_dir, exist_ok=True)
    # Until the completion mark is written again, readers refuse the directory. The marks of an
    # earlier version's several machines (stats-I-of-N.json) go too: the run rewrites them as one.
    names = fs.listdir(output_dir) if fs.isdir(output_dir) else []
    for count, indices in manifest.completion_marks(names).items():
        for index in indices:
            fs.remove(os.path.join(output_dir, manifest.stats_name(index, count)))
    existing = groups_lib.existing_parts(output_dir)
    if settings.overwrite:  # the old shards: set aside, removed once all are new
        _set_aside_parts(output_dir, existing)
        existing = {}
    manifest.write(output_dir, wanted)
    tokenizer_dir = os.path.join(output_dir, TOKENIZER_SUBDIR)
    saved = fs.exists(os.path.join(tokenizer_dir, "bert_jax_tokenizer.json"))
    if not saved or settings.overwrite:
        tokenizer.save(tokenizer_dir)
    return existing


def _size(count: int) -> str:
    return f"{count / 2**20:.1f} MiB" if count >= 2**20 else f"{count / 2**10:.1f} KiB"


class _Rate:
    """Progress lines with a rate and an ETA: one per ``every`` items or ~10 s, whichever first
    (a line per item floods a log; a terminal wants to see it move)."""

    def __init__(self, what: str, total: int, every: int = 100, seconds: float = 10.0):
        self.what, self.total, self.every, self.seconds = what, total, every, seconds
        self.started = self.last = time.perf_counter()
        self.done = self.last_done = 0

    def tick(self, count: int = 1) -> None:
        self.done += count
        now = time.perf_counter()
        if (
            self.done == self.total
            or self.done - self.last_done >= self.every
            or (now - self.last >= self.seconds)
        ):
            self.last, self.last_done = now, self.done
            rate = self.done / max(now - self.started, 1e-9)
            eta = (self.total - self.done) / rate if rate > 0 else float("inf")
            logger.info(
                "%s %d/%d (%.1f/s, ETA %s)", self.what, self.done, self.total, rate, _eta(eta)
            )


def _eta(seconds: float) -> str:
    if seconds == float("inf"):
        return "unknown"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


class _Progress:
    """The driver's tally: groups finished, skipped (already written) and their record files."""

    def __init__(self, output_dir: str, output_what: str):
        self.output_dir, self.output_what = output_dir, output_what
        self.instance_stats = InstanceStats()
        self.files: list[str] = []
        self.parts: list[int] = []  # the groups whose record file this run wrote or kept
        self.groups_written = 0
        self.groups_skipped = 0
        self.rate: _Rate | None = None

    def _disk_full(self, err: OSError, group_index: int, serialized: list[bytes]) -> UserError:
        """One line: where, how much the shard needs and what is free, what is kept."""
        if err.errno == errno.EDQUOT:
            room = "the disk quota is exceeded"
        elif fs.is_remote(self.output_dir):
            room = "a bucket's free space is not known"
        else:
            room = f"{_size(shutil.disk_usage(self.output_dir).free)} are free"
        return UserError(
            f"no space left on device writing {part_name(group_index)} in {self.output_what} "
            f"{self.output_dir}: the shard takes about "
            f"{_size(records_lib.records_bytes(serialized))}, {room}; the "
            f"{self.groups_written + self.groups_skipped} shard(s) finished are kept, nothing "
            "half-written is left: free some space and run the same command again to resume"
        )

    def skip(self, group_index: int) -> None:
        self.groups_skipped += 1
        self.files.append(os.path.join(self.output_dir, part_name(group_index)))
        self.parts.append(group_index)

    def finished(self, group_index: int, counts: dict, serialized: list[bytes]) -> None:
        with user_path(self.output_dir, self.output_what, writing=True):  # permissions, say
            try:
                groups_lib.write_group(self.output_dir, group_index, counts, serialized)
            except OSError as err:
                if err.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                raise self._disk_full(err, group_index, serialized) from None
        self.instance_stats.add(counts)
        if counts.get("instances"):
            self.files.append(os.path.join(self.output_dir, part_name(group_index)))
            self.parts.append(group_index)
            self.groups_written += 1
        logger.debug("group %d: %d instances", group_index, counts.get("instances", 0))
        if self.rate is not None:
            self.rate.tick()


@dataclass
class HeldoutRun:
    """The held-out records of a run: which documents (``rule``) and the records directory of
    their own (``layout.heldout_dir``) with its manifest: the run's, but for its groups."""

    rule: groups_lib.Heldout
    output_dir: str
    recorded: dict
    wanted: manifest.Manifest


@dataclass
class CheckedRun:
    """A run of ``data prepare`` checked and laid out, before anything is written; the local path
    and the Beam pipeline (``beam_pipeline.py``) both start from it."""

    sources: list[str]
    splits: list
    num_groups: int
    recorded: dict  # what prepare_config.json holds
    wanted: manifest.Manifest
    output_dir: str
    output_what: str
    reader_options: dict
    tokenizer: Tokenizer
    heldout: HeldoutRun | None = None

    def input_bytes(self) -> int:
        return sum(splits_lib.split_bytes(split) for split in self.splits)


def check_run(
    sources: Sequence[str | os.PathLike] | str,
    tokenizer: Tokenizer | str | os.PathLike,
    output_dir: str | os.PathLike,
    settings: PrepareSettings,
    output_what: str = "--output",
) -> CheckedRun:
    """Checks the settings, the inputs (text, UTF-8) and the output directory (a records
    directory this run may resume or, with ``overwrite``, replace), and cuts the inputs into
    splits and the documents into groups; writes nothing."""
    settings.check()
    if settings.documents_per_shard and not settings.num_groups:
        logger.warning(
            "--documents-per-shard no longer sets the size of a group (documents go to groups by "
            "a hash of their key): give --num-groups or --group-bytes; ignored"
        )
    if not isinstance(tokenizer, Tokenizer):
        tokenizer = load_tokenizer(tokenizer)
    # Resolve inputs before touching the output directory: a typo must not leave debris.
    sources = sources_lib.expand_sources(
        [sources] if isinstance(sources, (str, os.PathLike)) else sources
    )
    inputs = manifest.input_identity(sources)  # refuses binary / non-UTF-8 files, writes nothing
    reader_options = {
        "tfds_data_dir": settings.tfds_data_dir,
        "text_field": settings.text_field,
        "max_line_bytes": settings.max_line_bytes,
        "strict": settings.strict,
        "sentence_split": settings.sentence_split,
        "splitter_name": settings.splitter,
    }
    logger.info(
        "cutting %d input(s) into splits of about %s", len(sources), _size(settings.split_bytes)
    )
    splits = splits_lib.cut_splits(sources, target_bytes=settings.split_bytes, **reader_options)
    num_groups = settings.num_groups or groups_lib.derive_num_groups(
        sum(_input_bytes(split, settings.tfds_data_dir) for split in splits), settings.group_bytes
    )
    size = sum(splits_lib.split_bytes(split) for split in splits)
    logger.info(
        "%d split(s)%s into %d group(s) (a shard each)",
        len(splits),
        f" of {_size(size)}" if size else "",
        num_groups,
    )
    output_dir = fs.abspath(os.fspath(output_dir))
    recorded = _recorded_settings(settings, tokenizer, sources, num_groups)
    wanted = manifest.Manifest(recorded, tuple(inputs))
    manifest.check_output_dir(output_dir, settings.overwrite)
    manifest.check_resumable(manifest.read(output_dir), wanted, output_dir, settings.overwrite)
    heldout = None
    if recorded["heldout_share"] > 0:
        rule = groups_lib.Heldout(
            recorded["heldout_share"],
            max(1, math.ceil(num_groups * recorded["heldout_share"])),
            settings.seed,
        )
        held_recorded = {**recorded, "num_groups": rule.num_groups, "heldout": True}
        held_wanted = manifest.Manifest(held_recorded, tuple(inputs))
        held_dir = heldout_dir(output_dir)
        manifest.check_resumable(manifest.read(held_dir), held_wanted, held_dir, settings.overwrite)
        heldout = HeldoutRun(rule, held_dir, held_recorded, held_wanted)
    return CheckedRun(
        sources,
        splits,
        num_groups,
        recorded,
        wanted,
        output_dir,
        output_what,
        reader_options,
        tokenizer,
        heldout,
    )


def _input_bytes(split, tfds_data_dir: str | None) -> int:
    """What ``--group-bytes`` counts of a split: its bytes on storage, or for a TFDS split the
    size its dataset info records (a whole Wikipedia in one group would not fit a worker). The
    embedded corpus (a few MiB) counts 0: one group."""
    size = splits_lib.split_bytes(split)
    if size or split.kind != "tfds":
        return size
    import tensorflow_datasets as tfds

    name, split_name = sources_lib.parse_tfds_source(split.source)
    try:
        return int(tfds.builder(name, data_dir=tfds_data_dir).info.splits[split_name].num_bytes)
    except Exception:  # unknown or unprepared: reading the split says so, in one line
        return 0


def describe_run(checked: CheckedRun) -> str:
    """What ``--dry-run`` prints: the splits and the groups; nothing is read past the cutting."""
    lines = [
        f"{len(checked.splits)} split(s) of {len(checked.sources)} input(s), "
        f"{checked.input_bytes()} bytes, into {checked.num_groups} group(s) (a shard each) in "
        f"{checked.output_dir}"
    ]
    for split in checked.splits:
        stop = "end" if split.stop < 0 else split.stop
        lines.append(
            f"  {split.kind} {split.source} [{split.start}, {stop}): "
            f"{splits_lib.split_bytes(split)} bytes"
        )
    return "\n".join(lines)


def start_run(checked: CheckedRun, settings: PrepareSettings) -> dict[int, set[str]]:
    """Opens ``checked.output_dir`` for the run (``_start_stage``), and its held-out records
    directory (or removes the one an earlier run with held-out documents left); returns the
    training parts to keep (``finished_groups`` tells either directory's finished groups)."""
    with user_path(checked.output_dir, checked.output_what, writing=True):
        existing = _start_stage(checked.output_dir, checked.wanted, settings, checked.tokenizer)
        groups_lib.remove_stale_temporaries(checked.output_dir)
        held = checked.heldout
        if held is not None:
            _start_stage(held.output_dir, held.wanted, settings, checked.tokenizer)
            groups_lib.remove_stale_temporaries(held.output_dir)
        else:
            _drop_heldout(checked.output_dir)
    return existing


def _drop_heldout(output_dir: str) -> None:
    """The held-out records an earlier run wrote into ``output_dir`` (their documents are now in
    the training records): removed, only where ``heldout/`` is a records directory of ours."""
    held = heldout_dir(output_dir)
    if fs.isdir(held) and manifest.read(held) is not None:
        fs.rmtree(held, True)


def read_heldout(checked: CheckedRun) -> dict:
    """``PrepareResult``'s held-out fields from the completion mark of the held-out records (for
    a runner whose last step wrote it elsewhere); {} where none were asked for."""
    if checked.heldout is None:
        return {}
    path = os.path.join(checked.heldout.output_dir, manifest.COMPLETION_MARK)
    if not fs.exists(path):  # no held-out document: no heldout/
        return {"heldout_dir": None, "heldout_stats": InstanceStats()}
    with fs.open(path, encoding="utf-8") as f:
        counts = json.load(f)["instances"]
    return {"heldout_dir": checked.heldout.output_dir, "heldout_stats": InstanceStats(**counts)}


def finished_groups(directory: str) -> frozenset[int]:
    """The groups whose shard and counts are both in ``directory`` (after ``start_run``)."""
    return frozenset(
        g
        for g, suffixes in groups_lib.existing_parts(directory).items()
        if {"tfrecord", "json"} <= suffixes
    )


def check_enough_documents(
    checked: CheckedRun, corpus_stats: sources_lib.CorpusStats, held_out: int = 0
) -> None:
    """Sentence pairs need two documents, single sequences one, besides the ``held_out`` ones
    (InputError naming the inputs)."""
    if corpus_stats.documents - held_out < (
        2 if checked.recorded["instance_format"] == "sentence_pairs" else 1
    ):
        held = f", {held_out} of them held out (--heldout-share)" if held_out else ""
        raise manifest.InputError(
            f"inputs {', '.join(checked.sources)} hold {corpus_stats.documents} usable "
            f"document(s){held}; sentence pairs need at least two for training "
            f"({corpus_stats.summary()})"
        )


# --- the local path: map (splits -> spilled groups), then reduce (groups -> shards) -------------


def _spill_split(task: tuple) -> tuple[sources_lib.CorpusStats, dict, tuple]:
    """Map: one split's documents, by group, into the spill file ``path`` (pickled lists of
    ``(key, document)``, one after another); returns what was read, where each group lies (by
    ``(held_out, group)``) and the split's ``groups.Routing``."""
    split, path, seed, num_groups, keep, reader_options, heldout = task
    stats = sources_lib.CorpusStats()
    routing = groups_lib.Routing()
    by_group: dict[tuple[bool, int], list] = {}
    for held, group, keyed in groups_lib.route_documents(
        split, stats, seed, num_groups, reader_options, heldout, routing, keep
    ):
        by_group.setdefault((held, group), []).append(keyed)
    index = {}
    with open(path, "wb") as f:
        for where in sorted(by_group):
            blob = pickle.dumps(by_group[where], protocol=pickle.HIGHEST_PROTOCOL)
            index[where] = (f.tell(), len(blob))
            f.write(blob)
    return stats, index, routing.as_tuple()


def _reduce_group(
    group_index: int,
    pieces: list[tuple[str, int, int]],
    recorded: dict,
    dropped: frozenset = frozenset(),
    picked: tuple = (),
):
    """Reduce: one group's documents from the spill files, in key order, -> its records. Those
    ``dropped`` (keys the held-out floor took) are left out; ``picked``: ``(path, offset,
    length, key)``, one document each from another group's piece (the floor's, for held-out)."""
    keyed = []
    for path, offset, length in pieces:
        with open(path, "rb") as f:
            f.seek(offset)
            keyed.extend(item for item in pickle.loads(f.read(length)) if item[0] not in dropped)
    for path, offset, length, key in picked:
        with open(path, "rb") as f:
            f.seek(offset)
            keyed.extend(item for item in pickle.loads(f.read(length)) if item[0] == key)
    return groups_lib.process_group(group_index, groups_lib.sorted_documents(keyed), recorded)


_SPILL_RE = re.compile(r"^\.spill-\d+-of-\d+-(?P<host>.+)-(?P<pid>\d+)$")


def _spill_dir(checked: CheckedRun, settings: PrepareSettings) -> str:
    """Where the map phase spills documents: a hidden folder of a local output, named by this
    host and process (every host of a pretraining job may prepare one shared cache directory),
    removed when the run ends; a local temporary folder for a bucket. The folders that killed
    runs of this host left are removed first."""
    if fs.is_remote(checked.output_dir):
        return tempfile.mkdtemp(prefix="bert-jax-spill-")
    host = socket.gethostname()
    for name in os.listdir(checked.output_dir):
        match = _SPILL_RE.match(name)
        if match and match["host"] == host and not groups_lib.process_alive(int(match["pid"])):
            shutil.rmtree(os.path.join(checked.output_dir, name), ignore_errors=True)
    name = f".spill-0-of-1-{host}-{os.getpid()}"  # the name of earlier versions' one machine
    path = os.path.join(checked.output_dir, name)
    os.makedirs(path, exist_ok=True)
    return path


def _run_local(
    checked: CheckedRun,
    settings: PrepareSettings,
    todo: list[tuple[bool, int]],
    progress: dict[bool, _Progress],
    corpus_stats: sources_lib.CorpusStats,
) -> int:
    """Every split read once (map: documents spilled by group), then every group in ``todo``
    (``(held_out, group)``) made into its shard (reduce), in this process or in ``num_workers``
    workers; ``progress[held_out]`` writes it. Returns how many documents were held out."""
    spill = _spill_dir(checked, settings)
    held = checked.heldout
    train_todo = frozenset(g for h, g in todo if not h)
    held_todo = frozenset(g for h, g in todo if h)
    # A floor document comes from its training group's spill: all kept while held-out is to do.
    keep = (frozenset(range(checked.num_groups)) if held_todo else train_todo, held_todo)
    tasks = [
        (
            split,
            os.path.join(spill, f"split-{k:06d}.pkl"),
            settings.seed,
            checked.num_groups,
            keep,
            checked.reader_options,
            None if held is None else held.rule,
        )
        for k, split in enumerate(checked.splits)
    ]
    pool = None
    try:
        if settings.num_workers > 1:
            # spawn, not fork: the parent may already hold TensorFlow or JAX threads. Workers do
            # the CPU-heavy part (read, split, tokenize, pair, mask, serialize) without
            # TensorFlow; this process writes, which costs a few microseconds per record.
            pool = multiprocessing.get_context("spawn").Pool(
                settings.num_workers,
                initializer=groups_lib.init_worker,
                initargs=(checked.tokenizer,),
            )
            spilled = pool.imap(_spill_split, tasks)
        else:
            groups_lib.init_worker(checked.tokenizer)
            spilled = map(_spill_split, tasks)
        pieces: dict[tuple[bool, int], list[tuple[str, int, int]]] = {}
        routings, indexes = [], []
        logger.info(
            "reading %d split(s) with %d worker(s)%s",
            len(tasks),
            settings.num_workers,
            "" if held is None else f", holding out {held.rule.share:.1%} of the documents",
        )
        reading = _Rate("splits read", len(tasks), every=max(1, len(tasks) // 20))
        for task, (stats, index, routing) in zip(tasks, spilled):
            corpus_stats.merge(stats)  # in split order: the same counts and problems as ever
            for where, (offset, length) in index.items():
                pieces.setdefault(where, []).append((task[1], offset, length))
            routings.append(routing)
            indexes.append(index)
            reading.tick()
        # The floor's documents: out of their training group, into their held-out group.
        floor = groups_lib.floor_documents(routings, None if held is None else held.rule)
        dropped: dict[int, set] = {}
        picked: dict[int, list] = {}
        for task, index, (_, _, candidates) in zip(tasks, indexes, routings):
            for _, key, group in candidates:
                if tuple(key) in floor and (False, group) in index:
                    dropped.setdefault(group, set()).add(tuple(key))
                    offset, length = index[(False, group)]
                    picked.setdefault(floor[tuple(key)], []).append(
                        (task[1], offset, length, tuple(key))
                    )

        def reduce_task(where: tuple[bool, int]) -> tuple:
            in_heldout, group = where
            if in_heldout:
                return (group, pieces.get(where, []), held.recorded, frozenset(),
                        tuple(picked.get(group, ())))  # fmt: skip
            return group, pieces[where], checked.recorded, frozenset(dropped.get(group, ()))

        work = [w for w in todo if w in pieces or (w[0] and w[1] in picked)]
        rate = _Rate("groups written", len(work), every=max(1, len(work) // 20))
        for each in progress.values():
            each.rate = rate
        if pool is None:
            for where in work:
                progress[where[0]].finished(where[1], *_reduce_group(*reduce_task(where)))
        else:
            in_flight: deque = deque()
            for where in work:
                in_flight.append((where, pool.apply_async(_reduce_group, reduce_task(where))))
                # Bounded look-ahead keeps memory at a few groups per worker.
                while len(in_flight) >= 2 * settings.num_workers:
                    (in_heldout, group), result = in_flight.popleft()
                    progress[in_heldout].finished(group, *result.get())
            while in_flight:
                (in_heldout, group), result = in_flight.popleft()
                progress[in_heldout].finished(group, *result.get())
        return sum(routing[1] for routing in routings) + len(floor)
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
        shutil.rmtree(spill, ignore_errors=True)


def prepare_records(
    sources: Sequence[str | os.PathLike] | str,
    tokenizer: Tokenizer | str | os.PathLike,
    output_dir: str | os.PathLike,
    settings: PrepareSettings,
    *,
    output_what: str = "--output",
) -> PrepareResult:
    """Write masked pretraining instances from ``sources`` as TFRecord shards (module docstring).

    ``tokenizer`` is a ``Tokenizer`` or anything ``load_tokenizer`` accepts. Returns counts of
    the input (``corpus_stats``) and of the instances written by this call (``instance_stats``).
    ``output_what`` is the flag or setting that named ``output_dir``, for a one-line user error
    where it cannot be written (permissions, a full disk).
    """
    started = time.perf_counter()
    checked = check_run(sources, tokenizer, output_dir, settings, output_what)
    created = not fs.exists(checked.output_dir)
    start_run(checked, settings)
    try:
        return _prepare_started(checked, settings, output_what, started)
    except UserError:  # an input refused as it was read, say: an output it started is removed
        if created and not finished_groups(checked.output_dir):  # no shard worth resuming
            fs.rmtree(checked.output_dir, True)
        raise


def _prepare_started(
    checked: CheckedRun, settings: PrepareSettings, output_what: str, started: float
) -> PrepareResult:
    """``prepare_records`` once its output is open (``start_run``)."""
    progress = {False: _Progress(checked.output_dir, output_what)}
    directories = [(False, checked.output_dir, range(checked.num_groups))]
    if checked.heldout is not None:
        progress[True] = _Progress(checked.heldout.output_dir, output_what)
        held_groups = range(checked.heldout.rule.num_groups)
        directories.append((True, checked.heldout.output_dir, held_groups))
    todo = []
    for in_heldout, directory, groups in directories:
        finished = finished_groups(directory)
        for group in groups:
            if group in finished:
                progress[in_heldout].skip(group)
            else:
                todo.append((in_heldout, group))
    corpus_stats = sources_lib.CorpusStats()
    held_out = _run_local(checked, settings, todo, progress, corpus_stats)
    check_enough_documents(checked, corpus_stats, held_out)
    trained = progress[False]
    result = PrepareResult(
        output_dir=checked.output_dir,
        files=sorted(trained.files),
        groups_written=trained.groups_written,
        groups_skipped=trained.groups_skipped,
        corpus_stats=corpus_stats,
        instance_stats=trained.instance_stats,
        wall_seconds=time.perf_counter() - started,
        settings=checked.recorded,
        num_workers=settings.num_workers,
    )
    held_parts = None
    if checked.heldout is not None:
        held_parts = progress[True].parts
        result.heldout_dir = checked.heldout.output_dir if held_parts else None
        result.heldout_stats = progress[True].instance_stats
    finish_run(result, settings, checked, trained.parts, heldout_parts=held_parts)
    return result


def finish_run(
    result: PrepareResult,
    settings: PrepareSettings,
    checked: CheckedRun,
    parts,
    everyone_done=False,
    heldout_parts=None,
) -> None:
    """The completion marks (``_write_stats``): the held-out records' (``heldout_parts``: the
    groups with a part there), then the run's, last; then the set-aside old shards go.
    ``everyone_done``: no writer of this job is left (Beam's last step), so every temporary
    name a killed writer left goes too. Held-out records with no document are removed: a
    ``heldout/`` is there only where it holds records."""
    held = checked.heldout
    if held is not None:
        with user_path(held.output_dir, checked.output_what, writing=True):
            groups_lib.remove_stale_temporaries(held.output_dir, everyone_done)
            if heldout_parts:
                _write_stats(held.output_dir, result, settings, heldout_parts, heldout=True)
                _drop_set_aside(held.output_dir)
            else:
                fs.rmtree(held.output_dir, True)
    with user_path(checked.output_dir, checked.output_what, writing=True):
        groups_lib.remove_stale_temporaries(checked.output_dir, everyone_done)
        _write_stats(checked.output_dir, result, settings, parts)
    _drop_set_aside(checked.output_dir)


def _write_stats(
    directory: str, result: PrepareResult, settings: PrepareSettings, parts, heldout=False
) -> None:
    """A records directory's completion mark (``manifest.COMPLETION_MARK``): its counts and the
    groups with a part; ``heldout``: the held-out records', whose input is the run's (``corpus``
    in the training records' mark)."""
    held = result.heldout_stats
    counts = {
        "parts": sorted(parts),
        "corpus": {} if heldout else result.corpus_stats.as_dict(),
        "instances": dataclasses.asdict(held if heldout else result.instance_stats),
        "groups_written": held.groups if heldout else result.groups_written,
        "groups_skipped": 0 if heldout else result.groups_skipped,
        "wall_seconds": result.wall_seconds,
        "instances_per_worker_second": result.instances_per_worker_second,
        "num_workers": settings.num_workers,
    }
    if held is not None and not heldout:
        counts["heldout"] = {"documents": held.documents, "instances": held.instances}
    write_json_atomic(os.path.join(directory, manifest.COMPLETION_MARK), counts)


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
    key_settings = {
        "items": items,
        # The inputs' content too: a changed corpus is prepared anew, never served stale.
        "inputs": manifest.input_identity(sources_lib.expand_sources(items)),
        "tokenizer": tokenizer.fingerprint(),
        "text_extraction": sources_lib.TEXT_EXTRACTION_VERSION,
        "format_version": FORMAT_VERSION,
        # What decides the groups' count before anything is read.
        "num_groups": settings.num_groups,
        "group_bytes": settings.group_bytes,
    }
    for name, value in settings.recorded().items():
        # A setting recorded later leaves the key of records made before it alone while it
        # has the value they were made with: a finished preparation is still found.
        if name in KEYED_FROM_THE_START or value != _BEFORE_KEYED.get(name, _UNSET):
            key_settings[name] = value
    key = hashlib.sha256(json.dumps(key_settings, sort_keys=True).encode()).hexdigest()
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
