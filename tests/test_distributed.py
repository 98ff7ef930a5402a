"""Multi-process training on localhost (2 processes x 4 CPU devices against 1 process x 8),
failure detection, start-up consistency checks, input shards, and the AOT compile check."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from bert_jax import cli
from bert_jax.data.pipeline import input_shards as shards
from bert_jax.planning import compile_check, cost_model
from bert_jax.runtime import distributed
from bert_jax.training import metric_writers, pretrain
from tests.test_pretrain import ONE_PHASE, losses_by_step, small_config
from tests.xla_flags import with_devices

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Six steps with a checkpoint at 3, on a (data, fsdp) mesh: data spans the two processes.
RUN = {**ONE_PHASE, "total_steps": 6, "checkpoint.every_steps": 3, "mesh.shape": (2, 4, 1)}
JOB_TIMEOUT = 300  # seconds; generous because two workers share 2 CPU cores in `make test`


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _child_env() -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("XLA_FLAGS", None)  # each child sets 4 devices itself, before importing JAX
    return env


def _start_job(spec: dict, logs_dir) -> list[subprocess.Popen]:
    """Two `tests.distributed_child` processes joined through jax.distributed on localhost."""
    port = _free_port()
    procs = []
    for process_id in (0, 1):
        child = {**spec, "process_id": process_id, "num_processes": 2, "port": port}
        log = open(os.path.join(logs_dir, f"process-{process_id}.log"), "w")  # noqa: SIM115
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "tests.distributed_child", json.dumps(child)],
                cwd=REPO,
                env=_child_env(),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    return procs


def _tail(logs_dir, process_id: int, lines: int = 30) -> str:
    with open(os.path.join(logs_dir, f"process-{process_id}.log"), encoding="utf-8") as f:
        kept = [line for line in f if "[Gloo]" not in line]
    return "".join(kept[-lines:])


def _wait(procs, logs_dir) -> None:
    deadline = time.monotonic() + JOB_TIMEOUT
    try:
        for proc in procs:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for i, proc in enumerate(procs):
        assert proc.returncode == 0, f"process {i} exited {proc.returncode}:\n{_tail(logs_dir, i)}"


def _original_rows(batch) -> list[bytes]:
    """Each example's unmasked tokens and segments: identical only for the same record."""
    ids = batch["input_ids"].copy()
    keys = []
    for row in range(len(ids)):
        chosen = batch["masked_lm_weights"][row] > 0
        ids[row, batch["masked_lm_positions"][row, chosen]] = batch["masked_lm_ids"][row, chosen]
        keys.append(ids[row].tobytes() + batch["segment_ids"][row].tobytes())
    return keys


def _exported_params(workdir):
    import jax

    from bert_jax.convert import model_dir

    return jax.tree.leaves(model_dir.load_model_dir(os.path.join(workdir, "model")).params)


def _max_difference(a, b) -> float:
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))


