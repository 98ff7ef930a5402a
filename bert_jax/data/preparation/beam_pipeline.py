"""``data prepare --runner beam``: the preparation as one Apache Beam pipeline (Dataflow, Flink,
Spark, or Beam's FnApiRunner on this machine), writing the records the local path writes.

The pipeline runs the local path's own functions (``groups.py``), so both write the same bytes::

    Create(splits, reshuffled) -> read a split: one ((held_out, group), its documents) element
      per group it feeds (the documents pickled as one blob, as the local path spills them)
      ---> GroupByKey -> a group's documents in key order -> process_group -> write_group
      (part-NNNNN.tfrecord, or heldout/part-NNNNN.tfrecord)
      -> one final step: the completion marks stats-0-of-1.json (with the counts of every group)

Held-out documents (``groups.route_documents``) are keyed to their held-out group as they are
read, and go through the same GroupByKey as the training groups: held-out and training groups
are written side by side, in one stage. The few documents that the floor adds
(``groups.floor_documents``) are chosen from every split's lowest-ranked training documents,
which each read sends on the side with their text (``_lowest_candidates`` combines them, keeping
no more than the floor can take). The choice, with its documents, is a side input of the writing
step: a training group leaves them out, their held-out group takes them in (the first split
sends every held-out group an empty element, so that each is a key of the GroupByKey).

A document is never an element of its own: per-element costs (coders, the shuffle's keys) are
paid per split and group, and a worker holds one split while reading, one group while writing.
No step imports TensorFlow (``tfrecord.write_records`` frames records itself), and only the
writing step carries the tokenizer, so a worker starts in about the time it takes to import
Beam; on this machine the FnApiRunner's worker processes start before the pipeline is built,
and end without the interpreter's teardown (``beam_workers.py``).

Before the pipeline starts, this process checks the inputs and the output directory and writes
``prepare_config.json`` and ``tokenizer/`` (``stage.check_run``, ``stage.start_run``); the
final step writes the completion mark, so a job that fails, or is cancelled, leaves none and the
pipeline refuses the directory until the same command, run again, finishes it (groups already
written are kept). A group that a runner retries, or runs twice, is written again to the same
bytes under a temporary name and renamed: no duplicates, and the final step removes any
temporary name a killed worker left. A bad input found by a worker is raised here as the same
one line the local path gives (``UserError``, exit 2).

What a run shows (``beam_watch.py``): bert-jax's own progress lines, in the local path's format,
Beam's counters for Dataflow's console, and none of Beam's own log lines unless Beam's option
``--default_sdk_harness_log_level=LEVEL`` is given after the ``--``.

Beam is imported only here (and in ``beam_watch.py``), and only when ``--runner beam`` is asked
for: it caps protobuf and pyarrow, so it lives in an extra of its own, in an environment of its
own (``INSTALL_HINT``).
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import logging
import os
import pickle
import re
import time
import traceback

from bert_jax.data.layout import HELDOUT_MIN_DOCUMENTS
from bert_jax.data.preparation import beam_watch, beam_workers
from bert_jax.data.preparation import groups as groups_lib
from bert_jax.data.preparation import stage as prepare_lib
from bert_jax.data.records import manifest
from bert_jax.data.sources import corpus_stats as sources_lib
from bert_jax.data.sources import splits as splits_lib
from bert_jax.runtime import fs
from bert_jax.runtime.errors import UserError

logger = logging.getLogger(__name__)

INSTALL_HINT = (
    "in a checkout, in a virtual environment of its own: pip install -e '.[beam]' "
    "(or make test-beam, which builds .venv-beam)"
)


def import_beam():
    """Apache Beam, or a UserError saying how to install it."""
    try:
        import apache_beam as beam
    except ImportError:
        raise UserError(
            f"--runner beam needs Apache Beam, which is not installed here: {INSTALL_HINT}"
        ) from None
    return beam


def pipeline_options(beam_args: list[str]):
    """Beam's own options from ``beam_args`` (``--runner=DataflowRunner --project ...``), and
    whether they leave the runner to us: the FnApiRunner where no ``--runner`` is given (the
    DirectRunner would first try to download the Prism runner)."""
    import_beam()
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

    options = PipelineOptions(list(beam_args))
    return options, not options.view_as(StandardOptions).runner


def _marked(error: UserError) -> RuntimeError:
    return RuntimeError(beam_watch.USER_ERROR_MARK + str(error).replace("\n", " "))


def _user_error_in(error: BaseException) -> str | None:
    """The one line of a UserError that a worker raised, found in what the runner reports."""
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    match = re.search(re.escape(beam_watch.USER_ERROR_MARK) + r"([^\n]*)", text)
    if match is None:
        return None
    return re.sub(r"""['"]?\s*\[while running.*$""", "", match.group(1)).rstrip(" '\"")


