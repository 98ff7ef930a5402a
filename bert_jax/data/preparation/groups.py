"""Prepare's unit of work: one group of documents -> one TFRecord shard ``part-NNNNN.tfrecord``.

Documents go to groups by a hash of their key, not by their place in the stream: document ``key``
(``splits.DocKey``: its source and position there, whatever split it was read in) belongs to group
``group_of(seed, key, num_groups)``. Every group is thus a random sample of the whole corpus (as a
global shuffle gives), and its documents are the same whichever worker, machine or engine read
them. The same functions serve the local process pool and the Beam pipeline, so both write the
same bytes: ``assign_documents`` reads one split into ``(group, (key, document))`` pairs;
``sorted_documents`` orders one group's documents by key; ``process_group`` (a worker without
TensorFlow) tokenizes them, makes ``dupe_factor`` passes of masked instances (random next
sentences come from the same group, so from across the corpus), shuffles and serializes them;
``write_group`` writes the shard and its counts, each under a temporary name renamed when whole
(a retried group rewrites the same bytes). Group ``g`` is seeded by ``(seed, g)`` alone.
``existing_parts`` lists what an earlier run already wrote; ``remove_stale_temporaries`` removes
the temporary names of a writer that was killed.

Held-out documents (``Heldout``) are chosen by a hash of their key too, so every runner holds out
the same ones: a document whose ``heldout_rank`` falls below ``share`` of the hash's range is held
out, and while fewer than the floor (``layout.HELDOUT_MIN_DOCUMENTS``, at most a tenth of the
corpus) are, the documents of lowest rank make up the difference. ``route_documents`` reads one
split into training and held-out documents and notes in a ``Routing`` the split's lowest-ranked
training documents; ``floor_documents`` picks, from every split's ``Routing``, the ones the floor
moves to the held-out records. Held-out document ``key`` goes to held-out group
``group_of(seed, key, heldout.num_groups)``, a shard in ``heldout/`` made as any other.
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import logging
import math
import os
import re
import socket
import struct
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from bert_jax.data import objectives
from bert_jax.data.instances import sentence_pairs as instances_lib
from bert_jax.data.instances import single_segments
from bert_jax.data.layout import DEFAULT_GROUP_BYTES, HELDOUT_FLOOR_CAP, HELDOUT_MIN_DOCUMENTS
from bert_jax.data.masking.settings import MaskingConfig
from bert_jax.data.records import tfrecord as records_lib
from bert_jax.data.sources import splits as splits_lib
from bert_jax.data.tokenizers.interface import Tokenizer
from bert_jax.runtime import fs
from bert_jax.runtime.outputs import write_json_atomic

logger = logging.getLogger(__name__)

_PART_RE = re.compile(r"^part-(\d{5,})\.(tfrecord|json)$")
# What ``outputs.temporary_name`` makes of a part's name: left behind only by a killed writer.
_PART_TEMPORARY_RE = re.compile(
    r"^\.part-\d{5,}\.(tfrecord|json)\.tmp-(?P<host>.+)-(?P<pid>\d+)-[0-9a-f]+"
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


_TIMINGS = ("seconds", "cpu_seconds")  # InstanceStats fields that vary from run to run


def _group_seed(seed: int, group_index: int) -> int:
    return int(np.random.SeedSequence([seed, group_index]).generate_state(1, np.uint64)[0])


def part_name(group_index: int, suffix: str = "tfrecord") -> str:
    return f"part-{group_index:05d}.{suffix}"


def group_of(seed: int, key: tuple[int, ...], num_groups: int) -> int:
    """The group of the document ``key`` (``splits.DocKey``): a stable hash of the seed and the
    key (BLAKE2b; never Python's ``hash``, which differs between processes), modulo the groups."""
    packed = struct.pack(f"<{len(key) + 1}q", seed, *key)
    digest = hashlib.blake2b(packed, digest_size=8).digest()
    return int.from_bytes(digest, "little") % num_groups


def derive_num_groups(input_bytes: int, group_bytes: int = DEFAULT_GROUP_BYTES) -> int:
    """Groups for ``input_bytes`` of input when ``--num-groups`` is not given: one per
    ``group_bytes`` (as stored: compressed dumps and Parquet count compressed), at least one."""
    return max(1, math.ceil(input_bytes / group_bytes))


def assign_documents(
    split, stats, seed: int, num_groups: int, reader_options: dict, keep=None
) -> Iterator[tuple[int, tuple[tuple[int, ...], list[str]]]]:
    """The documents of one split (``splits.read_split``, counted into ``stats``; a file that is
    not text refused as it is read) as ``(group, (key, document))``; ``keep``: the groups wanted
    (None: all)."""
    for key, document in splits_lib.read_split(split, stats, check_text=True, **reader_options):
        if not document:  # a page that is no article, an empty document: counted by the reader
            continue
        group = group_of(seed, key, num_groups)
        if keep is None or group in keep:
            yield group, (tuple(key), document)


_RANKS = 1 << 64  # heldout_rank's range


def heldout_rank(key: tuple[int, ...]) -> int:
    """Where document ``key`` stands in the held-out order: a stable 64-bit hash of the key
    alone (not the seed: another seed holds out the same documents), independent of
    ``group_of``'s."""
    packed = struct.pack(f"<{len(key)}q", *key)
    digest = hashlib.blake2b(packed, digest_size=8, person=b"bert-jax-heldout").digest()
    return int.from_bytes(digest, "little")


@dataclass(frozen=True)
class Heldout:
    """Which documents are held out: ``share`` of them (by ``heldout_rank``), in ``num_groups``
    groups of their own seeded by ``seed``."""

    share: float
    num_groups: int
    seed: int

    def holds(self, rank: int) -> bool:
        return rank < int(self.share * _RANKS)

    def group(self, key: tuple[int, ...]) -> int:
        return group_of(self.seed, key, self.num_groups)


@dataclass
class Routing:
    """What ``route_documents`` noted of one split: its documents, those held out by share, and
    ``candidates``: its lowest-ranked training documents as ``(rank, key, group)``, the ones the
    floor may move (``floor_documents``). Small: no text."""

    documents: int = 0
    held: int = 0
    candidates: list = field(default_factory=list)

    def as_tuple(self) -> tuple:
        return self.documents, self.held, self.candidates


def route_documents(
    split,
    stats,
    seed: int,
    num_groups: int,
    reader_options: dict,
    heldout: Heldout | None,
    routing: Routing,
    keep=None,
) -> Iterator[tuple[bool, int, tuple[tuple[int, ...], list[str]]]]:
    """``assign_documents`` with the held-out documents apart: ``(held_out, group, (key,
    document))``, a held-out document in its held-out group. ``routing`` is filled as the split
    is read. ``keep``: None, or ``(training groups, held-out groups)`` wanted."""
    lowest: list = []  # a max-heap (negated ranks) of the lowest-ranked training documents
    for group, keyed in assign_documents(split, stats, seed, num_groups, reader_options):
        routing.documents += 1
        held = False
        if heldout is not None:
            rank = heldout_rank(keyed[0])
            held = heldout.holds(rank)
            if held:
                routing.held += 1
                group = heldout.group(keyed[0])
            elif len(lowest) < HELDOUT_MIN_DOCUMENTS:
                heapq.heappush(lowest, (-rank, keyed[0], group))
            elif -lowest[0][0] > rank:
                heapq.heapreplace(lowest, (-rank, keyed[0], group))
        if keep is None or group in keep[held]:
            yield held, group, keyed
    routing.candidates = sorted((-rank, key, group) for rank, key, group in lowest)


def floor_documents(routings: Iterable[tuple], heldout: Heldout | None) -> dict[tuple, int]:
    """The training documents the floor holds out, ``{key: held-out group}``, from every split's
    ``Routing.as_tuple()``: the lowest-ranked, until ``HELDOUT_MIN_DOCUMENTS`` (at most one in
    ``HELDOUT_FLOOR_CAP`` of the documents) are held out."""
    if heldout is None:
        return {}
    documents, held, candidates = 0, 0, []
    for split_documents, split_held, split_candidates in routings:
        documents += split_documents
        held += split_held
        candidates.extend(tuple(c[:2]) for c in split_candidates)
    chosen = heapq.nsmallest(max(0, floor_size(documents) - held), candidates)
    return {tuple(key): heldout.group(tuple(key)) for _, key in chosen}


def floor_size(documents: int) -> int:
    """How many documents the floor wants held out of ``documents``: ``HELDOUT_MIN_DOCUMENTS``,
    at most one in ``HELDOUT_FLOOR_CAP``; none below two (one document alone makes no sentence
    pair: the floor would only lose it)."""
    floor = min(HELDOUT_MIN_DOCUMENTS, documents // HELDOUT_FLOOR_CAP)
    return floor if floor >= 2 else 0


FLOOR_WORDS = f"at least {HELDOUT_MIN_DOCUMENTS} documents, at most one in {HELDOUT_FLOOR_CAP}"


@dataclass(frozen=True)
class HeldoutCount:
    """How many of the corpus's ``documents`` were held out, and why: ``by_share`` by their hash
    (``Heldout.holds``), ``by_floor`` more to reach the floor (``floor_documents``)."""

    documents: int
    by_share: int
    by_floor: int

    @property
    def held_out(self) -> int:
        return self.by_share + self.by_floor

    def words(self, share: float) -> str:
        """ "9 of 97 documents: 0 by the 1.0% share (--heldout-share), 9 more to reach the floor
        of 9 (at least 100 documents, at most one in 10)" and the like."""
        counted = f"{self.held_out} of {self.documents} documents"
        shared = f"the {share:.1%} share (--heldout-share)"
        floor = floor_size(self.documents)
        if self.by_floor:
            return (
                f"{counted}: {self.by_share} by {shared}, {self.by_floor} more to reach the floor "
                f"of {floor} ({FLOOR_WORDS})"
            )
        if floor:
            return f"{counted}, by {shared}, above the floor of {floor} ({FLOOR_WORDS})"
        return f"{counted}, by {shared}: too few documents for a floor ({FLOOR_WORDS})"

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def sorted_documents(keyed: Iterable[tuple[tuple[int, ...], list[str]]]) -> list[list[str]]:
    """One group's documents in key order: the order in which they were read, or by which
    worker, does not matter."""
    return [document for _, document in sorted(keyed, key=lambda item: item[0])]


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
        **{k: settings.get(k, objectives.BEFORE_RECORDED[k]) for k in objectives.SHARE_KEYS},
    )
    instance_format = settings.get("instance_format", "sentence_pairs")
    make_rows = instances_lib.create_instance_rows
    # The recorded share, or the one every record was made with before it was recorded.
    before = objectives.BEFORE_RECORDED["random_next_prob"]
    extra = {"random_next_prob": settings.get("random_next_prob", before)}
    if instance_format != "sentence_pairs":  # no NSP: [CLS] text [SEP] rows
        make_rows = single_segments.create_single_rows
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
    """The shard and its counts, each written whole under a temporary name and renamed (an object
    in a bucket appears whole when closed): a retried group leaves the same bytes, never two
    copies or a half-written file under a part's name."""
    if not serialized:
        return
    # The sidecar goes first: a shard under its final name always has its counts next to it.
    # Its counts only, not the worker's timings: the same bytes whichever attempt wrote it.
    sidecar = {k: v for k, v in counts.items() if k not in _TIMINGS}
    write_json_atomic(os.path.join(output_dir, part_name(group_index, "json")), sidecar)
    records_lib.write_records(os.path.join(output_dir, part_name(group_index)), serialized)


def remove_stale_temporaries(output_dir: str, everyone_done: bool = False) -> int:
    """Removes the temporary names (``.part-NNNNN.tfrecord.tmp-HOST-PID-...``) that writers
    killed mid-shard left in ``output_dir``; returns how many. Only those of this host's dead
    processes, unless ``everyone_done`` (a Beam job's last step: no writer is left): other
    machines may be writing into the same directory."""
    host, stale = socket.gethostname(), []
    for name in fs.listdir(output_dir):
        match = _PART_TEMPORARY_RE.match(name)
        if match and (
            everyone_done or (match["host"] == host and not process_alive(int(match["pid"])))
        ):
            stale.append(name)
    for name in stale:
        fs.remove(os.path.join(output_dir, name))
    return len(stale)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host still runs."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def existing_parts(output_dir: str) -> dict[int, set[str]]:
    parts: dict[int, set[str]] = {}
    for name in fs.listdir(output_dir):
        match = _PART_RE.match(name)
        if match:
            parts.setdefault(int(match.group(1)), set()).add(match.group(2))
    return parts
