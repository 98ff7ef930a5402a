"""Multi-process start-up: `jax.distributed.initialize()` when the job has several processes,
and start-up checks that every host runs the same thing.

Call `initialize()` before anything touches a JAX device (`bert-jax pretrain` does it first). Where
the settings come from, first that applies:

1. explicit: `coordinator_address` / `num_processes` / `process_id` arguments (the CLI's
   `--coordinator-address`, `--num-processes`, `--process-id`), else the environment variables
   `BERT_JAX_COORDINATOR`, `BERT_JAX_NUM_PROCESSES`, `BERT_JAX_PROCESS_ID`, else JAX's own
   `JAX_COORDINATOR_ADDRESS` (with `JAX_NUM_PROCESSES`, `JAX_PROCESS_ID`); the count and id may
   also come from SLURM (`SLURM_NTASKS`, `SLURM_PROCID`) or Open MPI;
2. SLURM: a task started by `srun` in a job of several tasks (`SLURM_NTASKS` > 1): coordinator on
   the first host of `SLURM_STEP_NODELIST`;
3. Open MPI (`OMPI_COMM_WORLD_SIZE` > 1): JAX's own detection;
4. a Cloud TPU VM (pod slice or single host): JAX's own detection from the TPU metadata.

Otherwise the job is one process and nothing is initialized. `BERT_JAX_DISTRIBUTED` (or `mode`)
`off` skips all of this, `on` always initializes (JAX detects what is unset).

Devices per process (`BERT_JAX_LOCAL_DEVICE_IDS` or `local_device_ids`): `all` (every local
device: one process per host), `local-rank` (one GPU per process: `SLURM_LOCALID` /
`OMPI_COMM_WORLD_LOCAL_RANK`, JAX's default under SLURM and Open MPI), or a list such as `0,1`.

Failure detection: a process that stops sending heartbeats (it died, or its host did, or it is
wedged) makes the coordination service terminate every other process with an error (exit 134);
that comes between half of `heartbeat_timeout` and all of it after the process stopped
(measured: 15 to 28 s at 30 s, 36 to 54 s at 60 s). A collective already waiting on a dead peer
fails at once. A host that never shows up fails `initialize` after `initialization_timeout`
seconds.

Why this file is long: the five start-up sources above share one precedence and one `Startup`, and
the host-agreement checks run on what they set up; split, each half would need the other's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from bert_jax.runtime import topology
from bert_jax.runtime.errors import UserError

log = logging.getLogger("bert_jax")

MODES = ("auto", "on", "off")
DEFAULT_INITIALIZATION_TIMEOUT = 300
DEFAULT_HEARTBEAT_TIMEOUT = 100


class HostMismatchError(UserError):
    """Hosts of one job disagree on something that must be identical (config, resume step)."""


@dataclasses.dataclass(frozen=True)
class Startup:
    """A multi-process job's start-up: the source that set it (`method`) and how
    `jax.distributed.initialize` will be called (None fields: JAX detects them)."""

    method: str  # explicit | slurm | ompi | tpu | jax
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    local_device_ids: tuple[int, ...] | None = None
    cluster_detection_method: str | None = None

    def describe(self) -> str:
        parts = [f"via {self.method}"]
        if self.coordinator_address:
            parts.append(f"coordinator {self.coordinator_address}")
        if self.num_processes is not None:
            parts.append(f"process {self.process_id} of {self.num_processes}")
        if self.local_device_ids is not None:
            parts.append(f"local devices {list(self.local_device_ids)}")
        return ", ".join(parts)


def _int(value: Any, name: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise UserError(f"{name}={value!r} is not an integer") from None


def _first(env: Mapping[str, str], *names: str) -> tuple[str | None, str | None]:
    for name in names:
        if env.get(name):
            return env[name], name
    return None, None


def _slurm_present(env: Mapping[str, str]) -> bool:
    # The variables JAX's own SLURM detection needs: set for tasks started by srun.
    needed = (
        "SLURM_JOB_ID",
        "SLURM_STEP_NODELIST",
        "SLURM_NTASKS",
        "SLURM_PROCID",
        "SLURM_LOCALID",
    )
    return all(name in env for name in needed)


def first_slurm_host(nodelist: str) -> str:
    """The first host of a SLURM node list: 'node[003-005,9],gpu1' -> 'node003'."""
    nodelist = nodelist.strip()
    match = re.match(r"([^,\[]*)(\[([^\]]*)\])?", nodelist)
    if not match or not (match.group(1) or match.group(3)):
        raise UserError(f"cannot read the first host of SLURM node list {nodelist!r}")
    prefix, ranges = match.group(1), match.group(3)
    if ranges is None:
        return prefix
    return prefix + re.split(r"[,-]", ranges)[0]


def slurm_default_port(job_id: str) -> int:
    """JAX's choice for SLURM jobs: a port in the top 4096 derived from the job id."""
    return int(job_id) % 4096 + 65536 - 4096


