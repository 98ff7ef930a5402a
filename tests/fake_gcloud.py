"""A stand-in `gcloud` for the launch tests: the commands `bert-jax launch tpu` runs, answered
from a JSON state file (FAKE_GCLOUD_STATE), with TPU VM workers as local processes.

    gcloud compute tpus queued-resources create|describe|delete NAME ...
    gcloud compute tpus tpu-vm create|describe|delete NAME ...
    gcloud compute tpus tpu-vm scp LOCAL NAME:REMOTE --worker=all
    gcloud compute tpus tpu-vm ssh NAME --worker=all|N --command=CMD

A queued resource goes ACCEPTED -> WAITING_FOR_RESOURCES (for `queue_polls` describes) ->
PROVISIONING -> ACTIVE, creating its node (READY). Each node has `workers` workers, each a
home directory under the state's `root` (fresh for every node created: a new VM has nothing
installed); `ssh` runs CMD with bash in each worker's home, in a session of its own, with the
environment a TPU VM worker would give a JAX job: here jax.distributed over localhost
(BERT_JAX_COORDINATOR, BERT_JAX_NUM_PROCESSES, BERT_JAX_PROCESS_ID) and `devices` CPU devices
each, plus the state's `worker_env`; every process of a node carries FAKE_GCLOUD_NODE, so that a
preemption kills exactly those. `python3 -m venv` on a worker makes a venv whose `pip` does
nothing and whose `bert-jax` runs the source unpacked on that worker with this Python.

The test drives the cloud's side through the functions below (`preempt`, `hang`, `kill_worker`)
and makes commands fail with `fail_next` (the next N matching commands) or `flaky` (every k-th
one, for a whole run), with one of the real CLI's transient errors (`API_ERRORS`: an auth-token
refresh, 429, 503, a dropped connection) or a message of the test's own. Errors are printed as
gcloud prints them, e.g. `ERROR: (gcloud.compute.tpus.queued-resources.describe) NOT_FOUND:
Resource 'projects/P/locations/Z/queuedResources/N' was not found`. Deleting a queued resource
with --force while it is SUSPENDING is refused and recorded in `violations`, as is any delete the
real service refuses.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator

STATE_ENV = "FAKE_GCLOUD_STATE"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --- the state file ---------------------------------------------------------------------------


def new_state(path: str, root: str, **settings) -> None:
    state = {
        "root": root,
        "workers": 2,
        "devices": 4,
        "queue_polls": 2,
        "worker_env": {},
        "resources": {},
        "nodes": {},
        "failures": [],
        "flaky": [],
        "injected": 0,  # commands failed on purpose (fail_next, flaky)
        "violations": [],
        "calls": [],
        "incarnation": 0,
    }
    state.update(settings)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(state, f, indent=1)


@contextlib.contextmanager
def locked(path: str) -> Iterator[dict]:
    """The state, read and written back under an exclusive lock (the test changes it too)."""
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
        yield state
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(state, f, indent=1)
        os.replace(path + ".tmp", path)


def read(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


# --- what the test does to the "cloud" --------------------------------------------------------


# What the real CLI prints (after `ERROR: (gcloud.GROUP.VERB) `, exit status 1) when the call
# fails on the way rather than in the service's answer; `connection` is printed without the
# command's name, as gcloud does for an exception it did not expect.
API_ERRORS = {
    "auth": "There was a problem refreshing your current auth tokens: ('invalid_grant: Bad "
    "Request', {'error': 'invalid_grant', 'error_description': 'Bad Request'})\nPlease run:\n\n"
    "  $ gcloud auth login\n\nto obtain new credentials.",
    "quota": "RESOURCE_EXHAUSTED: Quota exceeded for quota metric 'Read requests' and limit 'Read "
    "requests per minute' of service 'tpu.googleapis.com'",
    "unavailable": "UNAVAILABLE: The service is currently unavailable.",
    "connection": "ERROR: gcloud crashed (ConnectionError): ('Connection aborted.', "
    "RemoteDisconnected('Remote end closed connection without response'))",
}


def fail_next(
    path: str,
    match: str,
    times: int = 1,
    status: int = 1,
    message: str = "",
    error: str | None = None,
) -> None:
    """The next `times` commands whose line contains `match` fail with `status`, printing
    `message`, or API_ERRORS[`error`] as gcloud prints it."""
    with locked(path) as state:
        state["failures"].append(
            {"match": match, "times": times, "status": status, "message": message, "error": error}
        )


def flaky(path: str, match: str, every: int, error: str = "auth") -> None:
    """From now on every `every`-th command whose line contains `match` fails (exit status 1)
    with API_ERRORS[`error`]; `every=0` ends it."""
    with locked(path) as state:
        state["flaky"] = (
            [{"match": match, "every": every, "seen": 0, "error": error}] if every else []
        )


def error_line(argv: list[str], text: str) -> str:
    """`text` as gcloud prints an error of the command `argv` ([alpha] compute tpus GROUP VERB)."""
    if text.startswith("ERROR:"):
        return text
    command = argv[: 4 + (argv[:1] in (["alpha"], ["beta"]))]
    return f"ERROR: (gcloud.{'.'.join(command)}) {text}"


def _injected_failure(state: dict, argv: list[str]) -> tuple[int, str] | None:
    line = " ".join(argv)
    for failure in state["failures"]:
        if failure["times"] > 0 and failure["match"] in line:
            failure["times"] -= 1
            text = API_ERRORS[failure["error"]] if failure.get("error") else failure["message"]
            return failure["status"], error_line(argv, text or f"fake failure of {line}")
    for failure in state.get("flaky", []):
        if failure["match"] in line:
            failure["seen"] += 1
            if failure["seen"] % failure["every"] == 0:
                return 1, error_line(argv, API_ERRORS[failure["error"]])
    return None


def preempt(path: str, name: str) -> None:
    """Spot capacity taken back: the queued resource goes SUSPENDING (for one describe), then
    SUSPENDED; its node and every process on it are gone (a directly created VM: PREEMPTED)."""
    with locked(path) as state:
        node = state["nodes"].get(name)
        if name in state["resources"]:
            state["resources"][name]["state"] = "SUSPENDING"
            state["nodes"].pop(name, None)
        elif node is not None:
            node["state"] = "PREEMPTED"
    if node is not None:
        _kill_node(node)


def _worker_pid(node: dict, worker: int) -> int:
    with open(os.path.join(node["homes"][worker], "bert-jax", "run.pid")) as f:
        return int(f.read())


def hang(path: str, name: str, worker: int = 1) -> int:
    """SIGSTOP worker `worker`'s run (a host wedged): the others then wait in a collective."""
    pid = _worker_pid(read(path)["nodes"][name], worker)
    os.kill(pid, signal.SIGSTOP)
    return pid


