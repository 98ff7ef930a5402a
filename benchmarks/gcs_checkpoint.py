"""How long a BERT-Base-size checkpoint save takes in a bucket (a local Cloud Storage emulator)
against local disk: the pretraining Checkpointer (Orbax, TensorStore) saving BertForPreTraining's
parameters and both AdamW slots (3 x 110M float32 values, random: nothing compresses), once
warmed up, the median of --repeats saves per target, alternating.

    PYTHONPATH=. .venv/bin/python benchmarks/gcs_checkpoint.py --repeats 3

The emulator (tests/gcs_emulator.py) runs on this machine: the figure is the cost of Orbax's
and TensorStore's requests through the Cloud Storage API over localhost, not a network's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bert_jax.runtime import fs  # noqa: E402
from bert_jax.training import checkpointing, config_lib, data_position
from tests import gcs_emulator  # noqa: E402


def base_state() -> dict:
    """BERT-Base params (vocab padded to 30592, as the configs) and two slots of the same shapes."""
    import flax.linen as nn

    from bert_jax.core.model import BertForPreTraining
    from bert_jax.core.trainer import dummy_batch, model_inputs

    config = config_lib.bert_config(config_lib.pretraining_config("base"))
    shapes = jax.eval_shape(
        lambda: BertForPreTraining(config).init(
            jax.random.key(0), **model_inputs(dummy_batch(1, 8, 2))
        )
    )
    rng = np.random.default_rng(0)
    params = jax.tree.map(
        lambda s: rng.standard_normal(s.shape, dtype=np.float32),
        nn.meta.unbox(shapes)["params"],
    )
    return {"params": params, "mu": params, "nu": params}


def time_saves(directory: str, state, mesh, repeats: int, start: int) -> list[float]:
    checkpointer = checkpointing.Checkpointer(directory, keep=2, async_save=False)
    position = data_position.encode_position(0, None, mesh)
    times = []
    for step in range(start, start + repeats):
        began = time.perf_counter()
        checkpointer.save(step, state, position)
        checkpointer.wait()
        times.append(time.perf_counter() - began)
    checkpointer.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    state = base_state()
    size = sum(x.nbytes for x in jax.tree.leaves(state))
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    with tempfile.TemporaryDirectory() as tmp, gcs_emulator.running(Path(tmp) / "gcs") as emu:
        emu.create_bucket("bench-bucket")
        targets = {"local disk": str(Path(tmp) / "ckpt"), "emulator": "gs://bench-bucket/ckpt"}
        for directory in targets.values():  # warm-up: compile, connections
            time_saves(directory, state, mesh, 1, 0)
        results: dict[str, list[float]] = {name: [] for name in targets}
        for i in range(args.repeats):
            for name, directory in targets.items():
                results[name] += time_saves(directory, state, mesh, 1, 1 + i)
        print(f"checkpoint of {size / 2**20:.0f} MiB (BERT-Base params + 2 AdamW slots, float32)")
        for name, times in results.items():
            shown = ", ".join(f"{t:.2f}" for t in times)
            median = statistics.median(times)
            print(f"{name:>10}: median {median:.2f} s over {len(times)} ({shown})")
        print("bucket objects:", len(list(fs.walk_files("gs://bench-bucket/ckpt"))))


if __name__ == "__main__":
    main()
