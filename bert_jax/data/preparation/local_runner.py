"""``bert-jax data prepare`` on one machine: ``prepare_records(sources, tokenizer, output_dir,
settings) -> PrepareResult``, the splits read and the groups made in ``num_workers`` processes.

How it scales. The inputs are cut into splits (``splits.cut_splits``: Wikipedia multistream
dumps by bz2 stream range, Parquet by row group, text and JSONL by byte range cut at a document
boundary) and every split is read once. Each document goes to group ``g = group_of(seed, key) %
num_groups`` by a hash of its key (its source and position, whatever split it was read in;
``groups.py``), so every group is a random sample of the whole corpus and random next sentences
come from across it. ``num_groups`` is ``--num-groups`` or one per ``--group-bytes`` of input,
fixed before anything is read and recorded in ``prepare_config.json``. Group ``g`` becomes
``part-{g:05d}.tfrecord``: its documents in key order are tokenized, made into ``dupe_factor``
passes of masked instances, shuffled and serialized, seeded by ``(seed, g)`` alone. Here that is
a map (splits read in ``num_workers`` processes, documents spilled by group to a hidden folder
of the output) and a reduce (groups made into shards by the same workers, written by this
process); the Apache Beam pipeline (``beam_pipeline.py``) runs the same functions on a runner's
workers. Either way the bytes are the same, whatever ``num_workers`` is or whichever engine runs
it. Memory per worker is bounded by a split and by a group, never by the corpus. Past one
machine, the Beam pipeline is the one way; the flags of an earlier scheme of several machines
(``--shard-index``, ``--num-shards``, ``--merge``) are refused, and directories it merged still
read (``manifest.require_complete``). The run's steps around the groups (checks, manifest,
completion marks) are ``stage.py``'s.
"""

from __future__ import annotations

import errno
import logging
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

from bert_jax.data.preparation import groups as groups_lib
from bert_jax.data.preparation.groups import InstanceStats, part_name
from bert_jax.data.preparation.progress import _Rate, _size
from bert_jax.data.preparation.result import PrepareResult
from bert_jax.data.preparation.settings import PrepareSettings
from bert_jax.data.preparation.stage import (
    CheckedRun,
    check_enough_documents,
    check_run,
    finish_run,
    finished_groups,
    layout_words,
    start_run,
)
from bert_jax.data.records import tfrecord as records_lib
from bert_jax.data.sources import corpus_stats as sources_lib
from bert_jax.data.tokenizers.interface import Tokenizer
from bert_jax.runtime import fs
from bert_jax.runtime.errors import UserError, user_path

logger = logging.getLogger(__name__)


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
) -> groups_lib.HeldoutCount | None:
    """Every split read once (map: documents spilled by group), then every group in ``todo``
    (``(held_out, group)``) made into its shard (reduce), in this process or in ``num_workers``
    workers; ``progress[held_out]`` writes it. Returns how many documents were held out, and
    why (None: none asked for)."""
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
            ""
            if held is None
            else f", holding out {held.rule.share:.1%} of the documents ({groups_lib.FLOOR_WORDS})",
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
        count = None
        if held is not None:
            count = groups_lib.HeldoutCount(
                documents=sum(routing[0] for routing in routings),
                by_share=sum(routing[1] for routing in routings),
                by_floor=len(floor),
            )
            logger.info("held out %s", count.words(held.rule.share))
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
        logger.info("%s", _writing_words(work, todo, progress))
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
        return count
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
        shutil.rmtree(spill, ignore_errors=True)


def _writing_words(
    work: list[tuple[bool, int]], todo: list[tuple[bool, int]], progress: dict[bool, _Progress]
) -> str:
    """What the reduce is about to write: "writing 2 group(s), a shard each: 1 training, 1
    held-out", with the groups finished before and those that no document went to."""
    training = sum(1 for in_heldout, _ in work if not in_heldout)
    kinds = f"{training} training" + (
        f", {len(work) - training} held-out" if len(progress) > 1 else ""
    )
    kept = sum(each.groups_skipped for each in progress.values())
    empty = len(todo) - len(work)
    return (
        f"writing {len(work)} group(s), a shard each: {kinds}"
        + (f"; {kept} finished before (kept)" if kept else "")
        + (f"; {empty} with no document (no shard)" if empty else "")
    )


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
    logger.info("%s", layout_words(checked))
    held_count = _run_local(checked, settings, todo, progress, corpus_stats)
    check_enough_documents(checked, corpus_stats, 0 if held_count is None else held_count.held_out)
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
        result.heldout_count = held_count
    finish_run(result, settings, checked, trained.parts, heldout_parts=held_parts)
    return result
