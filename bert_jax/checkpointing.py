"""Orbax checkpoints of the train state together with every host's data-iterator position.

A checkpoint holds two items: `state` (the TrainState, saved sharded by all hosts) and `data` (a
small int32 array, one row per device, in which each device's row records its own host's iterator
position: phase, epoch, batches in epoch, batches in total and a fingerprint of the input
configuration). Saving the position as a sharded array makes it multi-host for free: every host
writes its rows and reads back its own, with the same Orbax machinery as the parameters.

Resume order (`pretrain.py`): latest checkpoint in the workdir > an explicit checkpoint
(`config.resume_from`) > a model directory (`config.init_from`, params only) > scratch.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bert_jax import partitioning

# Columns of the data-position array.
_FIELDS = ("phase", "epoch", "batches_in_epoch", "batches_total", "fp0", "fp1", "fp2", "fp3")


def _position_sharding(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec(partitioning.MESH_AXES))


def encode_position(phase: int, iterator_state: dict[str, Any] | None, mesh: Mesh) -> jax.Array:
    """This host's iterator position as rows of a global [num_devices, 8] int32 array."""
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
    local = np.tile(row, (len(mesh.local_devices), 1))
    return jax.make_array_from_process_local_data(_position_sharding(mesh), local)


def decode_position(position: jax.Array) -> tuple[int, dict[str, Any] | None]:
    """(phase, iterator state) of this host, from the rows its own devices hold."""
    row = np.asarray(position.addressable_shards[0].data)[0]
    phase = int(row[0])
    if row[1] < 0:
        return phase, None
    fingerprint = sum(int(row[4 + i]) << (16 * i) for i in range(4))
    return phase, {
        "version": 1,
        "epoch": int(row[1]),
        "batches_in_epoch": int(row[2]),
        "batches_total": int(row[3]),
        "fingerprint": f"{fingerprint:016x}",
    }


def abstract_position(mesh: Mesh) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(
        (mesh.devices.size, len(_FIELDS)), np.int32, sharding=_position_sharding(mesh)
    )


_CPU_HANDLER_REGISTERED = False


def _serial_saves_on_cpu() -> None:
    """On CPU, save each replicated array whole instead of in per-replica slices.

    Replica-parallel saving slices every replicated array with a jitted op per shape; on TPU and
    GPU that spreads the write over replicas, on (emulated) CPU devices it only costs a compile
    per shape (~0.3 s each, 30+ per checkpoint of even a tiny model).
    """
    global _CPU_HANDLER_REGISTERED
    if jax.default_backend() == "cpu" and not _CPU_HANDLER_REGISTERED:
        # Orbax warns about every override; this one is deliberate.
        absl_logger = logging.getLogger("absl")
        level = absl_logger.level
        absl_logger.setLevel(logging.ERROR)
        try:
            ocp.type_handlers.register_type_handler(
                jax.Array, ocp.type_handlers.ArrayHandler(use_replica_parallel=False), override=True
            )
        finally:
            absl_logger.setLevel(level)
        _CPU_HANDLER_REGISTERED = True


class Checkpointer:
    """Keeps the last `keep` checkpoints under `directory`, saved asynchronously."""

    def __init__(self, directory: str, keep: int = 3, async_save: bool = True):
        _serial_saves_on_cpu()
        self.directory = os.path.abspath(directory)
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=keep,
                create=True,
                enable_async_checkpointing=async_save,
            ),
            item_names=("state", "data"),
        )

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self.manager.all_steps())

    def save(self, step: int, state: Any, position: jax.Array) -> bool:
        """Starts an (asynchronous) save of `state` and `position` at `step`."""
        return self.manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state),
                data=ocp.args.StandardSave({"position": position}),
            ),
            force=True,
        )

    def restore(
        self, abstract_state: Any, mesh: Mesh, step: int | None = None, with_data: bool = True
    ) -> tuple[Any, int | None, dict[str, Any] | None]:
        """(state, phase, iterator state of this host) from `step` (default: the latest).

        The data position is per device; when the device count changed since the save (or with
        `with_data=False`) only the state is restored and the position comes back as None.
        """
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        state_args = ocp.args.StandardRestore(abstract_state)
        if with_data:
            try:
                restored = self.manager.restore(
                    step,
                    args=ocp.args.Composite(
                        state=state_args,
                        data=ocp.args.StandardRestore({"position": abstract_position(mesh)}),
                    ),
                )
            except ValueError as err:
                if "not compatible with the stored shape" not in str(err):
                    raise
                logging.getLogger("bert_jax").warning(
                    "checkpoint %d was saved on a different number of devices: restoring the "
                    "train state only; the data pipeline starts its phase afresh",
                    step,
                )
            else:
                phase, iterator_state = decode_position(restored["data"]["position"])
                return restored["state"], phase, iterator_state
        restored = self.manager.restore(step, args=ocp.args.Composite(state=state_args))
        return restored["state"], None, None

    def reached_preemption(self, step: int) -> bool:
        """True when the runtime (e.g. a TPU maintenance event) asks for a save and exit."""
        return self.manager.reached_preemption(step)

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.close()


def find_checkpoint_dir(path: str) -> str:
    """A workdir (`<path>/checkpoints`) or a checkpoints directory itself."""
    candidate = os.path.join(path, "checkpoints")
    return candidate if os.path.isdir(candidate) else path
