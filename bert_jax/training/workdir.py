"""The pretraining workdir's keeping: one writer (a lock file naming the run that holds it: host,
pid, start time), the removal of what a killed run left half-written, and the refusal to resume
its checkpoints as another model (`check_same_model`) or on another schedule
(`check_same_schedule`: other phases or another learning-rate curve).

`pretrain` takes the lock (process 0 of a job) before it writes anything in its workdir and lets
it go when it ends, however it ends (finished, preempted, an exception). The file is created with
O_EXCL (in a bucket: an upload conditioned on no object of that name, ifGenerationMatch=0), so of
two runs started together one wins. A second run is refused, naming the holder. A
lock left behind by a run that died (SIGKILL, a crash) is taken over when its holder is known to
be gone: same host, process no longer running (or the file is unreadable and older than a few
seconds: a crash while writing it). A holder on another host cannot be checked from
here; the refusal then says which file to delete once that run is known to be over. Taking
over a dead holder's lock is a delete, then the same create: of two runs taking over one dead
lock at the same moment one create wins (the loser may have deleted the winner's fresh lock
first, the same race locally and in a bucket; the bucket's delete takes no generation here).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import socket
import time

import jax

from bert_jax.runtime import distributed, fs
from bert_jax.runtime.errors import UserError

LOCK_NAME = "bert-jax.lock"
# An unreadable lock file younger than this may be one another run is writing right now.
_WRITING_SECONDS = 10.0


class WorkdirLockedError(UserError):
    """Another run holds the workdir's lock."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


class WorkdirLock:
    """The lock on `workdir` (`<workdir>/bert-jax.lock`); `acquire` / `release`, or `with`."""

    def __init__(self, workdir: str | os.PathLike):
        self.path = os.path.join(fs.abspath(os.fspath(workdir)), LOCK_NAME)
        self.held = False
        self._mine: dict[str, object] = {}

    def acquire(self) -> None:
        """Takes the lock, taking over a dead holder's; raises WorkdirLockedError if held."""
        self._mine = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        content = (json.dumps(self._mine) + "\n").encode("utf-8")
        for _ in range(2):
            # O_EXCL locally; in a bucket an upload on the condition that no such object exists
            # (one request, atomic: the object appears whole or not at all).
            if not fs.create_exclusive(self.path, content):
                holder = self._read_holder()
                if holder is not None and not self._is_stale(holder):
                    raise WorkdirLockedError(self._refusal(holder)) from None
                if holder is None and self._age() < _WRITING_SECONDS:
                    raise WorkdirLockedError(self._refusal({})) from None  # being written
                # A dead holder's lock (or an unreadable one left by a crash while writing it).
                try:
                    fs.remove(self.path)
                except FileNotFoundError:
                    pass
                continue
            self.held = True
            return
        holder = self._read_holder() or {}
        raise WorkdirLockedError(self._refusal(holder))

    def release(self) -> None:
        """Removes the lock file if it is still this run's."""
        if not self.held:
            return
        self.held = False
        if self._read_holder() == self._mine:
            try:
                fs.remove(self.path)
            except FileNotFoundError:
                pass

    def __enter__(self) -> WorkdirLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def _read_holder(self) -> dict[str, object] | None:
        """The holder recorded in the file; None when it is gone or unreadable (half-written)."""
        try:
            with fs.open(self.path, encoding="utf-8") as f:
                holder = json.load(f)
        except (FileNotFoundError, ValueError):
            return None
        return holder if isinstance(holder, dict) else None

    def _age(self) -> float:
        try:
            return time.time() - fs.modified(self.path).timestamp()
        except FileNotFoundError:
            return _WRITING_SECONDS

    def _is_stale(self, holder: dict[str, object]) -> bool:
        pid = holder.get("pid")
        return (
            holder.get("host") == socket.gethostname()
            and isinstance(pid, int)
            and pid != os.getpid()
            and not _pid_alive(pid)
        )

    def _refusal(self, holder: dict[str, object]) -> str:
        who = (
            f"host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, "
            f"started {holder.get('started', '?')}"
        )
        hint = (
            "wait for it to finish or stop it"
            if holder.get("host") == socket.gethostname()
            else f"if that run is over, delete {self.path}"
        )
        return (
            f"workdir {os.path.dirname(self.path)} is in use by another run ({who}; lock file "
            f"{self.path}): {hint}, or use another --workdir"
        )