# The steps below carry no type hints: Beam would read them as its own (as strings, here).
def _read_split(indexed_split, seed, num_groups, reader_options, heldout):
    """A split -> ``((held_out, group), blob)``, one per group it feeds (the first split: one
    for every held-out group too): the group's documents of this split, ``[(key, document),
    ...]`` pickled as the local path spills them (a held-out document in its held-out group:
    ``groups.route_documents``); on the side, its CorpusStats (``stats``) and its
    ``groups.Routing`` with the candidates' documents (``candidates``: ``(documents, held,
    [(rank, key, group, document), ...])``)."""
    beam = import_beam()
    index, split = indexed_split
    stats = sources_lib.CorpusStats()
    routing = groups_lib.Routing()
    by_group: dict[tuple[bool, int], list] = {}
    try:
        for held, group, keyed in groups_lib.route_documents(
            split, stats, seed, num_groups, reader_options, heldout, routing
        ):
            by_group.setdefault((held, group), []).append(keyed)
    except UserError as err:
        raise _marked(err) from None
    wanted: dict[int, set] = {}
    for _, key, group in routing.candidates:
        wanted.setdefault(group, set()).add(key)
    texts = {
        key: document
        for group, keys in wanted.items()
        for key, document in by_group[(False, group)]
        if key in keys
    }
    candidates = [(rank, key, group, texts[key]) for rank, key, group in routing.candidates]
    yield beam.pvalue.TaggedOutput("candidates", (routing.documents, routing.held, candidates))
    if heldout is not None and index == 0:  # every held-out group a key: the floor may fill it
        for group in range(heldout.num_groups):
            by_group.setdefault((True, group), [])
    for where in sorted(by_group):
        yield where, pickle.dumps(by_group.pop(where), protocol=pickle.HIGHEST_PROTOCOL)
    beam_watch.count("documents", stats.documents)
    beam_watch.count("input_bytes", splits_lib.split_bytes(split))
    yield beam.pvalue.TaggedOutput("stats", (index, stats.as_dict()))


def _lowest_candidates(routings):
    """Splits' ``_read_split`` candidates -> one: the counts summed, and the lowest-ranked
    ``HELDOUT_MIN_DOCUMENTS`` candidates, all that the floor may take. Beam applies it to its
    own results too (in each worker, then across them), so a worker sends no more than these."""
    documents, held, candidates = 0, 0, []
    for split_documents, split_held, split_candidates in routings:
        documents += split_documents
        held += split_held
        candidates.extend(split_candidates)
    lowest = heapq.nsmallest(HELDOUT_MIN_DOCUMENTS, candidates, key=lambda c: c[:2])
    return documents, held, lowest


def _floor(merged, heldout):
    """The combined candidates -> ``(documents, documents held out by share, {key: (held-out
    group, document)})``: the floor's choice (``groups.floor_documents``), with its documents."""
    documents, held, candidates = merged
    floor = groups_lib.floor_documents([(documents, held, candidates)], heldout)
    chosen = {key: (floor[key], document) for _, key, _, document in candidates if key in floor}
    return documents, held, chosen


def _write_group(group_blobs, targets, tokenizer, floor):
    """One group's documents (a blob per split that fed it) -> its shard (or the shard an
    earlier run finished) -> ``((held_out, group), its counts)``. ``targets[held_out]``: the
    records' ``(directory, recorded settings, groups finished before)``; ``floor``: ``_floor``'s
    choice, whose documents leave their training group for their held-out group. A held-out
    group left with no document has no shard, as on the local path."""
    (held, group), blobs = group_blobs
    output_dir, recorded, finished = targets[held]
    if group in finished:  # written by an earlier run of this job: kept as it is
        yield (held, group), None
        return
    keyed = [item for blob in blobs for item in pickle.loads(blob)]
    chosen = floor[2]
    if held:
        keyed += [(key, document) for key, (to, document) in chosen.items() if to == group]
        if not keyed:
            return
    elif chosen:
        keyed = [item for item in keyed if item[0] not in chosen]
    groups_lib.init_worker(tokenizer)
    try:
        counts, serialized = groups_lib.process_group(
            group, groups_lib.sorted_documents(keyed), recorded
        )
        groups_lib.write_group(output_dir, group, counts, serialized)
    except UserError as err:
        raise _marked(err) from None
    counter = "heldout_" if held else ""  # the held-out records' own counters
    beam_watch.count(f"{counter}groups", 1)
    beam_watch.count(f"{counter}instances", counts.get("instances", 0))
    yield (held, group), counts


