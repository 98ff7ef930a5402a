"""One process of a multi-process pretraining run on localhost (started by test_distributed.py).

    python -m tests.distributed_child '{"process_id": 0, "num_processes": 2, "port": 1234, ...}'

Sets its own device count before JAX is imported (the parent's conftest is not loaded here),
joins the job through `bert_jax.runtime.distributed.initialize`, runs `pretrain.pretrain` on
`tests.test_pretrain.small_config(shared_dirs, **overrides)` and, with `record`, saves the batch
this process fed at every step to `<record>-<process_id>.npz`; with `die_at_step`, process
`die_process` kills itself (SIGKILL) when it reaches that step.
"""

from __future__ import annotations

import json
import os
import signal
import sys


def _setup_jax(devices: int):
    from tests.xla_flags import with_devices

    os.environ["XLA_FLAGS"] = with_devices(devices)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import jax

    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_numpy_rank_promotion", "raise")
    return jax


def config_from(spec: dict):
    from tests.test_pretrain import small_config

    overrides = {k: tuple(v) if isinstance(v, list) else v for k, v in spec["overrides"].items()}
    return small_config(spec["shared_dirs"], **overrides)


def main(spec: dict) -> None:
    from bert_jax.cli import collect_garbage_less_often  # imports nothing of JAX

    collect_garbage_less_often()  # as in `bert-jax` processes
    jax = _setup_jax(int(spec.get("devices", 4)))
    from bert_jax.runtime import distributed
    from bert_jax.training import pretrain

    distributed.initialize(
        coordinator_address=f"localhost:{spec['port']}",
        num_processes=int(spec["num_processes"]),
        process_id=int(spec["process_id"]),
        initialization_timeout=int(spec.get("initialization_timeout", 60)),
        heartbeat_timeout=int(spec.get("heartbeat_timeout", 10)),
    )
    assert jax.process_count() == int(spec["num_processes"]), jax.process_count()
    fed: dict[str, list] = {}

    def hook(step, batch):
        if step == spec.get("die_at_step") and jax.process_index() == spec.get("die_process"):
            os.kill(os.getpid(), signal.SIGKILL)  # a host that vanishes mid-run
        for key, value in batch.items():
            fed.setdefault(key, []).append(value)
        return batch

    result = pretrain.pretrain(config_from(spec), spec["workdir"], step_hook=hook)
    if spec.get("record"):
        import numpy as np

        path = f"{spec['record']}-{jax.process_index()}.npz"
        np.savez(path, **{key: np.stack(values) for key, values in fed.items()})
    print(f"final step {result.final_step}", flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