def _local_ids(spec: Any, env: Mapping[str, str]) -> tuple[int, ...] | None | str:
    """'all' -> None (every device); 'local-rank' -> (rank,); '0,1' -> (0, 1); unset -> 'unset'."""
    if spec is None or spec == "":
        return "unset"
    if isinstance(spec, (list, tuple)):
        return tuple(int(i) for i in spec)
    spec = str(spec).strip()
    if spec == "all":
        return None
    if spec == "local-rank":
        rank, name = _first(env, "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK")
        if rank is None:
            raise UserError(
                "BERT_JAX_LOCAL_DEVICE_IDS=local-rank but no local rank is set (SLURM_LOCALID, "
                "OMPI_COMM_WORLD_LOCAL_RANK or LOCAL_RANK)"
            )
        return (_int(rank, name),)
    try:
        return tuple(int(part) for part in spec.split(",") if part.strip())
    except ValueError:
        raise UserError(
            f"BERT_JAX_LOCAL_DEVICE_IDS={spec!r}: use all, local-rank or a list such as 0,1"
        ) from None


def _on_cloud_tpu_vm(env: Mapping[str, str]) -> bool:
    if any(env.get(name) for name in ("TPU_WORKER_HOSTNAMES", "TPU_PROCESS_ADDRESSES")):
        return True
    if env.get("MEGASCALE_COORDINATOR_ADDRESS"):
        return True
    import importlib.util

    return topology.has_local_tpu_chips() and importlib.util.find_spec("libtpu") is not None


