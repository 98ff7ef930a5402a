"""A records directory's inputs (identity, text or not) and whether its preparation finished.

``bert-jax data prepare`` records with its settings (``prepare_config.json``) the identity of every
input file: path, size and SHA-256 of the content (streamed, never held in memory). A later run
into the same directory compares them: unchanged inputs resume, changed ones are refused in one
line naming the file unless ``--overwrite`` asks for a rebuild. The same pass refuses input that
is not text (a NUL byte: an image, a library) or not UTF-8 (say Latin-1), naming the file and the
line, before anything is written.

A run removes its machine's ``stats-I-of-N.json`` when it starts and writes it last, so that file
is the completion mark: ``require_complete`` (used by the pipeline) refuses a directory with a
manifest whose machines have not all finished, so a failed or killed run is never trusted.
``RECORDS_KIND`` is the records directory as an output (``files.check_replaceable``).
"""

from __future__ import annotations

import codecs
import gzip
import hashlib
import re

from bert_jax import fs
from bert_jax.data import files
from bert_jax.data.layout import CONFIG_FILE, RECORD_SUFFIX, TOKENIZER_SUBDIR, read_prepare_config
from bert_jax.errors import UserError

INPUTS_KEY = "inputs"
_CHUNK = 1 << 20
_STATS_RE = re.compile(r"^stats-(\d+)-of-(\d+)\.json$")
_OWN_NAME_RE = re.compile(r"^(part-\d+\.(tfrecord|json)|stats-\d+-of-\d+\.json)$")
_OWN_NAMES = (CONFIG_FILE, TOKENIZER_SUBDIR, "prepared-complete.json")

RECORDS_KIND = files.OutputKind(
    name="records directory",
    marker=CONFIG_FILE,
    is_own=lambda path: fs.isfile(fs.join(path, CONFIG_FILE)),
    holds=lambda name: name in _OWN_NAMES or bool(_OWN_NAME_RE.match(name)),
    marker_file=CONFIG_FILE,
)


class InputError(UserError):
    """An input file that cannot be prepared (not text, not UTF-8) or that changed."""


class IncompleteRecordsError(UserError):
    """A records directory whose `data prepare` run has not finished."""


class _TextCheck:
    """Fed a file's bytes in pieces; raises InputError at the first NUL byte or bad UTF-8.

    Lines are counted only when there is an error (counting every piece would cost as much as
    the hash): the file is read again up to the bad byte."""

    def __init__(self, path: str, opener=open):
        self.path, self.opener, self.offset = path, opener, 0
        self.decoder = codecs.getincrementaldecoder("utf-8")()

    def _line(self, offset: int) -> int:
        lines, left = 1, offset
        with self.opener(self.path, "rb") as stream:
            while left > 0 and (chunk := stream.read(min(_CHUNK, left))):
                lines, left = lines + chunk.count(b"\n"), left - len(chunk)
        return lines

    def feed(self, chunk: bytes) -> None:
        if b"\x00" in chunk:
            where = self._line(self.offset + chunk.index(b"\x00"))
            raise InputError(
                f"{self.path}: binary data, not text (a NUL byte on line {where}); "
                "give text files only"
            )
        try:
            if not (chunk.isascii() and not self.decoder.getstate()[0]):  # ASCII: valid as it is
                self.decoder.decode(chunk)
        except UnicodeDecodeError as err:
            pending = len(err.object) - len(chunk)  # bytes held over from the piece before
            where = self._line(self.offset + max(0, err.start - pending))
            raise InputError(
                f"{self.path}: not UTF-8 text (byte 0x{err.object[err.start]:02X} on line "
                f"{where}); convert it first, e.g. iconv -f latin1 -t utf-8"
            ) from None
        self.offset += len(chunk)

    def finish(self) -> None:
        try:
            self.decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            raise InputError(f"{self.path}: not UTF-8 text (it ends inside a character)") from None


def _is_file_source(source: str) -> bool:
    from bert_jax.data.sources import source_kind

    return source_kind(source) == "text" and fs.isfile(source)


def _scan(path: str, digest=None) -> None:
    """One read of `path`: its text checked (decompressed for .gz), `digest` fed the raw bytes."""
    compressed = path.endswith(".gz")
    try:
        if compressed:
            check = _TextCheck(path, gzip.open)
            with fs.open_gzip(path) as stream:
                while chunk := stream.read(_CHUNK):
                    check.feed(chunk)
            check.finish()
        if compressed and digest is None:
            return
        check = None if compressed else _TextCheck(path)
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