def _tally(group_counts):
    """Every group's counts -> (InstanceStats, the groups with a part, written, skipped). A group
    a runner ran twice counts once (its later attempt wrote the same bytes)."""
    by_group = dict(group_counts)
    instance_stats = groups_lib.InstanceStats()
    parts, written, skipped = [], 0, 0
    for group in sorted(by_group):
        counts = by_group[group]
        if counts is None:
            skipped += 1
            parts.append(group)
            continue
        instance_stats.add(counts)
        if counts.get("instances"):
            written += 1
            parts.append(group)
    return instance_stats, parts, written, skipped


def _finish(_, checked, settings, started, group_counts, split_stats, floor):
    """The final step: every group's counts and every split's stats -> the completion marks."""
    try:
        corpus_stats = sources_lib.CorpusStats()
        for _, stats in sorted(split_stats, key=lambda item: item[0]):  # in split order
            corpus_stats.merge(sources_lib.CorpusStats(**stats))
        documents, held_by_share, chosen = floor
        prepare_lib.check_enough_documents(checked, corpus_stats, held_by_share + len(chosen))
        by_records: dict[bool, list] = {False: [], True: []}
        for (held, group), counts in group_counts:
            by_records[held].append((group, counts))
        instance_stats, parts, written, skipped = _tally(by_records[False])
        result = prepare_lib.PrepareResult(
            output_dir=checked.output_dir,
            files=[os.path.join(checked.output_dir, groups_lib.part_name(g)) for g in parts],
            groups_written=written,
            groups_skipped=skipped,
            corpus_stats=corpus_stats,
            instance_stats=instance_stats,
            wall_seconds=time.time() - started,
            settings=checked.recorded,
        )
        held_parts = None
        if checked.heldout is not None:
            result.heldout_stats, held_parts, _, _ = _tally(by_records[True])
            result.heldout_count = groups_lib.HeldoutCount(documents, held_by_share, len(chosen))
            result.heldout_dir = checked.heldout.output_dir if held_parts else None
        prepare_lib.finish_run(
            result, settings, checked, parts, everyone_done=True, heldout_parts=held_parts
        )
    except UserError as err:
        raise _marked(err) from None
    return []


def describe_beam_run(checked, beam_args: list[str]) -> str:
    """What ``--dry-run`` prints: the splits, the groups and Beam's options; nothing is run."""
    try:
        options, ours = pipeline_options(beam_args)
    except UserError:  # no Beam here: the options as given (the job's machine needs Beam)
        given = " ".join(beam_args) or "(none)"
        return (
            f"{prepare_lib.describe_run(checked)}\npipeline options: {given} (not checked: Apache "
            f"Beam is not installed here; {INSTALL_HINT})"
        )
    shown = options.get_all_options(drop_default=True)
    given = " ".join(f"--{key}={value}" for key, value in sorted(shown.items())) or "(none)"
    chosen = "; runner: FnApiRunner (no --runner given)" if ours else ""
    return f"{prepare_lib.describe_run(checked)}\npipeline options: {given}{chosen}"


def build(pipeline, checked, settings, finished: frozenset[int], started: float):
    """The preparation's transforms on ``pipeline`` (its last step writes the completion mark)."""
    beam = import_beam()
    held = checked.heldout
    rule = None if held is None else held.rule
    read = (
        pipeline
        | "Splits" >> beam.Create(list(enumerate(checked.splits)))  # reshuffled: spread out
        | "Read"
        >> beam.FlatMap(
            _read_split, settings.seed, checked.num_groups, checked.reader_options, rule
        ).with_outputs("stats", "candidates", main="documents")
    )
    floor = (
        read.candidates
        | "Candidates" >> beam.CombineGlobally(_lowest_candidates).without_defaults()
        | "Floor" >> beam.Map(_floor, rule)
    )
    targets = {False: (checked.output_dir, checked.recorded, finished)}
    if held is not None:
        held_finished = prepare_lib.finished_groups(held.output_dir)
        targets[True] = (held.output_dir, held.recorded, held_finished)
    counts = (
        read.documents
        | "Group" >> beam.GroupByKey()
        | "Write"
        >> beam.FlatMap(_write_group, targets, checked.tokenizer, beam.pvalue.AsSingleton(floor))
    )
    # The final step needs no tokenizer: each step's arguments are pickled (and compressed).
    light = dataclasses.replace(checked, tokenizer=None)
    return (
        pipeline
        | "Once" >> beam.Create([None])
        | "Finish"
        >> beam.FlatMap(
            _finish,
            light,
            settings,
            started,
            beam.pvalue.AsList(counts),
            beam.pvalue.AsList(read.stats),
            beam.pvalue.AsSingleton(floor),
        )
    )


