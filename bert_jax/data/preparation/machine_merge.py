"""Merging the records of several machines (``data prepare --shard-index I --num-shards N``, then
``--merge``): each machine's completion mark holds its manifest and the document groups it wrote;
``join_shards`` checks the N of them against each other and the records on disk and returns the
one manifest that readers trust."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from bert_jax.data.layout import RECORD_SUFFIX
from bert_jax.data.records.manifest import Manifest, ShardsError, input_key, stats_name


def shard_record(manifest: Manifest, total_groups: int, parts: list[int]) -> dict:
    """What a machine's completion mark says of its shard, for ``join_shards``: its manifest,
    the number of document groups in the whole input and the groups it holds a part of."""
    return {"manifest": manifest.to_json(), "input_groups": total_groups, "parts": sorted(parts)}


def _input_token(entry: Mapping[str, Any]) -> str:
    """An input by content (a file's SHA-256) or by name (``embedded``, ``tfds:...``): machines
    may see one file under different paths."""
    return entry["sha256"] if "sha256" in entry else f"source:{entry.get('source')}"


def _shards_text(indices: list[int]) -> str:
    return ("shard " if len(indices) == 1 else "shards ") + ", ".join(map(str, indices))


def _check_same_inputs(manifests: dict[int, Manifest], num_shards: int) -> None:
    """Every shard read the same inputs (by content), in the same order: each group's
    documents, and so its records, depend on all the inputs before it."""
    holders: dict[str, list[int]] = {}
    names: dict[str, str] = {}
    for index, shard in manifests.items():
        for entry in shard.inputs or ():
            token = _input_token(entry)
            holders.setdefault(token, []).append(index)
            names.setdefault(token, input_key(entry))
    for token, indices in holders.items():
        if len(set(indices)) < num_shards:
            missing = sorted(set(range(num_shards)) - set(indices))
            raise ShardsError(
                f"input {names[token]} was read by {_shards_text(sorted(set(indices)))} but not "
                f"by {_shards_text(missing)} of {num_shards}: every machine must prepare the "
                "same --input (each writes its share of the groups of the whole input)"
            )
    orders = {i: [_input_token(e) for e in m.inputs or ()] for i, m in manifests.items()}
    for index, order in orders.items():
        if order != orders[0]:
            raise ShardsError(
                f"shard {index} of {num_shards} read the inputs in another order than shard 0 "
                "(the groups differ); give --input in the same order on every machine"
            )


def join_shards(
    directory: str, num_shards: int, shards: Mapping[int, Mapping], parts: Mapping[int, set[str]]
) -> Manifest:
    """The one manifest of `directory` from the completion marks of its `num_shards` machines.

    `shards`: machine index -> the ``shard_record`` in its ``stats-I-of-N.json`` (None: a mark
    written before shards were recorded); `parts`:
    ``groups.existing_parts`` of the directory. Refuses (ShardsError, one line naming it) a
    machine that has not finished, shards that differ in a setting or the tokenizer, an input
    that not every shard read, and a part that no shard or two shards account for, or that a
    shard wrote and is gone.
    """
    missing = [i for i in range(num_shards) if i not in shards]
    if missing:
        names = ", ".join(stats_name(i, num_shards) for i in missing)
        raise ShardsError(
            f"{_shards_text(missing)} of {num_shards} did not finish ({directory} has no "
            f"{names}); run data prepare with --shard-index {missing[0]} --num-shards "
            f"{num_shards} again (it resumes), then --merge"
        )
    manifests: dict[int, Manifest] = {}
    for index in range(num_shards):
        if not shards[index]:
            stats = os.path.join(directory, stats_name(index, num_shards))
            raise ShardsError(
                f"{stats} holds no manifest (written "
                f"before shards could be merged); run data prepare with --shard-index {index} "
                f"--num-shards {num_shards} again (it resumes, writing no records), then --merge"
            )
        manifests[index] = Manifest.from_json(shards[index]["manifest"])
    _check_same_inputs(manifests, num_shards)
    for index in range(1, num_shards):
        changed = manifests[0].setting_changes(manifests[index])
        if changed:
            raise ShardsError(
                f"shard {index} of {num_shards} was prepared with other settings than shard 0 "
                f"({'; '.join(changed)}); prepare it again with the same settings "
                "(--overwrite), then --merge"
            )
    groups = {index: shards[index]["input_groups"] for index in range(num_shards)}
    if len(set(groups.values())) > 1:
        counts = ", ".join(f"shard {i}: {n}" for i, n in groups.items())
        raise ShardsError(
            f"the shards of {directory} cut the input into different numbers of document groups "
            f"({counts}): they did not read the same documents (e.g. another --max-line-bytes); "
            "prepare them again with the same settings"
        )
    owner: dict[int, int] = {}
    for index in range(num_shards):
        for group in shards[index]["parts"]:
            if group in owner:
                raise ShardsError(
                    f"{directory}: part-{group:05d}{RECORD_SUFFIX} is claimed by shards "
                    f"{owner[group]} and {index} of {num_shards}; prepare one of them again"
                )
            owner[group] = index
            if not {"tfrecord", "json"} <= parts.get(group, set()):
                raise ShardsError(
                    f"{directory}: part-{group:05d}{RECORD_SUFFIX} of shard {index} of "
                    f"{num_shards} is missing; run data prepare with --shard-index {index} "
                    f"--num-shards {num_shards} again (it rewrites it), then --merge"
                )
    strays = sorted(g for g, suffixes in parts.items() if "tfrecord" in suffixes and g not in owner)
    if strays:
        raise ShardsError(
            f"{directory}: part-{strays[0]:05d}{RECORD_SUFFIX} belongs to none of the "
            f"{num_shards} shards (left by another run?); remove it, or prepare every shard "
            "again with --overwrite"
        )
    return dataclasses.replace(manifests[0], merged_shards=num_shards)
