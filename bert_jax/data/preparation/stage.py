"""One `data prepare` run as steps that every runner shares: `check_run` (settings, inputs and
output checked, inputs cut into splits, documents into groups; nothing written), `describe_run`
(what `--dry-run` prints), `start_run` (the output opened: manifest, tokenizer), `finish_run`
(the completion marks), with `finished_groups`, `read_heldout` and `check_enough_documents`.
The local processes (``local_runner.py``) and the Apache Beam pipeline (``beam_pipeline.py``)
run the groups between them.

What the records record: ``prepare_config.json`` (``manifest.Manifest``: built, checked against
the directory's and written once per run) holds the settings whose declarations say they shape
the records (``PrepareSettings.recorded``) and what the run derived (``_recorded_settings``).

A share of the documents (``heldout_share``) is held out by a hash of their key into the records
directory ``heldout/`` (``layout.heldout_dir``): the same files, manifest and completion mark as
the training records, so every reader reads it unchanged (``groups.Heldout``).

Nothing already written is lost: each shard is written under a hidden temporary name and renamed
when complete, next to a small ``part-{g:05d}.json`` with its counts. A re-run with the same
settings skips finished groups (resuming an interrupted job); different settings in the same
output directory are refused unless ``overwrite=True``, which rewrites the groups (the old
shards are set aside in a hidden folder, removed once the new ones are complete). The tokenizer
is saved in ``tokenizer/`` (so the pipeline can re-mask dynamically), and a summary goes to
``stats-0-of-1.json`` (``manifest.COMPLETION_MARK``), written last.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

from bert_jax.data.layout import TOKENIZER_SUBDIR, heldout_dir
from bert_jax.data.preparation import groups as groups_lib
from bert_jax.data.preparation.groups import InstanceStats, part_name
from bert_jax.data.preparation.progress import _size
from bert_jax.data.preparation.result import PrepareResult
from bert_jax.data.preparation.settings import RECORDS_SETTINGS, PrepareSettings
from bert_jax.data.records import manifest
from bert_jax.data.sources import kinds
from bert_jax.data.sources import splits as splits_lib
from bert_jax.data.sources.corpus_stats import CorpusStats
from bert_jax.data.sources.documents import TEXT_EXTRACTION_VERSION
from bert_jax.data.tokenizers.interface import Tokenizer
from bert_jax.data.tokenizers.load_or_train import load_tokenizer
from bert_jax.runtime import declarations, fs
from bert_jax.runtime.errors import user_path
from bert_jax.runtime.outputs import write_json_atomic

logger = logging.getLogger(__name__)

# The records' format (manifest.FORMAT_KEY): 2 = documents grouped by a hash of their key
# (groups.group_of) into ``num_groups`` groups; 1 = consecutive groups of documents_per_shard
# documents. Records of another format are refused on resume and merge (manifest.check_format).
FORMAT_VERSION = 2


def _recorded_settings(
    settings: PrepareSettings, tokenizer: Tokenizer, sources: list[str], num_groups: int
) -> dict:
    """What ``prepare_config.json`` holds: the settings that shape the records (their
    declarations say so: ``PrepareSettings.recorded``), and what the run derived from its
    inputs (the format, the groups' count, the text extraction, the tokenizer, the sources)."""
    return {
        "format_version": FORMAT_VERSION,
        "num_groups": num_groups,
        **settings.recorded(),
        "text_extraction": TEXT_EXTRACTION_VERSION,
        "tokenizer_fingerprint": tokenizer.fingerprint(),
        "vocab_size": tokenizer.vocab_size,
        "sources": [
            s if kinds.source_kind(s) in ("tfds", "embedded") else os.path.basename(s)
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
    sources = kinds.expand_sources(
        [sources] if isinstance(sources, (str, os.PathLike)) else sources
    )
    inputs = manifest.input_identity(sources)  # refuses binary / non-UTF-8 files, writes nothing
    reader_options = settings.reader_options()  # the declared `reader` settings
    logger.info(
        "cutting %d input(s) into splits of about %s", len(sources), _size(settings.split_bytes)
    )
    splits = splits_lib.cut_splits(sources, target_bytes=settings.split_bytes, **reader_options)
    num_groups = settings.num_groups or groups_lib.derive_num_groups(
        sum(_input_bytes(split, settings.tfds_data_dir) for split in splits), settings.group_bytes
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

    name, split_name = kinds.parse_tfds_source(split.source)
    try:
        return int(tfds.builder(name, data_dir=tfds_data_dir).info.splits[split_name].num_bytes)
    except Exception:  # unknown or unprepared: reading the split says so, in one line
        return 0


def layout_words(checked: CheckedRun) -> str:
    """The run's splits and groups, as a run's progress and ``--dry-run`` say them: "1 split(s)
    of 310.3 KiB into 1 training group(s) and 1 held-out group(s), a shard each"."""
    size = checked.input_bytes()
    held = (
        ""
        if checked.heldout is None
        else f" and {checked.heldout.rule.num_groups} held-out group(s)"
    )
    return (
        f"{len(checked.splits)} split(s) of {len(checked.sources)} input(s)"
        f"{f', {_size(size)},' if size else ''} into {checked.num_groups} training group(s)"
        f"{held}, a shard each"
    )


def describe_run(checked: CheckedRun) -> str:
    """What ``--dry-run`` prints: the splits and the groups, and the settings the records are
    made with (their declarations say which); nothing is read past the cutting."""
    declared = declarations.declarations(PrepareSettings)
    made = ", ".join(
        f"{declarations.flag_name(name, declared[name])} {declarations.shown(value)}"
        for name, value in checked.recorded.items()
        if name in RECORDS_SETTINGS
    )
    lines = [
        f"{layout_words(checked)}, in {checked.output_dir}",
        f"records made with {made}",
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
    checked: CheckedRun, corpus_stats: CorpusStats, held_out: int = 0
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
        if result.heldout_count is not None:  # of the corpus's documents, and why
            counts["heldout"]["of_corpus"] = result.heldout_count.as_dict()
    write_json_atomic(os.path.join(directory, manifest.COMPLETION_MARK), counts)