def lock(workdir: str, is_main: bool) -> WorkdirLock:
    """The workdir's lock, taken by process 0; every process raises if another run holds it."""
    lock = WorkdirLock(workdir)
    refusal = ""
    if is_main:
        try:
            lock.acquire()
        except WorkdirLockedError as err:
            refusal = str(err)
    if jax.process_count() > 1:
        refusal = distributed.allgather_texts([refusal])[0][0]
    if refusal:
        raise WorkdirLockedError(refusal)
    return lock


# What `outputs.atomic_output_dir` names an export in progress / the export it replaces.
_EXPORT_LEFTOVER = re.compile(r"^\.model\.(tmp|old)-[0-9a-f]{8}$")


def remove_leftovers(workdir: str, checkpointer, console) -> None:
    """Deletes what a killed run of this workdir left half-written: Orbax's temporary save
    directories and unfinished exports (only names bert-jax gives them; an old export only when
    the new `model/` is in place). In a bucket, a checkpoint step Orbax never committed is set
    aside instead (`Checkpointer.set_aside_uncommitted`)."""
    moved = checkpointer.set_aside_uncommitted()
    if moved:
        console(
            "set aside checkpoint save(s) an interrupted run never committed (no "
            f"commit_success.txt; delete them once not needed): {', '.join(moved)}"
        )
    removed = checkpointer.remove_leftovers()
    exported = fs.isdir(os.path.join(workdir, "model"))
    for name in sorted(fs.listdir(workdir)):
        match = _EXPORT_LEFTOVER.match(name)
        path = os.path.join(workdir, name)
        if match and fs.isdir(path) and (match.group(1) == "tmp" or exported):
            fs.rmtree(path)
            removed.append(path)
    if removed:
        console(f"removed what an interrupted run left behind: {', '.join(removed)}")


# What decides the shapes and structure of a workdir's train state: a run with other values can
# restore none of its checkpoints.
STATE_SETTINGS = tuple(
    f"model.{name}"
    for name in (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "max_position_embeddings",
        "type_vocab_size",
        "vocab_pad_multiple",
        "param_dtype",
    )
) + ("optimizer.name", "objective")


def check_same_model(workdir: str, config) -> None:
    """Refuses a run whose model settings differ from those of the checkpoints in `workdir`.

    The workdir's `config.json` (written by the run that saved them) says what the checkpoints
    hold; the checkpoints are fine, the config changed, so the refusal names the differing
    settings and how to go on. Nothing in the workdir is touched.
    """
    stored_path = os.path.join(workdir, "config.json")
    checkpoints = os.path.join(workdir, "checkpoints")
    if not fs.isfile(stored_path) or not fs.isdir(checkpoints):
        return
    if not any(name.isdigit() for name in fs.listdir(checkpoints)):
        return
    try:
        stored = json.loads(fs.read_text(stored_path))
    except ValueError:  # unreadable: the restore itself reports what it finds
        return
    differ = []
    for key in STATE_SETTINGS:
        there, here = stored, config
        for part in key.split("."):
            there = there.get(part) if isinstance(there, dict) else None
            here = here.get(part) if here is not None else None
        if there is not None and here is not None and there != here:
            differ.append(f"config.{key}={here!r} here, {there!r} there")
    if differ:
        raise UserError(
            f"--workdir {workdir} holds checkpoints of another model ({'; '.join(differ)}; read "
            f"from {stored_path}): use another --workdir for this model, or run with the "
            "workdir's model settings to resume it"
        )


def check_workdir_schedule(workdir: str, config) -> None:
    """Refuses to resume the checkpoints in `workdir` on another schedule than the one they were
    trained on (`check_same_schedule`; its config.json says which, read before it is rewritten)."""
    stored_path = os.path.join(workdir, "config.json")
    checkpoints = os.path.join(workdir, "checkpoints")
    if not fs.isfile(stored_path) or not fs.isdir(checkpoints):
        return
    steps = [int(name) for name in fs.listdir(checkpoints) if name.isdigit()]
    if not steps:
        return
    try:
        stored = json.loads(fs.read_text(stored_path))
    except ValueError:  # unreadable: the restore itself reports what it finds
        return
    hint = (
        f"start another --workdir with --config.init_from={workdir} (its params only: the "
        "optimizer, the step and the schedule start anew)"
    )
    check_same_schedule(stored, f"--workdir {workdir}", max(steps), config, hint)


