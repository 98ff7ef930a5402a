"""``data prepare --runner beam``: the preparation as one Apache Beam pipeline (Dataflow, Flink,
Spark, or Beam's FnApiRunner on this machine), writing the records the local path writes.

The pipeline runs the local path's own functions (``groups.py``), so both write the same bytes::

    Create(splits) -> Reshuffle -> read a split: (group, (key, document)) pairs ---> GroupByKey
      -> a group's documents in key order -> process_group -> write_group (part-NNNNN.tfrecord)
      -> one final step: the completion mark stats-0-of-1.json (with the counts of every group)

Held-out documents (``groups.route_documents``) leave the read as a side output; the few that
the floor adds (``groups.floor_documents``, from every split's ``Routing``, a side input) leave
their training group when it is written. Both go through a GroupByKey of their own into the
held-out groups, written into ``heldout/`` before the final step.

Before the pipeline starts, this process checks the inputs and the output directory and writes
``prepare_config.json`` and ``tokenizer/`` (``prepare.check_run``, ``prepare.start_run``); the
final step writes the completion mark, so a job that fails, or is cancelled, leaves none and the
pipeline refuses the directory until the same command, run again, finishes it (groups already
written are kept). A group that a runner retries, or runs twice, is written again to the same
bytes under a temporary name and renamed: no duplicates, and the final step removes any
temporary name a killed worker left. A bad input found by a worker is raised here as the same
one line the local path gives (``UserError``, exit 2).

Beam is imported only here, and only when ``--runner beam`` is asked for: it caps protobuf and
pyarrow, so it lives in an extra of its own (``pip install 'bert-jax[beam]'``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import traceback

from bert_jax.data.preparation import groups as groups_lib
from bert_jax.data.preparation import run as prepare_lib
from bert_jax.data.records import manifest
from bert_jax.data.sources import documents as sources_lib
from bert_jax.runtime import fs
from bert_jax.runtime.errors import UserError

logger = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'bert-jax[beam]' (in a checkout: make test-beam builds .venv-beam)"
# A user error raised in a worker crosses the runner as text: this mark finds its line again.
_USER_ERROR_MARK = "[bert-jax user error] "


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
    """Beam's own options from ``beam_args`` (``--runner=DataflowRunner --project ...``) and the
    runner to run them with: Beam's choice where ``--runner`` is given, else the FnApiRunner
    (the DirectRunner would first try to download the Prism runner)."""
    import_beam()
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

    options = PipelineOptions(list(beam_args))
    if options.view_as(StandardOptions).runner:
        return options, None
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    return options, FnApiRunner()


def _marked(error: UserError) -> RuntimeError:
    return RuntimeError(_USER_ERROR_MARK + str(error).replace("\n", " "))


def _user_error_in(error: BaseException) -> str | None:
    """The one line of a UserError that a worker raised, found in what the runner reports."""
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    match = re.search(re.escape(_USER_ERROR_MARK) + r"([^\n]*)", text)
    if match is None:
        return None
    return re.sub(r"""['"]?\s*\[while running.*$""", "", match.group(1)).rstrip(" '\"")


# The steps below carry no type hints: Beam would read them as its own (as strings, here).
def _read_split(indexed_split, seed, num_groups, reader_options, heldout):
    """A split -> ``(group, (key, document))`` pairs; on the side, its held-out documents
    (``heldout``), its CorpusStats (``stats``) and its ``groups.Routing`` (``routing``)."""
    beam = import_beam()
    index, split = indexed_split
    stats = sources_lib.CorpusStats()
    routing = groups_lib.Routing()
    try:
        for held, group, keyed in groups_lib.route_documents(
            split, stats, seed, num_groups, reader_options, heldout, routing
        ):
            yield beam.pvalue.TaggedOutput("heldout", (group, keyed)) if held else (group, keyed)
    except UserError as err:
        raise _marked(err) from None
    yield beam.pvalue.TaggedOutput("stats", (index, stats.as_dict()))
    yield beam.pvalue.TaggedOutput("routing", routing.as_tuple())


def _write_group(group_documents, output_dir, tokenizer, recorded, finished, floor=None):
    """One group's documents -> its shard (or the shard an earlier run finished) -> its counts.
    The documents the held-out floor takes (``floor``: key -> held-out group) go on the side
    (``heldout``), even from a group written before."""
    beam = import_beam()
    group, keyed = group_documents
    if floor:
        keyed = list(keyed)
        for item in keyed:
            if item[0] in floor:
                yield beam.pvalue.TaggedOutput("heldout", (floor[item[0]], item))
        keyed = [item for item in keyed if item[0] not in floor]
    if group in finished:  # written by an earlier run of this job: kept as it is
        yield group, None
        return
    groups_lib.init_worker(tokenizer)
    try:
        counts, serialized = groups_lib.process_group(
            group, groups_lib.sorted_documents(keyed), recorded
        )
        groups_lib.write_group(output_dir, group, counts, serialized)
    except UserError as err:
        raise _marked(err) from None
    yield group, counts


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


