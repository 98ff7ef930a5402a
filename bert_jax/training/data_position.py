"""Every input shard's data-iterator position as one small replicated array, saved in each
checkpoint beside the train state (`checkpointing.py`): a row per shard (phase, epoch, batches in
epoch, batches in total, a fingerprint of the shard's input configuration), all-gathered from the
hosts that read them, so the position survives a change in the number of hosts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

# Columns of the data-position array.
_FIELDS = ("phase", "epoch", "batches_in_epoch", "batches_total", "fp0", "fp1", "fp2", "fp3")


def _position_sharding(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def _position_row(phase: int, iterator_state: dict[str, Any] | None) -> np.ndarray:
    row = np.zeros((len(_FIELDS),), np.int32)
    row[0] = phase
    if iterator_state is not None:
        row[1] = iterator_state["epoch"]
        row[2] = iterator_state["batches_in_epoch"]
        row[3] = iterator_state["batches_total"]
        fingerprint = int(iterator_state["fingerprint"], 16)
        row[4:8] = [(fingerprint >> (16 * i)) & 0xFFFF for i in range(4)]
    else:
        row[1:] = -1
    return row


def encode_position(
    phase: int,
    shard_states: Sequence[dict[str, Any] | None] | dict[str, Any] | None,
    mesh: Mesh,
) -> jax.Array:
    """The positions of all input shards as a replicated [num_shards, 8] int32 array.

    `shard_states` are this host's shard positions in shard order (one dict or None for a single
    shard; None: not started). Hosts hold consecutive shards, so the all-gathered rows come out
    in shard order. A collective in multi-host runs: every host calls it at the same step.
    """
    if shard_states is None or isinstance(shard_states, dict):
        shard_states = [shard_states]
    local = np.stack([_position_row(phase, state) for state in shard_states])
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        local = np.asarray(multihost_utils.process_allgather(local)).reshape(-1, len(_FIELDS))
    return jax.make_array_from_process_local_data(_position_sharding(mesh), local)


def decode_position(position: jax.Array) -> tuple[int, list[dict[str, Any] | None] | None]:
    """(phase, positions of all input shards indexed by shard) or (phase, None) if not started."""
    table = np.asarray(position.addressable_shards[0].data)
    phase = int(table[0, 0])
    states: list[dict[str, Any] | None] = []
    for row in table:
        if row[1] < 0:
            states.append(None)
            continue
        fingerprint = sum(int(row[4 + i]) << (16 * i) for i in range(4))
        states.append(
            {
                "version": 1,
                "epoch": int(row[1]),
                "batches_in_epoch": int(row[2]),
                "batches_total": int(row[3]),
                "fingerprint": f"{fingerprint:016x}",
            }
        )
    if all(state is None for state in states):
        return phase, None
    return phase, states


def abstract_position(mesh: Mesh, num_shards: int = 1) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(
        (num_shards, len(_FIELDS)), np.int32, sharding=_position_sharding(mesh)
    )
