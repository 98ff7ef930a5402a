"""A records directory's manifest: what ``data prepare`` made it from, and whether it finished.

The manifest is a value, ``Manifest``: the settings that shape the records (what
``PrepareSettings``' declarations mark as such, and what a run derives: the tokenizer's
fingerprint, the groups' count, ...) and the identity of every input file from storage's
metadata (``input_identity``: path, size and modification time, or a bucket object's checksum and
generation), so that the run reads every input byte once. ``prepare`` builds it, checks it against
the one already in the output directory (``check_resumable``: unchanged inputs and settings
resume; a change is refused in one line naming the file or the setting unless ``--overwrite``
asks for a rebuild) and writes it once per stage (``write``). Records whose text another version
extracted (``text_extraction``, ``documents.TEXT_EXTRACTION_VERSION``; 1 where it is not recorded)
are refused first, by that name (``check_extraction``): they hold other words. On disk it is the
flat JSON object ``prepare_config.json``, the same keys as ever: ``from_json`` reads every
earlier version.

Input that is not text (a NUL byte: an image, a library) or not UTF-8 (say Latin-1) is refused
where it is read, naming the file and the line (``sources.text_check``); ``check_text_inputs``
reads whole files for that (a tokenizer's corpus).

A run removes the completion mark ``stats-0-of-1.json`` (``COMPLETION_MARK``) when it starts and
writes it last: ``require_complete`` (used by the pipeline) refuses a directory with a manifest
and no mark, so a failed or killed run is never trusted. The held-out records (``heldout/``) are
a records directory of their own, with their own manifest and mark. ``RECORDS_KIND`` is the
records directory as an output (``files.check_replaceable``).

Earlier versions could prepare one directory on N machines (``stats-I-of-N.json`` each), then
merge them (``merged_shards = N`` in the manifest): such a directory still reads; one whose
machines were never merged is refused (``UnmergedRecordsError``), to be prepared again.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
import re
from collections.abc import Mapping
from typing import Any

from bert_jax.data.layout import (
    CONFIG_FILE,
    HELDOUT_SUBDIR,
    RECORD_SUFFIX,
    TOKENIZER_SUBDIR,
    read_prepare_config,
)
from bert_jax.data.preparation.settings import PrepareSettings
from bert_jax.data.sources.text_check import InputError, TextCheck
from bert_jax.runtime import declarations, fs
from bert_jax.runtime import outputs as files
from bert_jax.runtime.errors import UserError, user_path

INPUTS_KEY = "inputs"
MERGED_KEY = "merged_shards"
# Recorded, not compared: the tokenizer's fingerprint, compared, says the same and more.
_NOT_COMPARED = ("vocab_size",)
EXTRACTION_KEY = "text_extraction"
# Entries recorded later than the first manifest, with the value every earlier prepare used: a
# directory prepared before then compares as what it is (the regex splitter), not as None. A
# records setting the manifest gains says so on its declaration (`before=`, in
# PrepareSettings); the text extraction's version (derived, not a setting) is the one other.
BEFORE_RECORDED = {
    **declarations.before_recorded(PrepareSettings),
    EXTRACTION_KEY: 1,
}
FORMAT_KEY = "format_version"
# What each records format groups documents by (stage.FORMAT_VERSION), for check_format's line.
_FORMATS = {
    1: "consecutive documents (--documents-per-shard)",
    2: "a hash of each document's key (--num-groups)",
}
_CHUNK = 1 << 20
_STATS_RE = re.compile(r"^stats-(\d+)-of-(\d+)\.json$")
# A shard and its counts, a completion mark, and the folder where a run spills documents by
# group (local_runner._spill_dir; left behind only by a killed run).
_OWN_NAME_RE = re.compile(
    r"^(part-\d+\.(tfrecord|json)|stats-\d+-of-\d+\.json|\.spill-\d+-of-\d+-.+)$"
)
_OWN_NAMES = (CONFIG_FILE, TOKENIZER_SUBDIR, HELDOUT_SUBDIR, "prepared-complete.json")

RECORDS_KIND = files.OutputKind(
    name="records directory",
    marker=CONFIG_FILE,
    is_own=lambda path: fs.isfile(os.path.join(path, CONFIG_FILE)),
    holds=lambda name: name in _OWN_NAMES or bool(_OWN_NAME_RE.match(name)),
    marker_file=CONFIG_FILE,
)


class SettingsChangedError(UserError):
    """An output directory prepared with other settings than the run's."""