def input_identity(sources: list[str]) -> list[dict]:
    """Path, size and SHA-256 of every input file (named sources such as ``embedded`` as they
    are), each checked to be UTF-8 text in the same read (``check_text_inputs``)."""
    identity = []
    for source in sources:
        if not _is_file_source(source):
            identity.append({"source": source})
            continue
        digest = hashlib.sha256()
        _scan(source, digest)
        identity.append(
            {
                "path": fs.abspath(source),
                "size": fs.getsize(source),
                "sha256": digest.hexdigest(),
            }
        )
    return identity


def check_inputs(output_dir: str, inputs: list[dict], overwrite: bool) -> None:
    """Compares `inputs` with those recorded in `output_dir`; refuses a change without
    `overwrite` (with it, the run rebuilds). Directories from before inputs were recorded pass."""
    previous = read_prepare_config(output_dir) if fs.isdir(output_dir) else None
    if not previous or INPUTS_KEY not in previous or overwrite:
        return
    before = {entry.get("path", entry.get("source")): entry for entry in previous[INPUTS_KEY]}
    now = {entry.get("path", entry.get("source")): entry for entry in inputs}
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


def check_output(output_dir: str, inputs: list[dict], overwrite: bool) -> None:
    """Before anything is written: `output_dir` is new, empty or a records directory (with
    `overwrite`, one ``files.check_replaceable`` allows), and its inputs are unchanged."""
    if overwrite:
        files.check_replaceable(output_dir, RECORDS_KIND)
    elif fs.isdir(output_dir) and fs.listdir(output_dir):
        if not RECORDS_KIND.is_own(output_dir):
            raise files.OutputInTheWayError(
                f"{output_dir} holds files but no {CONFIG_FILE} (not a bert-jax records "
                "directory); choose a new or empty --output directory"
            )
    check_inputs(output_dir, inputs, overwrite)


def stats_name(shard_index: int, num_shards: int) -> str:
    return f"stats-{shard_index}-of-{num_shards}.json"


def mark_started(output_dir: str, shard_index: int, num_shards: int) -> None:
    """Removes this machine's completion mark: until it is written again, readers refuse."""
    path = fs.join(output_dir, stats_name(shard_index, num_shards))
    if fs.exists(path):
        fs.remove(path)


def require_complete(directory: str) -> None:
    """Refuses a records directory written by ``data prepare`` whose machines have not all
    finished (a failed, killed or still running preparation). Foreign records pass."""
    if not fs.isdir(directory) or read_prepare_config(directory) is None:
        return
    found: dict[int, set[int]] = {}
    for name in fs.listdir(directory):
        match = _STATS_RE.match(name)
        if match:
            found.setdefault(int(match.group(2)), set()).add(int(match.group(1)))
    if not any(len(done) == n for n, done in found.items()):
        missing = "no stats-*-of-*.json"
        if found:
            n, done = max(found.items(), key=lambda item: len(item[1]))
            missing = f"machine(s) {sorted(set(range(n)) - done)} of {n} have not finished"
        raise IncompleteRecordsError(
            f"{directory}: data prepare did not finish ({missing}); re-run it to complete the "
            f"{RECORD_SUFFIX} shards before training on them"
        )


def _aside_dir(output_dir: str, shard_index: int, num_shards: int) -> str:
    return fs.join(output_dir, f".old-parts-{shard_index}-of-{num_shards}")


def set_aside_parts(output_dir: str, existing: dict[int, set[str]], settings) -> dict:
    """``--overwrite``: moves this machine's shards into a hidden folder (no reader or resumed run
    sees them; ``drop_set_aside`` removes it once the new shards are complete) and returns the
    parts to keep, the other machines'."""
    aside = _aside_dir(output_dir, settings.shard_index, settings.num_shards)
    kept = {}
    for group, suffixes in existing.items():
        if group % settings.num_shards != settings.shard_index:
            kept[group] = suffixes
            continue
        fs.makedirs(aside, exist_ok=True)
        for suffix in sorted(suffixes):
            name = f"part-{group:05d}.{suffix}"
            fs.rename(fs.join(output_dir, name), fs.join(aside, name))
    return kept


def drop_set_aside(output_dir: str, settings) -> None:
    """After a complete run: this machine's old shards (``set_aside_parts``) are removed."""
    fs.rmtree(_aside_dir(output_dir, settings.shard_index, settings.num_shards), True)