def choose_startup(
    *,
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    local_device_ids: str | Sequence[int] | None = None,
    mode: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Startup | None:
    """What `initialize` will do, from the arguments and the environment; None: one process.

    Pure (reads only `env` and, for TPU detection, /dev): tested without starting anything.
    """
    env = os.environ if env is None else env
    mode = (mode or env.get("BERT_JAX_DISTRIBUTED") or "auto").lower()
    if mode not in MODES:
        raise UserError(f"distributed mode {mode!r}: use one of {', '.join(MODES)}")
    if mode == "off":
        return None
    slurm = _slurm_present(env)
    ompi = _int(env.get("OMPI_COMM_WORLD_SIZE"), "OMPI_COMM_WORLD_SIZE") or 0
    local = _local_ids(
        local_device_ids
        if local_device_ids is not None
        else env.get("BERT_JAX_LOCAL_DEVICE_IDS") or env.get("JAX_LOCAL_DEVICE_IDS"),
        env,
    )

    address = coordinator_address
    if not address:
        address, _ = _first(env, "BERT_JAX_COORDINATOR", "JAX_COORDINATOR_ADDRESS")
    count_name = "--num-processes"
    if num_processes is None:
        value, count_name = _first(
            env,
            "BERT_JAX_NUM_PROCESSES",
            "JAX_NUM_PROCESSES",
            "SLURM_NTASKS",
            "OMPI_COMM_WORLD_SIZE",
        )
        num_processes = _int(value, count_name)
    id_name = "--process-id"
    if process_id is None:
        value, id_name = _first(
            env, "BERT_JAX_PROCESS_ID", "JAX_PROCESS_ID", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"
        )
        process_id = _int(value, id_name)

    if address:
        missing = [
            what
            for what, value in (
                (
                    "the number of processes (--num-processes / BERT_JAX_NUM_PROCESSES)",
                    num_processes,
                ),
                ("this process's id (--process-id / BERT_JAX_PROCESS_ID)", process_id),
            )
            if value is None
        ]
        if missing:
            raise UserError(
                f"coordinator {address} is set but {' and '.join(missing)} is not; set all three"
            )
        if ":" not in address:
            raise UserError(f"coordinator address {address!r} needs a port (host:port)")
        if num_processes < 1 or not 0 <= process_id < num_processes:
            raise UserError(
                f"process id {process_id} must be in [0, {num_processes}) (from {id_name} and "
                f"{count_name})"
            )
        if num_processes == 1 and mode == "auto":
            return None
        if local == "unset":
            # Under SLURM / Open MPI JAX defaults to one device per process; keep that default.
            local = _local_ids("local-rank", env) if (slurm or ompi > 1) else None
        return Startup("explicit", address, num_processes, process_id, local, "deactivate")
    if slurm and int(env["SLURM_NTASKS"]) > 1:
        port, _ = _first(env, "BERT_JAX_COORDINATOR_PORT", "JAX_COORDINATOR_PORT")
        port = port or str(slurm_default_port(env["SLURM_JOB_ID"]))
        host = first_slurm_host(env["SLURM_STEP_NODELIST"])
        if local == "unset":
            local = _local_ids("local-rank", env)
        return Startup("slurm", f"{host}:{port}", num_processes, process_id, local, "deactivate")
    if ompi > 1:
        ids = None if local == "unset" else local
        return Startup("ompi", None, None, None, ids, "ompi")
    if _on_cloud_tpu_vm(env):
        return Startup("tpu")  # never restrict TPU devices; JAX reads the slice's metadata
    if mode == "on":
        return Startup("jax", None, None, None, None if local == "unset" else local)
    explicit_count = count_name in (
        "--num-processes",
        "BERT_JAX_NUM_PROCESSES",
        "JAX_NUM_PROCESSES",
    )
    if explicit_count and num_processes is not None and num_processes > 1:
        raise UserError(
            f"{count_name}={num_processes} but no coordinator address: set --coordinator-address "
            "or BERT_JAX_COORDINATOR=host:port"
        )
    return None


def initialize(
    *,
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    local_device_ids: str | Sequence[int] | None = None,
    mode: str | None = None,
    initialization_timeout: int | None = None,
    heartbeat_timeout: int | None = None,
    env: Mapping[str, str] | None = None,
) -> Startup | None:
    """Calls `jax.distributed.initialize` when the job is multi-process (see the module doc).

    Timeouts default to `BERT_JAX_INIT_TIMEOUT` / `BERT_JAX_HEARTBEAT_TIMEOUT`, else 300 s / 100 s.
    Returns the start-up that was used, or None for a single-process job. Must run before any JAX
    call that touches a device; calling it again after a successful start does nothing.
    """
    import jax

    env = os.environ if env is None else env
    if jax.distributed.is_initialized():
        return None
    chosen = choose_startup(
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
        local_device_ids=local_device_ids,
        mode=mode,
        env=env,
    )
    if chosen is None:
        return None
    init_timeout = initialization_timeout or _int(
        env.get("BERT_JAX_INIT_TIMEOUT"), "BERT_JAX_INIT_TIMEOUT"
    )
    heartbeat = heartbeat_timeout or _int(
        env.get("BERT_JAX_HEARTBEAT_TIMEOUT"), "BERT_JAX_HEARTBEAT_TIMEOUT"
    )
    # CPU processes talk through gloo (the default in recent JAX; older ones had none).
    if jax.config.jax_cpu_collectives_implementation in (None, "", "none"):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    log.info("initializing jax.distributed %s", chosen.describe())
    jax.distributed.initialize(
        coordinator_address=chosen.coordinator_address,
        num_processes=chosen.num_processes,
        process_id=chosen.process_id,
        local_device_ids=list(chosen.local_device_ids)
        if chosen.local_device_ids is not None
        else None,
        cluster_detection_method=chosen.cluster_detection_method,
        initialization_timeout=init_timeout or DEFAULT_INITIALIZATION_TIMEOUT,
        heartbeat_timeout_seconds=heartbeat or DEFAULT_HEARTBEAT_TIMEOUT,
    )
    return chosen


# --- start-up consistency -----------------------------------------------------------------------


def _digest(text: str):
    import numpy as np

    return np.frombuffer(hashlib.sha256(text.encode()).digest()[:16], dtype="<i4").copy()


def sync_hosts(name: str) -> None:
    """A barrier across all processes (a no-op in a single-process job)."""
    import jax

    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def allgather_texts(texts: Sequence[str]) -> list[list[str]]:
    """Every process's `texts` (same count on each), indexed [process][i]."""
    import numpy as np
    from jax.experimental import multihost_utils

    blob = json.dumps(list(texts)).encode()
    lengths = multihost_utils.process_allgather(np.array([len(blob)], np.int32))
    padded = np.zeros((int(np.max(lengths)),), np.uint8)
    padded[: len(blob)] = np.frombuffer(blob, np.uint8)
    gathered = np.asarray(multihost_utils.process_allgather(padded))
    return [
        json.loads(bytes(row[: int(length)]).decode())
        for row, length in zip(gathered, np.asarray(lengths).reshape(-1))
    ]


def describe_difference(name: str, reference: str, other: str, limit: int = 8) -> list[str]:
    """'name.key=B (process 0: A)' lines for two JSON objects, else the two values themselves."""
    try:
        ref, oth = json.loads(reference), json.loads(other)
    except ValueError:
        ref = oth = None
    if not (isinstance(ref, dict) and isinstance(oth, dict)):
        return [f"{name}={other[:200]} (process 0: {reference[:200]})"]
    from flax import traverse_util

    ref, oth = traverse_util.flatten_dict(ref, sep="."), traverse_util.flatten_dict(oth, sep=".")
    missing = object()
    show = lambda v: "(absent)" if v is missing else json.dumps(v)  # noqa: E731
    lines = [
        f"{name}.{key}={show(oth.get(key, missing))} (process 0: {show(ref.get(key, missing))})"
        for key in sorted(set(ref) | set(oth))
        if ref.get(key, missing) != oth.get(key, missing)
    ]
    if len(lines) > limit:
        lines = lines[:limit] + [f"... and {len(lines) - limit} more"]
    return lines


def check_hosts_agree(values: Mapping[str, str]) -> None:
    """Raises HostMismatchError on every host, naming what differs, unless all hosts passed the
    same `values` (e.g. {'config': json, 'latest checkpoint step': '1200'}).

    One all-gather of 16-byte digests; the values themselves travel only when they differ.
    A no-op in a single-process job.
    """
    import jax
    import numpy as np

    if jax.process_count() == 1:
        return
    from jax.experimental import multihost_utils

    names = sorted(values)
    digests = np.stack([_digest(str(values[name])) for name in names])
    gathered = np.asarray(multihost_utils.process_allgather(digests))  # [process, name, 4]
    differing = [i for i, _ in enumerate(names) if not (gathered[:, i] == gathered[0, i]).all()]
    if not differing:
        return
    texts = allgather_texts([str(values[names[i]]) for i in differing])
    lines = []
    for process, theirs in enumerate(texts):
        for k, i in enumerate(differing):
            if theirs[k] != texts[0][k]:
                for line in describe_difference(names[i], texts[0][k], theirs[k]):
                    lines.append(f"  process {process}: {line}")
    raise HostMismatchError(
        "the hosts of this job disagree on "
        + " and ".join(names[i] for i in differing)
        + " (every process must run the same command on the same shared workdir):\n"
        + "\n".join(lines)
    )


def config_fingerprint_text(config) -> str:
    """The config as canonical JSON (sorted keys), the text hosts compare."""
    return json.dumps(json.loads(config.to_json_best_effort()), sort_keys=True)


# --- command-line flags (absl, for `bert-jax pretrain`) ------------------------------------------


def define_flags(flags, flag_values) -> None:
    """The multi-process flags of `bert-jax pretrain` (each also readable from the environment)."""
    flags.DEFINE_string(
        "coordinator_address",
        None,
        "multi-process: host:port of process 0's coordinator (else BERT_JAX_COORDINATOR; SLURM "
        "and TPU pods are detected without it)",
        flag_values=flag_values,
    )
    flags.DEFINE_integer(
        "num_processes", None, "multi-process: number of processes", flag_values=flag_values
    )
    flags.DEFINE_integer(
        "process_id", None, "multi-process: this process's id (0 .. n-1)", flag_values=flag_values
    )
    flags.DEFINE_string(
        "local_device_ids",
        None,
        "devices of this process: all, local-rank (one GPU per process) or a list such as 0,1",
        flag_values=flag_values,
    )
    flags.DEFINE_enum(
        "distributed",
        None,
        list(MODES),
        "auto (default): initialize jax.distributed when the environment is multi-process; "
        "on: always; off: never (BERT_JAX_DISTRIBUTED)",
        flag_values=flag_values,
    )
    flags.DEFINE_integer(
        "initialization_timeout",
        None,
        f"seconds to wait for every process to join (default {DEFAULT_INITIALIZATION_TIMEOUT})",
        flag_values=flag_values,
    )
    flags.DEFINE_integer(
        "heartbeat_timeout",
        None,
        "seconds without a heartbeat after which a process counts as dead and the others stop "
        f"with an error (default {DEFAULT_HEARTBEAT_TIMEOUT})",
        flag_values=flag_values,
    )


def initialize_from_flags(flag_values) -> Startup | None:
    return initialize(
        coordinator_address=flag_values.coordinator_address,
        num_processes=flag_values.num_processes,
        process_id=flag_values.process_id,
        local_device_ids=flag_values.local_device_ids,
        mode=flag_values.distributed,
        initialization_timeout=flag_values.initialization_timeout,
        heartbeat_timeout=flag_values.heartbeat_timeout,
    )