class IncompleteRecordsError(UserError):
    """A records directory whose `data prepare` run has not finished."""


class UnmergedRecordsError(IncompleteRecordsError):
    """A records directory prepared by several machines whose shards were not merged."""


@dataclasses.dataclass(frozen=True)
class Manifest:
    """What a records directory was prepared from; ``prepare_config.json`` as a value.

    ``settings``: every recorded key but the inputs (the records settings, what the run derived,
    and whatever an older or newer writer added, kept as it was). ``inputs``: one entry per input,
    ``{"path", "size", "sha256"}`` for a file or ``{"source"}`` for a named corpus; None in a
    directory prepared before inputs were recorded. ``merged_shards``: N in a directory that an
    earlier version merged from N machines. Treat all as read-only.
    """

    settings: Mapping[str, Any]
    inputs: tuple[Mapping[str, Any], ...] | None = None
    merged_shards: int | None = None

    def to_json(self) -> dict:
        """The object ``prepare_config.json`` holds."""
        payload = dict(self.settings)
        if self.inputs is not None:
            payload[INPUTS_KEY] = [dict(entry) for entry in self.inputs]
        if self.merged_shards is not None:
            payload[MERGED_KEY] = self.merged_shards
        return payload

    @classmethod
    def from_json(cls, payload: Mapping[str, Any]) -> Manifest:
        settings = {k: v for k, v in payload.items() if k not in (INPUTS_KEY, MERGED_KEY)}
        for key, value in BEFORE_RECORDED.items():  # what a version that did not record it did
            settings.setdefault(key, value)
        inputs = payload.get(INPUTS_KEY)
        return cls(settings, None if inputs is None else tuple(inputs), payload.get(MERGED_KEY))

    def setting_changes(self, other: Manifest) -> list[str]:
        """``"key: mine -> other's"`` for every setting ``other`` records (a run's wanted
        manifest: what its settings' declarations record, and what it derived) on which the two
        differ; a key only an older or newer writer recorded is not compared."""
        return [
            f"{key}: {self.settings.get(key)!r} -> {value!r}"
            for key, value in other.settings.items()
            if key not in _NOT_COMPARED and self.settings.get(key) != value
        ]


def read(directory: str) -> Manifest | None:
    """The manifest in `directory`, or None where there is none (new, empty, foreign records)."""
    try:
        payload = read_prepare_config(directory)
    except json.JSONDecodeError as err:
        raise UserError(
            f"{os.path.join(directory, CONFIG_FILE)} is not valid JSON ({err}); prepare the "
            "directory again, into a new --output directory or with --overwrite"
        ) from None
    return None if payload is None else Manifest.from_json(payload)


def write(directory: str, manifest: Manifest) -> None:
    files.write_json_atomic(os.path.join(directory, CONFIG_FILE), manifest.to_json())


def _is_file_source(source: str) -> bool:
    from bert_jax.data.sources.kinds import source_kind

    return source_kind(source) == "text" and fs.isfile(source)


def _scan(path: str, digest=None) -> None:
    """One read of `path`: its text checked (decompressed for .gz), `digest` fed the raw bytes."""
    from bert_jax.data.sources.kinds import is_text_file

    compressed = path.endswith(".gz")
    text = is_text_file(path)  # Parquet and .bz2 dumps: hashed only, their readers check them
    try:
        if compressed:
            check = TextCheck(path, gzip.open)
            with fs.open_gzip(path) as stream:
                while chunk := stream.read(_CHUNK):
                    check.feed(chunk)
            check.finish()
        if compressed and digest is None:
            return
        check = TextCheck(path) if text and not compressed else None
        with fs.open(path, "rb") as stream:
            while chunk := stream.read(_CHUNK):
                if check is not None:
                    check.feed(chunk)
                if digest is not None:
                    digest.update(chunk)
        if check is not None:
            check.finish()
    except (OSError, EOFError) as err:  # unreadable, or a damaged .gz
        raise InputError(f"{path}: cannot be read ({err})") from None


