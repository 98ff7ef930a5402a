"""checkpointing: train state + data position round trip, the params-only restore, directories."""

from __future__ import annotations

import os
import signal

import jax
import numpy as np
import optax
import pytest

from bert_jax.core import partitioning
from bert_jax.core.trainer import ShardedTrainer
from bert_jax.training import checkpointing, data_position
from tests.helpers import tiny_config


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny sharded train state (2x2x2 mesh, Adam slots filled) saved at steps 3 and 5."""
    directory = str(tmp_path_factory.mktemp("ckpt") / "checkpoints")
    mesh = partitioning.make_mesh((2, 2, 2))
    # One layer: a round trip reads every kind of leaf whatever the depth; the init compiles.
    trainer = ShardedTrainer(tiny_config(num_hidden_layers=1), optax.adam(1e-3), mesh)
    state = trainer.init(jax.random.key(0))
    # Non-trivial optimizer slots and step, so a mixed-up restore cannot pass by accident.
    grads = jax.tree.map(lambda p: np.full(p.shape, 0.5, p.dtype), state.params)
    # Compiled: eagerly, Adam's update goes op by op over every sharded leaf.
    updates, opt_state = jax.jit(trainer.tx.update)(grads, state.opt_state, state.params)
    state = state.replace(step=state.step + 5, opt_state=opt_state)
    checkpointer = checkpointing.Checkpointer(directory, keep=2, async_save=True)
    shard_states = [
        {"version": 1, "epoch": 1, "batches_in_epoch": 7, "batches_total": 19, "fingerprint": "ab"}
    ]
    checkpointer.save(3, state, data_position.encode_position(0, None, mesh))
    checkpointer.save(5, state, data_position.encode_position(1, shard_states, mesh))
    checkpointer.wait()
    checkpointer.close()
    return directory, trainer, state, shard_states


def assert_trees_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_state_and_data_position_round_trip(saved):
    directory, trainer, state, shard_states = saved
    checkpointer = checkpointing.Checkpointer(directory, async_save=False)
    assert checkpointer.all_steps() == [3, 5] and checkpointer.latest_step() == 5
    restored, phase, position = checkpointer.restore(trainer.abstract_state(), trainer.mesh)
    assert_trees_equal(restored, state)
    shardings = jax.tree.map(lambda x: x.sharding, restored)
    assert shardings == trainer.state_shardings  # straight onto the mesh, as saved
    expected = dict(shard_states[0], fingerprint=f"{int('ab', 16):016x}")
    assert (phase, position) == (1, [expected])
    # A checkpoint saved before the data pipeline started has no position.
    _, phase, position = checkpointer.restore(trainer.abstract_state(), trainer.mesh, step=3)
    assert (phase, position) == (0, None)
    # Another number of input shards: the state only, the position starts afresh.
    restored, phase, position = checkpointer.restore(
        trainer.abstract_state(), trainer.mesh, num_shards=2
    )
    assert (phase, position) == (None, None)
    assert_trees_equal(restored.params, state.params)
    checkpointer.close()


def test_params_only_restore_needs_no_optimizer(saved):
    """A partial restore: the target names the params alone, on one CPU device."""
    directory, _, state, _ = saved
    cpu = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
    target = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=cpu), state.params
    )
    checkpointer = checkpointing.Checkpointer(directory, async_save=False)
    params, step = checkpointer.restore_params(target)
    assert step == 5
    assert_trees_equal(params, state.params)
    assert {leaf.sharding for leaf in jax.tree.leaves(params)} == {cpu}
    params, step = checkpointer.restore_params(target, step=3)
    assert step == 3
    checkpointer.close()


def test_checkpoint_directories(saved, tmp_path):
    directory, _, _, _ = saved
    workdir = os.path.dirname(directory)
    assert checkpointing.find_checkpoint_dir(workdir) == directory
    assert checkpointing.find_checkpoint_dir(directory) == directory
    with pytest.raises(checkpointing.CheckpointError, match="no checkpoints at .*typo"):
        checkpointing.find_checkpoint_dir(str(tmp_path / "typo"))
    assert not os.path.exists(tmp_path / "typo")
    empty = checkpointing.Checkpointer(str(tmp_path / "empty"), async_save=False)
    with pytest.raises(checkpointing.CheckpointError, match="no checkpoint in"):
        empty.restore_params({})
    with pytest.raises(checkpointing.CheckpointError, match="no checkpoint in"):
        empty.restore({}, partitioning.make_mesh((-1, 1, 1)))
    empty.close()


def test_sigterm_becomes_a_flag_until_restored(saved):
    directory, _, _, _ = saved
    checkpointer = checkpointing.Checkpointer(directory, async_save=False)
    preemption = checkpointing.Preemption(checkpointer)
    try:
        assert not preemption.requested(6)
        os.kill(os.getpid(), signal.SIGTERM)
        assert preemption.requested(6)
    finally:
        preemption.restore()
        checkpointer.close()
    assert signal.getsignal(signal.SIGTERM) is not preemption._handle  # noqa: SLF001