@pytest.mark.slow
def test_two_processes_compute_what_one_process_computes(shared_dirs, tmp_path):  # noqa: F811
    """2 processes x 4 devices == 1 process x 8 devices reading the same two input shards:
    same global batches (each process reads its own disjoint half), losses and parameters
    within 1e-5; and the 2-process checkpoint continues in 1 process as it did in 2."""
    # One process, two input shards: the global batch of the 2-process run, by construction.
    single_dir = str(tmp_path / "single")
    fed: dict[str, list] = {}

    def record(step, batch):
        for key, value in batch.items():
            fed.setdefault(key, []).append(value)
        return batch

    one_process = small_config(shared_dirs, **RUN, **{"data.shards": 2, "export_model": True})
    pretrain.pretrain(one_process, single_dir, step_hook=record)

    multi_dir = str(tmp_path / "multi")
    spec = {
        "workdir": multi_dir,
        "record": str(tmp_path / "fed"),
        "shared_dirs": shared_dirs,
        "overrides": {**RUN, "export_model": True},
    }
    _wait(_start_job(spec, tmp_path), tmp_path)

    # The data: each process fed half of every global batch, the halves are disjoint, and
    # together they are exactly what the single process fed.
    halves = [np.load(str(tmp_path / f"fed-{i}.npz")) for i in (0, 1)]
    for key, values in fed.items():
        assert halves[0][key].shape[1] == halves[1][key].shape[1] == 4, key
        joined = np.concatenate([halves[0][key], halves[1][key]], axis=1)
        np.testing.assert_array_equal(joined, np.stack(values), err_msg=key)
    rows = [
        {key for step in range(6) for key in _original_rows({k: h[k][step] for k in h.files})}
        for h in halves
    ]
    assert len(rows[0]) > 6 and len(rows[1]) > 6
    assert not rows[0] & rows[1], "the two processes read a common example"

    # The numbers.
    single_losses, multi_losses = losses_by_step(single_dir), losses_by_step(multi_dir)
    assert sorted(multi_losses) == list(range(1, 7))
    loss_gap = max(abs(single_losses[s] - multi_losses[s]) for s in multi_losses)
    param_gap = _max_difference(_exported_params(single_dir), _exported_params(multi_dir))
    print(
        f"2 vs 1 process: max loss difference {loss_gap:.2e}, max param difference {param_gap:.2e}"
    )
    assert loss_gap < 1e-5 and param_gap < 1e-5
    # Written once, by process 0: one metrics row per step, one model directory.
    rows_logged = metric_writers.read_jsonl(os.path.join(multi_dir, "metrics.jsonl"), kind="train")
    assert [row["step"] for row in rows_logged] == [1, 2, 3, 4, 5, 6]

    # The 2-process checkpoint at step 3 (state + both shards' data positions) in 1 process.
    resumed_dir = str(tmp_path / "resumed")
    shutil.copytree(multi_dir, resumed_dir, ignore=shutil.ignore_patterns("6", "model"))
    os.remove(os.path.join(resumed_dir, "metrics.jsonl"))
    result = pretrain.pretrain(one_process, resumed_dir)
    assert result.final_step == 6
    resumed_losses = losses_by_step(resumed_dir)
    assert sorted(resumed_losses) == [4, 5, 6]
    resume_gap = max(abs(resumed_losses[s] - multi_losses[s]) for s in (4, 5, 6))
    resume_param_gap = _max_difference(_exported_params(resumed_dir), _exported_params(multi_dir))
    print(f"resumed in 1 process: loss {resume_gap:.2e}, params {resume_param_gap:.2e}")
    assert resume_gap < 1e-5 and resume_param_gap < 1e-5


def test_a_process_that_dies_stops_the_other(shared_dirs, tmp_path):  # noqa: F811
    """Process 1 is SIGKILLed as training starts (data ready, first step being fed); process
    0, which goes on into the step's collectives, must exit with an error within the heartbeat
    bound instead of waiting forever."""
    spec = {
        "workdir": str(tmp_path / "run"),
        "shared_dirs": shared_dirs,
        "overrides": RUN,  # the programs of the test above: compiled once (persistent cache)
        "die_at_step": 0,
        "die_process": 1,
        "heartbeat_timeout": 5,
    }
    survivor, dying = _start_job(spec, tmp_path)
    try:
        dying.wait(timeout=JOB_TIMEOUT)
        died_at = time.monotonic()
        assert dying.returncode == -9, _tail(tmp_path, 1)
        survivor.wait(timeout=60)
        took = time.monotonic() - died_at
    finally:
        for proc in (survivor, dying):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    print(f"the survivor exited {survivor.returncode} {took:.1f} s after its peer died")
    assert survivor.returncode != 0
    assert "final step" not in _tail(tmp_path, 0)