def check_text_inputs(sources: list[str]) -> None:
    """Refuses (InputError naming the file and line) any input file that is not UTF-8 text."""
    for source in sources:
        if _is_file_source(source):
            _scan(source)


def _object_identity(path: str) -> dict | None:
    """A bucket object's identity from its metadata: size, CRC32C (or MD5) and generation, which
    storage keeps for every object. None: no checksum in the metadata."""
    with user_path(path, "input"):
        info = fs.info(path)
    checksum = {key: info[key] for key in ("crc32c", "md5Hash") if info.get(key)}
    if not checksum:
        return None
    return {
        "path": fs.abspath(path),
        "size": int(info["size"]),
        **checksum,
        "generation": info.get("generation"),
    }


def _file_identity(path: str) -> dict:
    """A local file's identity from its metadata: size and modification time (nanoseconds)."""
    with user_path(path, "input"):
        stat = os.stat(path)
    return {"path": fs.abspath(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _content_identity(path: str) -> dict:
    """A file's identity by its content (SHA-256, one read), as earlier versions recorded it."""
    digest = hashlib.sha256()
    _scan(path, digest)
    return {"path": fs.abspath(path), "size": fs.getsize(path), "sha256": digest.hexdigest()}


def input_identity(sources: list[str]) -> list[dict]:
    """Every input's identity, read from storage's metadata, never from its bytes (the run reads
    each input once, for its documents): a local file's size and modification time
    (``_file_identity``), a bucket object's size, checksum and generation
    (``_object_identity``; its SHA-256 where storage keeps no checksum); named sources such as
    ``embedded`` as they are. Whether an input is text is checked where it is read
    (``text_check``)."""
    identity = []
    for source in sources:
        if not _is_file_source(source):
            identity.append({"source": source})
        elif not fs.is_remote(source):
            identity.append(_file_identity(source))
        else:
            identity.append(_object_identity(source) or _content_identity(source))
    return identity


def input_key(entry: Mapping[str, Any]) -> str:
    return entry.get("path", entry.get("source"))


def _check_inputs(previous: Manifest, wanted: Manifest, output_dir: str) -> None:
    """Refuses (InputError naming the first file) inputs that changed, appeared or went since
    `previous` was recorded. A manifest from before inputs were recorded passes."""
    if previous.inputs is None or wanted.inputs is None:
        return
    before = {input_key(entry): entry for entry in previous.inputs}
    now = {input_key(entry): entry for entry in wanted.inputs}
    for name, entry in now.items():  # an earlier version's SHA-256: compared as it was recorded
        if "sha256" in before.get(name, {}) and "sha256" not in entry and fs.isfile(name):
            now[name] = _content_identity(name)
    changed = [name for name in now if name in before and before[name] != now[name]]
    added = [name for name in now if name not in before]
    removed = [name for name in before if name not in now]
    for names, what in ((changed, "changed"), (added, "is new"), (removed, "is gone")):
        if names:
            more = f" (and {len(names) - 1} more)" if len(names) > 1 else ""
            raise InputError(
                f"input {names[0]}{more} {what} since {output_dir} was prepared from it; "
                "pass --overwrite to rebuild, or choose a new --output directory"
            )


def check_extraction(
    previous: Manifest, wanted: Manifest, output_dir: str, rerun: str = ""
) -> None:
    """Refuses (SettingsChangedError, one line) records whose text was extracted by another
    version of bert-jax (``documents.TEXT_EXTRACTION_VERSION``): they hold other words than this
    version would write, and a resumed or merged directory would mix both."""
    made, now = previous.settings.get(EXTRACTION_KEY), wanted.settings.get(EXTRACTION_KEY)
    if made != now:
        raise SettingsChangedError(
            f"{output_dir}: records were made with text extraction v{made}, this version of "
            f"bert-jax extracts v{now} (sentence splitters keep every word, wikitext is "
            "stripped anew); they would mix: rerun "
            f"{rerun or 'data prepare'} with --overwrite to rebuild them, or choose a new "
            "--output directory"
        )


def check_format(previous: Manifest, wanted: Manifest, output_dir: str, rerun: str = "") -> None:
    """Refuses (SettingsChangedError, one line) records of another format (``format_version``,
    ``stage.FORMAT_VERSION``): their documents are grouped otherwise, so a resumed or merged
    directory would hold some documents twice and others not at all."""
    made, now = previous.settings.get(FORMAT_KEY), wanted.settings.get(FORMAT_KEY)
    if made != now:
        raise SettingsChangedError(
            f"{output_dir}: records of format v{made} (documents grouped by "
            f"{_FORMATS.get(made, 'another rule')}), this version of bert-jax writes v{now} "
            f"(grouped by {_FORMATS.get(now, 'another rule')}); they would mix: rerun "
            f"{rerun or 'data prepare'} with --overwrite to rebuild them, or choose a new "
            "--output directory"
        )


def check_resumable(
    previous: Manifest | None, wanted: Manifest, output_dir: str, overwrite: bool
) -> None:
    """May a run that would record `wanted` write into `output_dir`, which holds `previous`?

    Without `overwrite`: only with the same inputs (else InputError naming the file) and the
    same output settings (else SettingsChangedError listing each change). With it: always."""
    if previous is None or overwrite:
        return
    check_format(previous, wanted, output_dir)
    check_extraction(previous, wanted, output_dir)
    _check_inputs(previous, wanted, output_dir)
    changed = previous.setting_changes(wanted)
    if changed:
        raise SettingsChangedError(
            f"{output_dir} already holds data prepared with different settings "
            f"({'; '.join(changed)}); choose a new --output directory or pass --overwrite"
        )


def check_output_dir(output_dir: str, overwrite: bool) -> None:
    """Before anything is written: `output_dir` is new, empty or a records directory (with
    `overwrite`, one ``files.check_replaceable`` allows)."""
    if overwrite:
        files.check_replaceable(output_dir, RECORDS_KIND)
    elif fs.isdir(output_dir) and fs.listdir(output_dir):
        if not RECORDS_KIND.is_own(output_dir):
            raise files.OutputInTheWayError(
                f"{output_dir} holds files but no {CONFIG_FILE} (not a bert-jax records "
                "directory); choose a new or empty --output directory"
            )


def stats_name(shard_index: int, num_shards: int) -> str:
    return f"stats-{shard_index}-of-{num_shards}.json"


# A records directory's completion mark (the name of earlier versions' one machine).
COMPLETION_MARK = stats_name(0, 1)


def completion_marks(names: list[str]) -> dict[int, set[int]]:
    """{N: the machines I of N whose ``stats-I-of-N.json`` is among `names`}."""
    found: dict[int, set[int]] = {}
    for name in names:
        match = _STATS_RE.match(name)
        if match:
            found.setdefault(int(match.group(2)), set()).add(int(match.group(1)))
    return found


def require_complete(directory: str) -> None:
    """Refuses a records directory written by ``data prepare`` that has not finished (a failed,
    killed or still running preparation), or that an earlier version prepared on several
    machines and never merged. Foreign records pass."""
    if not fs.isdir(directory):
        return
    recorded = read(directory)
    if recorded is None:
        return
    found = completion_marks(fs.listdir(directory))
    complete = sorted(n for n, done in found.items() if done >= set(range(n)))
    if not complete:
        missing = f"no {COMPLETION_MARK}"
        if found:
            n, done = max(found.items(), key=lambda item: len(item[1]))
            missing = f"machine(s) {sorted(set(range(n)) - done)} of {n} have not finished"
        raise IncompleteRecordsError(
            f"{directory}: data prepare did not finish ({missing}); re-run it to complete the "
            f"{RECORD_SUFFIX} shards before training on them"
        )
    if 1 in complete or recorded.merged_shards in complete:
        return
    raise UnmergedRecordsError(
        f"{directory}: prepared by {complete[0]} machines of an earlier version (--num-shards "
        f"{complete[0]}) whose shards were never merged; prepare it again with --overwrite "
        "(past one machine: --runner beam)"
    )