def _finish(_, checked, settings, started, group_counts, split_stats, held_counts, routings, floor):
    """The final step: every group's counts and every split's stats -> the completion marks."""
    try:
        corpus_stats = sources_lib.CorpusStats()
        for _, stats in sorted(split_stats, key=lambda item: item[0]):  # in split order
            corpus_stats.merge(sources_lib.CorpusStats(**stats))
        held_out = sum(routing[1] for routing in routings) + len(floor)
        prepare_lib.check_enough_documents(checked, corpus_stats, held_out)
        instance_stats, parts, written, skipped = _tally(group_counts)
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
            result.heldout_stats, held_parts, _, _ = _tally(held_counts)
            result.heldout_dir = checked.heldout.output_dir if held_parts else None
        prepare_lib.finish_run(
            result, settings, checked, parts, everyone_done=True, heldout_parts=held_parts
        )
    except UserError as err:
        raise _marked(err) from None
    return []


def describe(checked, beam_args: list[str]) -> str:
    """What ``--dry-run`` prints: the splits, the groups and Beam's options; nothing is run."""
    try:
        options, runner = pipeline_options(beam_args)
    except UserError:  # no Beam here: the options as given (the job's machine needs Beam)
        given = " ".join(beam_args) or "(none)"
        return (
            f"{prepare_lib.describe_run(checked)}\npipeline options: {given} (not checked: Apache "
            f"Beam is not installed here; {INSTALL_HINT})"
        )
    shown = options.get_all_options(drop_default=True)
    given = " ".join(f"--{key}={value}" for key, value in sorted(shown.items())) or "(none)"
    chosen = "; runner: FnApiRunner (no --runner given)" if runner is not None else ""
    return f"{prepare_lib.describe_run(checked)}\npipeline options: {given}{chosen}"


def build(pipeline, checked, settings, finished: frozenset[int], started: float):
    """The preparation's transforms on ``pipeline`` (its last step writes the completion mark)."""
    beam = import_beam()
    indexed = list(enumerate(checked.splits))
    held = checked.heldout
    rule = None if held is None else held.rule
    read = (
        pipeline
        | "Splits" >> beam.Create(indexed)
        | "Spread" >> beam.Reshuffle()
        | "Read"
        >> beam.FlatMap(
            _read_split, settings.seed, checked.num_groups, checked.reader_options, rule
        ).with_outputs("stats", "heldout", "routing", main="documents")
    )
    floor = (
        read.routing
        | "Routings" >> beam.combiners.ToList()
        | "Floor" >> beam.Map(groups_lib.floor_documents, rule)
    )
    written = (
        read.documents
        | "Group" >> beam.GroupByKey()
        | "Write"
        >> beam.FlatMap(
            _write_group,
            checked.output_dir,
            checked.tokenizer,
            checked.recorded,
            finished,
            beam.pvalue.AsSingleton(floor),
        ).with_outputs("heldout", main="counts")
    )
    counts = written.counts
    held_counts = pipeline | "NoHeldout" >> beam.Create([])
    if held is not None:
        held_counts = (
            (read.heldout, written.heldout)
            | "Heldout" >> beam.Flatten()
            | "GroupHeldout" >> beam.GroupByKey()
            | "WriteHeldout"
            >> beam.FlatMap(
                _write_group,
                held.output_dir,
                checked.tokenizer,
                held.recorded,
                prepare_lib.finished_groups(held.output_dir),
            )
        )
    return (
        pipeline
        | "Once" >> beam.Create([None])
        | "Finish"
        >> beam.FlatMap(
            _finish,
            checked,
            settings,
            started,
            beam.pvalue.AsList(counts),
            beam.pvalue.AsList(read.stats),
            beam.pvalue.AsList(held_counts),
            beam.pvalue.AsList(read.routing),
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
):
    """``data prepare --runner beam``: the records of ``prepare.prepare_records`` written by a
    Beam pipeline run with ``beam_args``. Returns the PrepareResult where the runner waits for
    the job (the FnApiRunner, or Dataflow without ``--no_wait``), else None; with ``dry_run``,
    the text of ``describe`` (nothing is written or run)."""
    started = time.time()
    beam = None if dry_run else import_beam()  # before the inputs are read for their identity
    checked = prepare_lib.check_run(sources, tokenizer, output_dir, settings, output_what)
    if dry_run:
        return describe(checked, beam_args)
    options, runner = pipeline_options(beam_args)
    # Beam's own INFO lines (type hints, workers' start and exit) drown the progress; a
    # Dataflow job's state and its console link stay.
    logging.getLogger("apache_beam").setLevel(logging.WARNING)
    logging.getLogger("apache_beam.runners.dataflow").setLevel(logging.INFO)
    prepare_lib.start_run(checked, settings)
    finished = prepare_lib.finished_groups(checked.output_dir)
    pipeline = beam.Pipeline(runner=runner, options=options)
    build(pipeline, checked, settings, finished, started)
    try:
        pipeline.run().wait_until_finish()
    except Exception as err:  # a worker's user error, reported by the runner as text
        line = _user_error_in(err)
        if line is None:
            raise
        raise UserError(line) from None
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
    )