def check_same_schedule(stored: dict, where: str, step: int, config, fix_hint: str) -> None:
    """Refuses to resume at `step` a run whose checkpoints were trained on another schedule.

    `stored` is the config.json of the run that saved them (`where` names it). The schedule is
    what `step` decides: each phase's steps and shapes, and the learning rate at every step. A
    resume with another one would go on in another phase (a finished 400-step run rerun with
    total_steps=600 is back at seq 128 until step 540) with the rate jumping. Nothing is refused
    where nothing would train (`step` at or past the new end). `fix_hint` says how to train the
    model further on a new schedule. One line, naming what changed, from what to what.
    """
    import ml_collections
    import numpy as np

    from bert_jax.core import optim
    from bert_jax.training import config_lib

    try:
        theirs = ml_collections.ConfigDict(stored)
        old_phases = config_lib.split_phases(theirs)
        old_optimizer, old_specs = config_lib.resolved_optimizer(theirs, old_phases)
    except (KeyError, AttributeError, TypeError, ValueError, UserError):
        return  # a config.json of another layout: nothing to compare against
    new_phases = config_lib.split_phases(config)
    if step >= new_phases[-1].end:
        return
    new_optimizer, new_specs = config_lib.resolved_optimizer(config, new_phases)

    def shape(phases):
        return [
            (p.start, p.end, p.max_seq_length, p.max_predictions_per_seq, p.batch_size)
            for p in phases
        ]

    total = max(old_phases[-1].end, new_phases[-1].end)
    steps = np.arange(total)
    _, old_rate = optim.from_config(old_optimizer, [p.steps for p in old_phases], old_specs)
    _, new_rate = optim.from_config(new_optimizer, [p.steps for p in new_phases], new_specs)
    old_lr, new_lr = np.asarray(old_rate(steps)), np.asarray(new_rate(steps))
    if shape(old_phases) == shape(new_phases) and np.allclose(old_lr, new_lr, rtol=1e-6):
        return
    differences = _schedule_differences(stored, config.to_dict())
    changed = [
        f"config.{key}={_shown(here)} here, {_shown(there)} there"
        for key, there, here in differences
    ]
    old_at, new_at = config_lib.phase_at(old_phases, step), config_lib.phase_at(new_phases, step)
    effects = [
        f"phases {_phases_text(old_phases)} would become {_phases_text(new_phases)}"
        if shape(old_phases) != shape(new_phases)
        else ""
    ]
    if (old_at.index, old_at.max_seq_length) != (new_at.index, new_at.max_seq_length):
        effects.append(
            f"step {step + 1} would run in phase {new_at.index + 1} (seq "
            f"{new_at.max_seq_length}), not phase {old_at.index + 1} (seq "
            f"{old_at.max_seq_length})"
        )
    last = old_lr[min(step, old_phases[-1].end) - 1] if step else old_lr[0]
    effects.append(
        f"the learning rate would go from {last:.2e} (step {step}) to {new_lr[step]:.2e} "
        f"(step {step + 1})"
    )
    fixes = [f"--config.{key}={_shown(there)}" for key, there, _ in differences]
    raise UserError(
        f"{where} was trained to step {step} on another schedule "
        f"({'; '.join(changed) or 'the learning-rate settings differ'}): resuming would change it "
        f"silently ({'; '.join(e for e in effects if e)}). To go on with the run, resume with its "
        f"own schedule ({' '.join(fixes) or 'its config.json'}); to train the model further on "
        f"a new schedule, {fix_hint}"
    )


def _schedule_differences(stored: dict, here: dict) -> list[tuple[str, object, object]]:
    """(key, there, here) of the schedule's settings that differ: total_steps, the optimizer's
    and those of each phase that has steps in either run (their data aside)."""
    from bert_jax.training import config_lib

    differ = []
    if stored.get("total_steps") != here.get("total_steps"):
        differ.append(("total_steps", stored.get("total_steps"), here.get("total_steps")))
    for section in ("optimizer", *config_lib.PHASE_KEYS):
        theirs, ours = stored.get(section) or {}, here.get(section) or {}
        if section != "optimizer" and not theirs.get("fraction") and not ours.get("fraction"):
            continue  # a phase of no steps in either run: its settings decide nothing
        for key in sorted(set(theirs) | set(ours)):
            if key != "data" and theirs.get(key) != ours.get(key):
                differ.append((f"{section}.{key}", theirs.get(key), ours.get(key)))
    return differ


def _shown(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _phases_text(phases) -> str:
    return ", ".join(f"{p.start}-{p.end - 1} at seq {p.max_seq_length}" for p in phases)
