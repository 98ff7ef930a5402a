"""Orbax checkpoints of the train state together with every host's data-iterator position.

A checkpoint holds two items: `state` (the TrainState, saved sharded by all hosts) and `data` (a
small replicated int32 array with one row per input shard, `data/pipeline/input_shards.py`:
phase, epoch, batches in epoch, batches in total and a fingerprint of the shard's input
configuration). Every host contributes the rows of the shards it reads (one all-gather per save)
and, on restore, picks the rows of the shards it reads now, so the position survives a change in
the number of hosts.

Resume order (`pretrain.py`): latest checkpoint in the workdir > an explicit checkpoint
(`config.resume_from`) > a model directory (`config.init_from`, params only) > scratch.

Faults: `restore_intact` skips checkpoints that cannot be restored (a truncated or missing file,
missing metadata, other shapes than the run's), newest first, and says why in one line each;
`set_aside` then renames them to `<step>.corrupt-<UTC time>` (never deleted; Orbax lists only
`<step>`). A save that runs out of disk space ends in `CheckpointSaveError` naming the checkpoint
and the previous intact step; `remove_leftovers` deletes the temporary directories of saves that
a killed run left behind. In a bucket Orbax writes a save straight into `<step>/` and marks it
complete with `commit_success.txt` last: a step without it (a save killed midway) is not listed by
Orbax; `set_aside_uncommitted` renames it to `<step>.uncommitted-<UTC time>` (never deleted: a
checkpoint copied into the bucket from disk lacks the file too).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import re
import shutil
import signal
from typing import Any

import jax
import orbax.checkpoint as ocp
from jax.sharding import Mesh

from bert_jax.runtime import checkpoint_health, fs
from bert_jax.runtime.errors import UserError
from bert_jax.training.data_position import abstract_position, decode_position

log = logging.getLogger("bert_jax")

# What Orbax names a save in progress: `<step>.orbax-checkpoint-tmp[-<timestamp>]`.
_TMP_SAVE = re.compile(r"^\d+\.orbax-checkpoint-tmp(-\d+)?$")
# What Orbax writes last into a save in a bucket (its CommitFileTemporaryPath).
COMMIT_MARKER = "commit_success.txt"


def _utc_stamp() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


class CheckpointError(UserError):
    """No checkpoint of the workdir can be restored."""


class CheckpointSaveError(UserError):
    """A checkpoint could not be written (e.g. a full disk); the previous one is intact."""


class _QuietFailedSave(logging.Filter):
    """Drops Orbax's tracebacks of a save that ran out of disk space (each of its threads logs
    one, dozens of lines each) and what its threads log after it: CheckpointSaveError says it in
    one line."""

    failed = False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and checkpoint_health.disk_full(record.exc_info[1]) is not None:
            _QuietFailedSave.failed = True
        return not (_QuietFailedSave.failed and record.levelno >= logging.ERROR)


_QUIET_FAILED_SAVE = _QuietFailedSave()
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


# How long a failed save's other writes may take to settle before its event loop closes anyway.
_SETTLE_TIMEOUT_S = 60.0
_SETTLING_INSTALLED = False


async def _settled(coro: Any) -> Any:
    """`coro`; when it fails, the other tasks of its event loop are awaited first.

    Orbax runs a save's writes as one `asyncio.gather` of TensorStore futures on an event loop of
    its own (`asyncio_utils.run_sync`) and closes the loop as soon as one write fails. The writes
    still in flight end later in TensorStore's threads, each calling the closed loop's
    `call_soon_threadsafe`: a `RuntimeError: Event loop is closed` traceback each on stderr (29 to
    138 of them on a full disk). They end quickly (failing too, on a full disk); a write that
    never ends keeps the loop no longer than `_SETTLE_TIMEOUT_S`.
    """
    try:
        return await coro
    except Exception:
        others = asyncio.all_tasks() - {asyncio.current_task()}
        if others:
            done, _ = await asyncio.wait(others, timeout=_SETTLE_TIMEOUT_S)
            for task in done:  # their errors repeat the one raised below
                if not task.cancelled():
                    task.exception()
        raise


def _settle_failed_writes() -> None:
    """Routes Orbax's coroutines (every save and restore) through `_settled`, once."""
    global _SETTLING_INSTALLED
    if _SETTLING_INSTALLED:
        return
    from orbax.checkpoint._src import asyncio_utils

    run_sync = asyncio_utils.run_sync
    asyncio_utils.run_sync = lambda coro: run_sync(_settled(coro))
    _SETTLING_INSTALLED = True