def kill_worker(path: str, name: str, worker: int = 1) -> None:
    """SIGKILL one worker's run on a healthy slice (a crash): the job fails, the VM stays."""
    os.kill(_worker_pid(read(path)["nodes"][name], worker), signal.SIGKILL)


NODE_ENV = "FAKE_GCLOUD_NODE"  # marks every process started on a fake node (and its children)


def node_processes(mark_prefix: str) -> list[int]:
    """Pids of this user's processes whose FAKE_GCLOUD_NODE starts with `mark_prefix`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue
        for item in environ:
            if item.startswith(NODE_ENV.encode() + b"=") and item.split(b"=", 1)[1].decode(
                errors="replace"
            ).startswith(mark_prefix):
                found.append(int(entry))
                break
    return found


def _kill_node(node: dict) -> None:
    """Every process of the node dies at once, as when a VM is taken away."""
    for pid in node_processes(node["mark"]):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def kill_everything(root: str) -> None:
    """Test teardown: whatever still runs on any fake node under `root`."""
    for pid in node_processes(os.path.join(root, "")):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)


# --- gcloud -----------------------------------------------------------------------------------


class Refused(Exception):
    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.status = status


def _flags(args: list[str]) -> tuple[list[str], dict[str, str]]:
    positional, flags = [], {}
    for arg in args:
        if arg.startswith("--"):
            key, _, value = arg[2:].partition("=")
            flags[key] = value
        else:
            positional.append(arg)
    return positional, flags


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _make_node(state: dict, name: str, accelerator_type: str) -> dict:
    state["incarnation"] += 1
    base = os.path.join(state["root"], f"{name}-{state['incarnation']}")
    homes = [os.path.join(base, f"worker-{i}") for i in range(state["workers"])]
    for home in homes:
        os.makedirs(home, exist_ok=True)
    node = {
        "state": "READY",
        "accelerator_type": accelerator_type,
        "homes": homes,
        "mark": os.path.join(base, ""),
    }
    state["nodes"][name] = node
    return node


def _resource(flags: dict[str, str], kind: str, name: str) -> str:
    project = flags.get("project") or "fake-project"
    return f"'projects/{project}/locations/{flags.get('zone', '')}/{kind}/{name}'"


def not_found(flags: dict[str, str], kind: str, name: str) -> Refused:
    """The service's NOT_FOUND (the command's name is added by `error_line`)."""
    return Refused(
        f"NOT_FOUND: Resource {_resource(flags, kind, name)} was not found. This command is "
        "authenticated as tester@example.com which is the active account specified by the "
        "[core/account] property"
    )


def already_exists(flags: dict[str, str], kind: str, name: str) -> Refused:
    return Refused(f"ALREADY_EXISTS: Resource {_resource(flags, kind, name)} already exists")


def queued_resources(state: dict, verb: str, name: str, flags: dict[str, str]) -> str:
    resources = state["resources"]
    if verb == "create":
        if name in resources:
            raise already_exists(flags, "queuedResources", name)
        resources[name] = {
            "state": "ACCEPTED",
            "polls": 0,
            "accelerator_type": flags.get("accelerator-type", ""),
            "capacity": [
                k for k in ("spot", "best-effort", "reserved", "guaranteed") if k in flags
            ],
        }
        return ""
    if name not in resources:
        raise not_found(flags, "queuedResources", name)
    resource = resources[name]
    if verb == "describe":
        shown = resource["state"]
        if shown == "ACCEPTED":
            resource["state"] = "WAITING_FOR_RESOURCES"
        elif shown == "WAITING_FOR_RESOURCES":
            resource["polls"] += 1
            if resource["polls"] >= state["queue_polls"]:
                resource["state"] = "PROVISIONING"
        elif shown == "PROVISIONING":
            resource["state"] = "ACTIVE"
            _make_node(state, name, resource["accelerator_type"])
        elif shown == "SUSPENDING":
            resource["state"] = "SUSPENDED"
        elif shown == "DELETING":
            del resources[name]
        return shown + "\n"
    if verb == "delete":
        current, force = resource["state"], "force" in flags
        if current == "SUSPENDING":
            state["violations"].append(f"delete {'--force ' if force else ''}while SUSPENDING")
            raise Refused(f"ERROR: queued resource {name} is SUSPENDING")
        if current not in ("ACCEPTED", "FAILED", "SUSPENDED") and not force:
            state["violations"].append(f"delete without --force while {current}")
            raise Refused(f"ERROR: queued resource {name} has nodes: use --force")
        node = state["nodes"].pop(name, None)
        if node is not None:
            _kill_node(node)
        resource["state"] = "DELETING"
        return ""
    raise Refused(f"fake gcloud: queued-resources {verb} is not simulated")


def tpu_vm(state: dict, verb: str, positional: list[str], flags: dict[str, str]) -> int | str:
    nodes = state["nodes"]
    if verb == "create":
        if positional[0] in nodes:
            raise already_exists(flags, "nodes", positional[0])
        _make_node(state, positional[0], flags.get("accelerator-type", ""))
        return ""
    if verb == "scp":
        local, remote = positional
        name, _, path = remote.partition(":")
        node = _ready(nodes, name)
        for home in node["homes"]:
            target = os.path.join(home, path)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copyfile(local, target)
        return ""
    name = positional[0]
    if verb == "describe":
        if name not in nodes:
            raise not_found(flags, "nodes", name)
        return nodes[name]["state"] + "\n"
    if verb == "delete":
        node = nodes.pop(name, None)
        if node is None:
            raise not_found(flags, "nodes", name)
        _kill_node(node)
        return ""
    raise Refused(f"fake gcloud: tpu-vm {verb} is not simulated")


def _ready(nodes: dict, name: str) -> dict:
    node = nodes.get(name)
    if node is None or node["state"] != "READY":
        raise Refused(f"ssh: connect to host {name}: Connection refused", 255)
    return node


SHIM_PYTHON3 = """#!/bin/sh
# python3 on a fake TPU VM worker: `-m venv DIR` makes a venv of shims; anything else is Python.
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
  mkdir -p "$3/bin"
  printf '#!/bin/sh\\nexec {python} "$@"\\n' > "$3/bin/python"
  printf '#!/bin/sh\\necho "pip $*" >> "$HOME/pip.log"\\n' > "$3/bin/pip"
  printf '#!/bin/sh\\nPYTHONPATH="$HOME/bert-jax/src" exec {python} -m bert_jax.cli "$@"\\n' \\
    > "$3/bin/bert-jax"
  chmod +x "$3/bin/python" "$3/bin/pip" "$3/bin/bert-jax"
  exit 0