def prepare_with_beam(
    sources,
    tokenizer,
    output_dir,
    settings: prepare_lib.PrepareSettings,
    beam_args: list[str],
    *,
    dry_run: bool = False,
    output_what: str = "--output",
    workers: beam_workers.LocalWorkers | None = None,
):
    """``data prepare --runner beam``: the records of ``local_runner.prepare_records`` written by a
    Beam pipeline run with ``beam_args``. Returns the PrepareResult where the runner waits for
    the job (the FnApiRunner, or Dataflow without ``--no_wait``), else None; with ``dry_run``,
    the text of ``describe_beam_run`` (nothing is written or run). ``workers``: the
    FnApiRunner's worker processes, started by the caller ahead (``beam_workers.LocalWorkers``;
    closed here), else started here."""
    started = time.time()
    if dry_run:
        if workers is not None:
            workers.close()
        checked = prepare_lib.check_run(sources, tokenizer, output_dir, settings, output_what)
        return describe_beam_run(checked, beam_args)
    if workers is None:
        workers = beam_workers.LocalWorkers(beam_args)
    # Beam logs as it is imported (to the root logger): hidden from the start, until its option
    # says otherwise.
    hide = beam_watch.HideBeam(logging.ERROR)
    handlers = logging.getLogger().handlers or [logging.lastResort]
    for handler in handlers:
        handler.addFilter(hide)
    failed = True
    try:
        job = (sources, tokenizer, output_dir, settings, beam_args, output_what, started)
        result = _run(*job, hide, workers.standbys)
        failed = False
        return result
    except UserError:
        failed = False  # one line says it all
        raise
    finally:
        workers.close(failed)
        for handler in handlers:
            handler.removeFilter(hide)


def _run(sources, tokenizer, output_dir, settings, beam_args, output_what, started, hide, standbys):
    """``prepare_with_beam``'s job, with Beam's log lines going through ``hide`` and, on the
    FnApiRunner, ``standbys`` (None: none) as its worker processes."""
    beam = import_beam()  # before the inputs are read for their identity
    checked = prepare_lib.check_run(sources, tokenizer, output_dir, settings, output_what)
    options, ours = pipeline_options(beam_args)
    level = beam_watch.beam_log_level(options)
    if level is not None:
        hide.level = level
    prepare_lib.start_run(checked, settings)
    finished = prepare_lib.finished_groups(checked.output_dir)
    todo = {checked.output_dir: frozenset(range(checked.num_groups)) - finished}
    kept = len(finished)
    if checked.heldout is not None:  # its groups are written beside the training groups
        held_dir = checked.heldout.output_dir
        held_finished = prepare_lib.finished_groups(held_dir)
        todo[held_dir] = frozenset(range(checked.heldout.rule.num_groups)) - held_finished
        kept += len(held_finished)
    logger.info(
        "Beam job: %s%s",
        prepare_lib.layout_words(checked),
        f"; {kept} written before (kept)" if kept else "",
    )
    runner = beam_workers.local_runner(options, standbys) if ours else None
    watch = beam_watch.ShardWatch(todo)
    try:
        pipeline = beam.Pipeline(runner=runner, options=options)
        build(pipeline, checked, settings, finished, started)
        watch.start()
        try:
            job = pipeline.run()
            job.wait_until_finish()
        except Exception as err:  # a worker's user error, reported by the runner as text
            line = _user_error_in(err)
            if line is None:
                raise
            raise UserError(line) from None
    finally:
        if watch.is_alive():
            watch.stop()
    counters = beam_watch.job_counters(job)
    logger.debug("Beam counters: %s", ", ".join(f"{k} {v}" for k, v in sorted(counters.items())))
    return _read_result(checked)


def _read_result(checked):
    """The result from the completion mark that the final step wrote (in a worker)."""
    path = os.path.join(checked.output_dir, manifest.COMPLETION_MARK)
    if not fs.exists(path):
        return None  # a job that runs on (Dataflow without waiting): the mark comes at its end
    with fs.open(path, encoding="utf-8") as f:
        stats = json.load(f)
    instance_stats = groups_lib.InstanceStats(**stats["instances"])
    corpus = dict(stats["corpus"])
    held_count = stats.get("heldout", {}).get("of_corpus")
    return prepare_lib.PrepareResult(
        output_dir=checked.output_dir,
        files=[os.path.join(checked.output_dir, groups_lib.part_name(g)) for g in stats["parts"]],
        groups_written=stats["groups_written"],
        groups_skipped=stats["groups_skipped"],
        corpus_stats=sources_lib.CorpusStats(**corpus),
        instance_stats=instance_stats,
        wall_seconds=stats["wall_seconds"],
        settings=checked.recorded,
        **prepare_lib.read_heldout(checked),
        heldout_count=None if held_count is None else groups_lib.HeldoutCount(**held_count),
    )