class Checkpointer:
    """Keeps the last `keep` checkpoints under `directory`, saved asynchronously."""

    def __init__(self, directory: str, keep: int = 3, async_save: bool = True):
        _serial_saves_on_cpu()
        _settle_failed_writes()
        logging.getLogger("absl").addFilter(_QUIET_FAILED_SAVE)  # once: a set of filters
        self.directory = fs.abspath(directory)
        self._saving: int | None = None
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
        """Starts an (asynchronous) save of `state` and `position` at `step`.

        Raises CheckpointSaveError when the disk is full (this save, or an earlier asynchronous
        one that failed meanwhile)."""
        # Orbax's save waits for the previous one first and re-raises its failure: waiting here
        # names that save's step, not this one (and Orbax already lists the failed step).
        self.wait()
        previous = self.latest_step()
        self._saving = step
        _QuietFailedSave.failed = False
        try:
            return self.manager.save(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(state),
                    data=ocp.args.StandardSave({"position": position}),
                ),
                force=True,
            )
        except Exception as err:
            self._raise_if_disk_full(err, step, previous)
            raise

    def restore(
        self,
        abstract_state: Any,
        mesh: Mesh,
        step: int | None = None,
        with_data: bool = True,
        num_shards: int = 1,
    ) -> tuple[Any, int | None, list[dict[str, Any] | None] | None]:
        """(state, phase, positions of all `num_shards` input shards) from `step` (default: the
        latest).

        When the checkpoint was saved with another number of input shards (or with
        `with_data=False`) only the state is restored and the position comes back as None.
        """
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"no checkpoint in {self.directory}")
        state_args = ocp.args.StandardRestore(abstract_state)
        if with_data:
            try:
                restored = self.manager.restore(
                    step,
                    args=ocp.args.Composite(
                        state=state_args,
                        data=ocp.args.StandardRestore(
                            {"position": abstract_position(mesh, num_shards)}
                        ),
                    ),
                )
            except ValueError as err:
                if "not compatible with the stored shape" not in str(err):
                    raise
                log.warning(
                    "checkpoint %d was saved with another number of input shards "
                    "(config.data.shards, 0 = one per host): restoring the train state only; the "
                    "data pipeline starts its phase afresh",
                    step,
                )
            else:
                phase, shard_states = decode_position(restored["data"]["position"])
                return restored["state"], phase, shard_states
        restored = self.manager.restore(step, args=ocp.args.Composite(state=state_args))
        return restored["state"], None, None

    def restore_params(self, abstract_params: Any, step: int | None = None) -> tuple[Any, int]:
        """(params, step) from the train state saved at `step` (default: the latest).

        An Orbax partial restore: only the params are read, never the optimizer state, so no
        optimizer (nor its config) is needed to build the target.
        """
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"no checkpoint in {self.directory}")
        target = {"params": abstract_params}
        restored = self.manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.PyTreeRestore(
                    item=target,
                    restore_args=ocp.checkpoint_utils.construct_restore_args(target),
                    partial_restore=True,
                )
            ),
        )
        return restored["state"]["params"], step

    def reached_preemption(self, step: int) -> bool:
        """True when the runtime (e.g. a TPU maintenance event) asks for a save and exit."""
        return self.manager.reached_preemption(step)

    def wait(self) -> None:
        """Waits for the pending save; CheckpointSaveError if it ran out of disk space."""
        try:
            self.manager.wait_until_finished()
        except Exception as err:
            step = self._saving
            previous = max((s for s in self.all_steps() if step is None or s < step), default=None)
            self._raise_if_disk_full(err, step, previous)
            raise

    def _raise_if_disk_full(self, err: BaseException, step: int | None, previous) -> None:
        full = checkpoint_health.disk_full(err)
        if full is None:
            return
        where = full.filename or os.path.join(self.directory, str(step))
        previous_dir = os.path.join(self.directory, str(previous))
        needed = checkpoint_health.tree_bytes(previous_dir) if previous is not None else 0
        free = 0 if fs.is_remote(self.directory) else shutil.disk_usage(self.directory).free
        kept = (
            f"the previous checkpoint, step {previous}, is intact"
            if previous is not None
            else "there is no earlier checkpoint"
        )
        raise CheckpointSaveError(
            f"no space left on device saving checkpoint step {step} ({where}): a checkpoint "
            f"takes about {needed / 2**20:.1f} MiB, {free / 2**20:.1f} MiB are free; {kept} in "
            f"{self.directory}; free some space and run the same command again to resume"
        ) from None

    def restore_intact(
        self, abstract_state: Any, mesh: Mesh, num_shards: int = 1
    ) -> tuple[tuple[Any, int | None, Any], int, list[tuple[int, str]]]:
        """(`restore`'s result, its step, [(step, problem)] of the newer ones that failed).

        Tries the checkpoints newest first, skipping each that cannot be restored (left in
        place: `set_aside` moves them). Raises CheckpointError naming every step and its
        problem when none can be restored.
        """
        failed: list[tuple[int, str]] = []
        for step in sorted(self.all_steps(), reverse=True):
            problem = self.problem(step, abstract_state)
            if problem is None:
                restored, problem = checkpoint_health.read_or_problem(
                    lambda step=step: self.restore(
                        abstract_state, mesh, step, num_shards=num_shards
                    )
                )
                if problem is None:
                    return restored, step, failed
            failed.append((step, problem))
        listed = "; ".join(f"step {step}: {problem}" for step, problem in failed)
        raise CheckpointError(
            f"no checkpoint in {self.directory} can be restored ({listed}); nothing was changed: "
            "if the config changed since they were saved, run with the config they were saved "
            "with, else start in another --workdir"
        )

    def problem(self, step: int, abstract_state: Any) -> str | None:
        """Why the checkpoint at `step` cannot be restored as `abstract_state`, found without
        reading its arrays (a missing file, other parameter shapes), or None."""
        step_dir = os.path.join(self.directory, str(step))
        missing = checkpoint_health.missing_file(step_dir)
        if missing is not None:
            return missing
        try:
            return checkpoint_health.shape_problem(os.path.join(step_dir, "state"), abstract_state)
        except Exception as err:  # unreadable metadata
            return f"state/ metadata cannot be read: {checkpoint_health.describe_error(err)}"

    def set_aside(self, failed: list[tuple[int, str]]) -> list[str]:
        """Renames the checkpoints of `failed` to `<step>.corrupt-<UTC time>` (out of Orbax's
        sight, never deleted); returns the new paths. Call it on one process only."""
        stamp = _utc_stamp()
        moved = []
        for step, _ in failed:
            source = os.path.join(self.directory, str(step))
            target = f"{source}.corrupt-{stamp}"
            fs.rename(source, target)
            moved.append(target)
        return moved

    def reload(self) -> None:
        """Lists the checkpoints again (after `set_aside` or `remove_leftovers`)."""
        self.manager.reload()

    def remove_leftovers(self) -> list[str]:
        """Deletes the temporary directories of saves that never finished (a killed run's,
        named `<step>.orbax-checkpoint-tmp[-<timestamp>]` by Orbax); nothing else. Call it on one
        process, while no save is running."""
        removed = []
        for name in sorted(fs.listdir(self.directory)):
            path = os.path.join(self.directory, name)
            if _TMP_SAVE.match(name) and fs.isdir(path) and not os.path.islink(path):
                fs.rmtree(path)
                removed.append(path)
        return removed

    def set_aside_uncommitted(self) -> list[str]:
        """In a bucket: renames each `<step>/` without Orbax's commit marker (a save that never
        finished) to `<step>.uncommitted-<UTC time>`, out of Orbax's way (it would otherwise stay
        unlisted, or be deleted when that step is saved again); returns the new paths. Nothing
        locally (a local save is renamed into place whole). One process, while no save runs."""
        if not fs.is_remote(self.directory):
            return []
        stamp, moved = _utc_stamp(), []
        for name in sorted(fs.listdir(self.directory)):
            path = os.path.join(self.directory, name)
            if (
                name.isdigit()
                and not fs.exists(os.path.join(path, COMMIT_MARKER))
                and fs.isdir(path)
            ):
                target = f"{path}.uncommitted-{stamp}"
                fs.rename(path, target)
                moved.append(target)
        return moved

    def close(self) -> None:
        self.manager.close()


class Preemption:
    """Whether to save and stop at this step boundary.

    Single-process runs turn SIGTERM into a flag (installed here, put back by `restore`);
    multi-process runs rely on JAX's distributed preemption notice instead (through Orbax's
    `reached_preemption`), so that all hosts stop at the same step.
    """

    def __init__(self, checkpointer: Checkpointer):
        self.checkpointer = checkpointer
        self.sigterm = False
        self._previous = None
        if jax.process_count() == 1:
            self._previous = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame) -> None:
        del signum, frame
        self.sigterm = True

    def requested(self, step: int) -> bool:
        return self.sigterm or (
            jax.process_count() > 1 and self.checkpointer.reached_preemption(step)
        )

    def restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


def find_checkpoint_dir(path: str) -> str:
    """A workdir (`<path>/checkpoints`) or a checkpoints directory itself.

    A path that does not exist is a `CheckpointError` (rather than an empty checkpoint directory
    created there).
    """
    candidate = os.path.join(path, "checkpoints")
    if fs.isdir(candidate):
        return candidate
    if not fs.isdir(path):
        raise CheckpointError(
            f"no checkpoints at {path}: expected a pretraining workdir or its checkpoints/"
        )
    return path