def test_hosts_with_different_configs_stop_with_a_clear_error(shared_dirs, tmp_path):  # noqa: F811
    """Through the CLI flags: the hosts compare config digests first and every one exits 2,
    naming the setting that differs, instead of hanging or training different models."""
    config_file = tmp_path / "config.py"
    config_file.write_text(
        f"import sys\nsys.path.insert(0, {REPO!r})\n"
        "from tests.test_pretrain import small_config\n\n\n"
        f"def get_config():\n    return small_config({shared_dirs!r}, **{RUN!r})\n"
    )
    port = _free_port()
    env = dict(_child_env(), XLA_FLAGS=with_devices(4))
    env["JAX_PLATFORMS"] = "cpu"
    procs = []
    for process_id, learning_rate in ((0, "0.001"), (1, "0.002")):
        argv = [
            *(sys.executable, "-m", "bert_jax.cli", "pretrain", "--config", str(config_file)),
            *(
                "--workdir",
                str(tmp_path / "run"),
                f"--config.optimizer.learning_rate={learning_rate}",
            ),
            *("--coordinator-address", f"localhost:{port}", "--num-processes", "2"),
            *("--process-id", str(process_id), "--heartbeat-timeout", "10"),
        ]
        procs.append(
            subprocess.Popen(
                argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    outputs = [proc.communicate(timeout=JOB_TIMEOUT) for proc in procs]
    for proc, (_, err) in zip(procs, outputs):
        assert proc.returncode == 2, err[-3000:]
        assert "the hosts of this job disagree on config" in err
        assert "process 1: config.optimizer.learning_rate=0.002 (process 0: 0.001)" in err


# --- settings from the environment (no processes started) --------------------------------------

SRUN_TASK = {
    "SLURM_JOB_ID": "4242",
    "SLURM_STEP_NODELIST": "gpu[017-018,020]",
    "SLURM_NTASKS": "24",
    "SLURM_PROCID": "9",
    "SLURM_LOCALID": "1",
}


@pytest.mark.parametrize(
    "env, kwargs, expected",
    [
        ({}, {}, None),
        (
            {"BERT_JAX_COORDINATOR": "h0:1234", "BERT_JAX_NUM_PROCESSES": "4"},
            {"process_id": 2},
            distributed.Startup("explicit", "h0:1234", 4, 2, None, "deactivate"),
        ),
        (
            {"JAX_COORDINATOR_ADDRESS": "h0:1", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1"},
            {"local_device_ids": "0,1"},
            distributed.Startup("explicit", "h0:1", 2, 1, (0, 1), "deactivate"),
        ),
        (
            {
                "BERT_JAX_COORDINATOR": "h0:1",
                "BERT_JAX_NUM_PROCESSES": "1",
                "BERT_JAX_PROCESS_ID": "0",
            },
            {},
            None,
        ),
        (
            SRUN_TASK,
            {},
            distributed.Startup(
                "slurm", f"gpu017:{4242 % 4096 + 61440}", 24, 9, (1,), "deactivate"
            ),
        ),
        (
            {**SRUN_TASK, "BERT_JAX_LOCAL_DEVICE_IDS": "all", "BERT_JAX_COORDINATOR_PORT": "999"},
            {},
            distributed.Startup("slurm", "gpu017:999", 24, 9, None, "deactivate"),
        ),
        ({**SRUN_TASK, "SLURM_NTASKS": "1"}, {}, None),
        # Inside an sbatch script but outside srun: one process, not an error.
        ({"SLURM_JOB_ID": "1", "SLURM_NTASKS": "8", "SLURM_PROCID": "0"}, {}, None),
        (
            {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "3"},
            {},
            distributed.Startup("ompi", None, None, None, None, "ompi"),
        ),
        ({"TPU_WORKER_HOSTNAMES": "t0,t1,t2,t3"}, {}, distributed.Startup("tpu")),
        ({**SRUN_TASK, "BERT_JAX_COORDINATOR": "h:1"}, {"mode": "off"}, None),
        ({}, {"mode": "on"}, distributed.Startup("jax")),
    ],
)
def test_startup_reads_flags_then_the_environment(env, kwargs, expected):
    assert distributed.choose_startup(env=env, **kwargs) == expected


@pytest.mark.parametrize(
    "env, kwargs, message",
    [
        ({"BERT_JAX_COORDINATOR": "h:1"}, {}, "is set but the number of processes"),
        ({"BERT_JAX_COORDINATOR": "h:1", "BERT_JAX_NUM_PROCESSES": "2"}, {}, "this process's id"),
        ({}, {"coordinator_address": "h", "num_processes": 2, "process_id": 0}, "needs a port"),
        ({}, {"coordinator_address": "h:1", "num_processes": 2, "process_id": 2}, "must be in"),
        ({"BERT_JAX_NUM_PROCESSES": "2"}, {}, "no coordinator address"),
        ({"BERT_JAX_DISTRIBUTED": "maybe"}, {}, "distributed mode"),
        ({"BERT_JAX_NUM_PROCESSES": "two"}, {}, "not an integer"),
        ({"BERT_JAX_LOCAL_DEVICE_IDS": "local-rank"}, {"mode": "on"}, "no local rank"),
    ],
)
def test_startup_errors_name_the_missing_setting(env, kwargs, message):
    with pytest.raises(ValueError, match=message):
        distributed.choose_startup(env=env, **kwargs)


@pytest.mark.parametrize(
    "nodelist, first",
    [("node001", "node001"), ("a1,b2", "a1"), ("gpu[017-020,031]", "gpu017"), ("n[9],m1", "n9")],
)
def test_first_slurm_host(nodelist, first):
    assert distributed.first_slurm_host(nodelist) == first


def test_config_differences_are_named_key_by_key():
    a = json.dumps({"optimizer": {"learning_rate": 1e-4, "b1": 0.9}, "seed": 0})
    b = json.dumps({"optimizer": {"learning_rate": 2e-4, "b1": 0.9}, "seed": 0, "extra": 1})
    assert distributed.describe_difference("config", a, b) == [
        "config.extra=1 (process 0: (absent))",
        "config.optimizer.learning_rate=0.0002 (process 0: 0.0001)",
    ]
    assert distributed.describe_difference("step", "3", "None") == ["step=None (process 0: 3)"]


# --- input shards -------------------------------------------------------------------------------


class _Reader:
    def __init__(self, shard, num_shards, batch_size):
        self.shard, self.size, self.position = shard, batch_size, 0
        self.fingerprint = f"{shard:04x}{num_shards:04x}"

    def __next__(self):
        self.position += 1
        return {"x": np.full((self.size,), self.shard * 100 + self.position)}

    def get_state(self):
        return {"epoch": 0, "batches_in_epoch": self.position, "fingerprint": self.fingerprint}

    def set_state(self, state):
        assert state["fingerprint"] == self.fingerprint, "wrong shard's position"
        self.position = state["batches_in_epoch"]


def test_input_shards_make_the_global_batch_independent_of_the_process_count():
    def global_batches(process_count, steps=3):
        inputs = [
            shards.ShardedInput.build(
                _Reader,
                global_batch_size=8,
                shards_setting=4,
                process_index=p,
                process_count=process_count,
            )
            for p in range(process_count)
        ]
        return [np.concatenate([next(i)["x"] for i in inputs]) for _ in range(steps)], inputs

    one, (single,) = global_batches(1)
    for processes in (2, 4):
        many, inputs = global_batches(processes)
        np.testing.assert_array_equal(np.stack(one), np.stack(many))
        # The position table (by shard) taken from many processes restores in one.
        table = [state for i in inputs for state in i.get_state()]
        restored = shards.ShardedInput.build(
            _Reader, global_batch_size=8, shards_setting=4, process_index=0, process_count=1
        )
        restored.set_state(table)
        assert next(restored)["x"].tolist() == [4, 4, 104, 104, 204, 204, 304, 304]
    assert single.shard_indices == range(0, 4)
    with pytest.raises(ValueError, match="config.data.shards=3 must be a positive multiple"):
        shards.layout(3, 0, 2)
    with pytest.raises(ValueError, match="not divisible by the 4 input shards"):
        shards.ShardedInput.build(
            _Reader, global_batch_size=6, shards_setting=4, process_index=0, process_count=1
        )
    with pytest.raises(ValueError, match="has 2 input shards, this run reads 4"):
        single.set_state(table[:2])


def test_position_table_round_trip():
    from bert_jax.core import partitioning
    from bert_jax.training import data_position

    mesh = partitioning.make_mesh((2, 4, 1))
    states = [
        {"epoch": 1, "batches_in_epoch": 7, "batches_total": 30, "fingerprint": "00ff00ff00ff00ff"},
        {"epoch": 2, "batches_in_epoch": 0, "batches_total": 31, "fingerprint": "123456789abcdef0"},
    ]
    position = data_position.encode_position(1, states, mesh)
    assert position.shape == (2, 8) and position.sharding.is_fully_replicated
    phase, decoded = data_position.decode_position(position)
    assert phase == 1 and decoded == [dict(s, version=1) for s in states]
    assert data_position.decode_position(data_position.encode_position(0, [None], mesh)) == (
        0,
        None,
    )


# --- ahead-of-time compile check ---------------------------------------------------------------

TINY_ONE_PHASE = [
    "--config.model.num_hidden_layers=1",  # what is checked is the report, not the depth
    "--config.phase1.fraction=1.0",
    "--config.phase2.fraction=0.0",
    "--config.phase1.batch_size=16",
    "--config.phase1.max_seq_length=32",
    "--config.phase1.max_predictions_per_seq=5",
    "--config.mesh.shape=(2,4,1)",
]


def test_compile_only_prints_the_memory_per_device_without_initializing(capsys, monkeypatch):
    from bert_jax.core import trainer

    def no_init(*args, **kwargs):
        raise AssertionError("--compile-only must not initialize the state")

    monkeypatch.setattr(trainer.ShardedTrainer, "init", no_init)
    argv = ["pretrain", "--config", f"{REPO}/configs/bert.py:tiny", *TINY_ONE_PHASE]
    # ml_collections finds `--config.key=value` overrides in sys.argv, as a console script has it.
    monkeypatch.setattr(sys, "argv", ["bert-jax", *argv])
    assert cli.main([*argv, "--compile-only", "--device-memory-gib", "0.001"]) == 4
    out = capsys.readouterr().out
    assert "compile check: 8 cpu device(s) (cpu), mesh {'data': 2, 'fsdp': 4, 'tensor': 1}" in out
    assert "phase1: global batch 16 x seq 32 (5 predictions): arguments " in out
    assert "verdict: DOES NOT FIT: the largest phase (phase1) needs" in out
    assert "of 0.001 GiB per device" in out

    argv = [*argv, "--config.phase1.batch_size=12", "--compile-only"]
    monkeypatch.setattr(sys, "argv", ["bert-jax", *argv])
    assert cli.main(argv) == 2
    assert "config.phase1.batch_size=12 is not divisible" in capsys.readouterr().err


def test_compile_report_verdicts():
    memory = cost_model.Memory(2**30, 2**30, 2**30, 3 * 2**30, 0)
    cost = cost_model.ProgramCost(1e12, 1e9, 0.0, 0, {})
    phase = compile_check.PhaseCompile("phase2", 256, 512, 80, 1, memory, cost, None, 1e12, 1.0)
    report = compile_check.CompileReport(
        {"data": 8, "fsdp": 1, "tensor": 1},
        "tpu",
        "TPU v4",
        8,
        1,
        32 * 2**30,
        "reported by the device",
        [phase],
    )
    text = compile_check.format_report(report)
    assert (
        report.fits
        and "verdict: fits: the largest phase (phase2) needs 4.000 GiB of 32.000 GiB" in text
    )
    assert report.estimates(phase) is None  # no cost model: no estimate
    unknown = dataclasses.replace(report, device_memory_bytes=None, memory_source="unknown")
    assert unknown.fits is None and "verdict: unknown" in compile_check.format_report(unknown)
    small = dataclasses.replace(report, device_memory_bytes=3 * 2**30)
    assert "short by 1.000 GiB" in compile_check.format_report(small)
