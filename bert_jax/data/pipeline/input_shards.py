"""Input shards: the global batch drawn from a fixed number of disjoint readers, whatever the
number of processes.

A run with `num_shards = S` (`config.data.shards`; 0 means one per process) builds each global
batch of B rows from S readers of B/S rows each; reader `s` reads the `s`-th of S disjoint parts
of the data (`tf_data.make_pretrain_iterator` with the run's `PipelineSettings` at
`process_index=s, process_count=S`). Process `p` of
P runs readers `p*S/P ... (p+1)*S/P - 1` and passes their rows, in that order, as its part of the
batch. So the examples of every step, and the data position saved in a checkpoint (one row per
shard), depend on S only: a job can resume exactly on a different number of hosts, and one
process can reproduce what many computed (the multi-process tests do).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from bert_jax.runtime.errors import UserError


def layout(shards_setting: int, process_index: int, process_count: int) -> tuple[int, int, int]:
    """(first shard of this process, shards per process, total shards) for `config.data.shards`.

    Raises a UserError naming the setting when the shards cannot be split evenly over processes.
    """
    total = int(shards_setting) or process_count
    if total < 1 or total % process_count:
        raise UserError(
            f"config.data.shards={shards_setting} must be a positive multiple of the number of "
            f"processes ({process_count}), or 0 for one shard per process"
        )
    per_process = total // process_count
    return process_index * per_process, per_process, total


class ShardedInput:
    """Several per-shard iterators concatenated into this process's part of the batch.

    `get_state()` lists this process's shard positions; `set_state(table)` takes the positions
    of all shards (indexed by shard) and restores the ones this process reads.
    """

    def __init__(self, readers: Sequence[Any], first_shard: int, num_shards: int):
        if not readers:
            raise RuntimeError("ShardedInput needs at least one reader")  # a bug in the caller
        self.readers = list(readers)
        self.first_shard = first_shard
        self.num_shards = num_shards

    @classmethod
    def build(
        cls,
        make_reader: Callable[[int, int, int], Any],
        *,
        global_batch_size: int,
        shards_setting: int,
        process_index: int,
        process_count: int,
    ) -> ShardedInput:
        """`make_reader(shard_index, num_shards, batch_size)` for each shard of this process."""
        first, count, total = layout(shards_setting, process_index, process_count)
        if global_batch_size % total:
            raise UserError(
                f"global batch size {global_batch_size} is not divisible by the {total} input "
                "shards (config.data.shards, 0 = one per process)"
            )
        size = global_batch_size // total
        return cls([make_reader(first + j, total, size) for j in range(count)], first, total)

    @property
    def shard_indices(self) -> range:
        return range(self.first_shard, self.first_shard + len(self.readers))

    @property
    def corrupt_files(self) -> dict[str, int]:
        """Damaged files skipped by this process's readers: path -> first damaged record."""
        return {p: i for r in self.readers for p, i in getattr(r, "corrupt_files", {}).items()}

    @property
    def corrupt_records(self) -> int:
        """Damaged records skipped by all of this process's readers (for the metrics)."""
        return len(self.corrupt_files)

    def __iter__(self) -> ShardedInput:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        batches = [next(reader) for reader in self.readers]
        if len(batches) == 1:
            return batches[0]
        return {key: np.concatenate([b[key] for b in batches]) for key in batches[0]}

    def get_state(self) -> list[dict[str, Any]]:
        return [reader.get_state() for reader in self.readers]

    def set_state(self, table: Sequence[dict[str, Any] | None]) -> None:
        """Restores from the positions of all `num_shards` shards (shard `s` at index `s`)."""
        if len(table) != self.num_shards:
            raise UserError(
                f"the saved data position has {len(table)} input shards, this run reads "
                f"{self.num_shards} (config.data.shards); it cannot be resumed exactly"
            )
        for shard, reader in zip(self.shard_indices, self.readers):
            if table[shard] is None:
                # Checkpoints save every shard's row: a missing one is a bug, not a setting.
                raise RuntimeError(f"the saved data position has no entry for input shard {shard}")
            reader.set_state(table[shard])