fi
exec {python} "$@"
"""


def _shim_dir(root: str) -> str:
    shims = os.path.join(root, "shims")
    if not os.path.exists(os.path.join(shims, "python3")):
        os.makedirs(shims, exist_ok=True)
        path = os.path.join(shims, "python3")
        with open(path + ".tmp", "w") as f:
            f.write(SHIM_PYTHON3.replace("{python}", sys.executable))
        os.chmod(path + ".tmp", 0o755)
        os.replace(path + ".tmp", path)
    return shims


def ssh(path: str, name: str, flags: dict[str, str]) -> int:
    """Runs --command on the chosen workers (each in a session of its own); waits for all."""
    with locked(path) as state:
        node = _ready(state["nodes"], name)
        worker = flags.get("worker", "0")
        chosen = range(len(node["homes"])) if worker == "all" else [int(worker)]
        shims = _shim_dir(state["root"])
        port = _free_port()  # a job started by this command: its own coordinator port
        procs = []
        for i in chosen:
            env = dict(os.environ)
            env.pop("XLA_FLAGS", None)
            env.pop(STATE_ENV, None)
            env.update(state["worker_env"])
            env.update(
                HOME=node["homes"][i],
                PATH=f"{shims}:{env.get('PATH', '')}",
                BERT_JAX_COORDINATOR=f"127.0.0.1:{port}",
                BERT_JAX_NUM_PROCESSES=str(len(node["homes"])),
                BERT_JAX_PROCESS_ID=str(i),
                XLA_FLAGS=f"--xla_force_host_platform_device_count={state['devices']}",
                JAX_PLATFORMS="cpu",
            )
            env[NODE_ENV] = node["mark"]
            proc = subprocess.Popen(
                ["bash", "-c", flags["command"]],
                cwd=node["homes"][i],
                env=env,
                start_new_session=True,
                stdin=subprocess.DEVNULL,
            )
            procs.append(proc)

    def stop(signum, frame):  # `gcloud ssh` ended (a log stream): end what it runs
        for proc in procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # not yet reaped: the pid is still ours
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    statuses = [proc.wait() for proc in procs]
    return max(statuses, key=abs) if statuses else 0


def main(argv: list[str]) -> int:
    path = os.environ[STATE_ENV]
    line = " ".join(argv)
    with locked(path) as state:
        state["calls"].append(argv)
        injected = _injected_failure(state, argv)
        if injected is not None:
            state["injected"] += 1
    if injected is not None:
        print(injected[1], file=sys.stderr)
        return injected[0]
    args = argv[1:] if argv and argv[0] in ("alpha", "beta") else argv
    if args[:2] != ["compute", "tpus"] or len(args) < 4:
        print(f"fake gcloud: {line} is not simulated", file=sys.stderr)
        return 2
    group, verb = args[2], args[3]
    positional, flags = _flags(args[4:])
    try:
        if group == "tpu-vm" and verb == "ssh":
            return ssh(path, positional[0], flags)
        with locked(path) as state:
            if group == "queued-resources":
                out = queued_resources(state, verb, positional[0], flags)
            elif group == "tpu-vm":
                out = tpu_vm(state, verb, positional, flags)
            else:
                raise Refused(f"fake gcloud: {group} is not simulated", 2)
    except Refused as refused:
        message = str(refused)
        if group in ("queued-resources", "tpu-vm") and verb not in ("ssh", "scp"):
            message = error_line(argv, message)
        print(message, file=sys.stderr)
        return refused.status
    print(out, end="")
    return 0


def install(bin_dir: str, state_path: str) -> dict[str, str]:
    """Puts a `gcloud` executable into `bin_dir`; returns the environment changes that make it
    the first `gcloud` on PATH, backed by `state_path`."""
    os.makedirs(bin_dir, exist_ok=True)
    gcloud = os.path.join(bin_dir, "gcloud")
    with open(gcloud, "w") as f:
        f.write(f'#!/bin/sh\nexec {sys.executable} {os.path.abspath(__file__)} "$@"\n')
    os.chmod(gcloud, 0o755)
    return {"PATH": f"{bin_dir}:{os.environ.get('PATH', '')}", STATE_ENV: state_path}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
