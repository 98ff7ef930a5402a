"""Train step: learning really happens, and non-finite steps are skipped and counted."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_jax.core import optim, partitioning, trainer
from bert_jax.core.trainer import ShardedTrainer
from tests.helpers import random_batch, random_state, tiny_config

# The training tests need a model that learns, not depth: one layer compiles in about half the
# time of two, and still overfits one batch (loss 6.9 -> 0.004 in 60 steps, the bound is 0.1)
# and trains with LAMB (loss ratio 0.31 after 20 steps, the bound is 0.7). The init is not
# what they test: they start from `random_state` (BERT's init scale; no init program compiled).
ONE_LAYER = tiny_config(
    num_hidden_layers=1, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
)


def _one_device_mesh():
    """Learning and skipping need no split: one device compiles and runs a step in a fraction
    of the 8-device data-parallel step's CPU time (test_partitioning holds every mesh's steps
    to one device's, test_gradient_accumulation below accumulates on the (2, 2, 2) mesh)."""
    return partitioning.make_mesh((1, 1, 1), devices=jax.devices()[:1])


def _trainer(config, lr=1e-3, total_steps=1000, warmup=10):
    schedule = optim.warmup_decay(lr, warmup, total_steps)
    return ShardedTrainer(config, optim.bert_adamw(schedule), _one_device_mesh(), schedule=schedule)


@pytest.fixture(scope="module")
def overfit_trainer():
    """One compiled step (no dropout, AdamW at 5e-3) for the overfitting and non-finite tests."""
    return _trainer(ONE_LAYER, lr=5e-3)


def test_tiny_model_overfits_one_batch(overfit_trainer):
    trainer = overfit_trainer
    state = random_state(trainer)
    batch = trainer.global_batch(random_batch(np.random.default_rng(0), 8, 32, 5, 512))
    first = None
    for _ in range(60):
        state, metrics = trainer.train_step(state, batch, jax.random.key(1))
        first = first if first is not None else float(metrics["loss"])
    final = float(metrics["loss"])
    assert first > 5.0, first  # ~ln(512) + ln(2) at initialization
    assert final < 0.1, (first, final)
    assert int(state.step) == 60 and int(state.skipped) == 0


def test_non_finite_step_is_skipped_and_counted(overfit_trainer):
    trainer = overfit_trainer
    state = random_state(trainer)
    batch = random_batch(np.random.default_rng(1), 8, 32, 5, 512)
    state, _ = trainer.train_step(state, trainer.global_batch(batch), jax.random.key(1))
    before = jax.tree.map(np.asarray, state.params)
    poisoned = dict(batch, masked_lm_weights=np.full_like(batch["masked_lm_weights"], np.nan))
    state, metrics = trainer.train_step(state, trainer.global_batch(poisoned), jax.random.key(1))
    assert not bool(metrics["finite"])
    assert int(state.skipped) == 1 and int(state.step) == 2
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(before)):
        np.testing.assert_array_equal(np.asarray(a), b)
    state, metrics = trainer.train_step(state, trainer.global_batch(batch), jax.random.key(1))
    assert bool(metrics["finite"]) and int(state.skipped) == 1


def test_gradient_accumulation_equals_the_full_batch():
    config = ONE_LAYER
    batches = [random_batch(np.random.default_rng(i), 16, 32, 5, 512) for i in range(2)]
    results = []
    for accum in (1, 4):
        # SGD is linear in the gradient, so equal updates mean equal gradients (Adam would turn
        # rounding noise in gradients that are zero in theory, e.g. the key bias's, into +-lr).
        trainer = ShardedTrainer(
            config, optax.sgd(0.5), partitioning.make_mesh((2, 2, 2)), accum_steps=accum
        )
        state = random_state(trainer)  # the same parameters for both
        losses = []
        for batch in batches:
            state, metrics = trainer.train_step(
                state, trainer.global_batch(batch), jax.random.key(1)
            )
            losses.append(float(metrics["loss"]))
        results.append((losses, jax.tree.map(np.asarray, jax.device_get(state.params))))
    np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-6)
    for a, b in zip(jax.tree.leaves(results[0][1]), jax.tree.leaves(results[1][1])):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)


def test_lamb_trains():
    config = ONE_LAYER
    schedule = optim.warmup_decay(5e-2, 2, 100)
    trainer = ShardedTrainer(config, optim.lamb(schedule), _one_device_mesh(), schedule=schedule)
    state = random_state(trainer)
    batch = trainer.global_batch(random_batch(np.random.default_rng(0), 8, 32, 5, 512))
    losses = []
    for _ in range(20):
        state, metrics = trainer.train_step(state, batch, jax.random.key(1))
        losses.append(float(metrics["loss"]))
    assert losses[-1] < 0.7 * losses[0], losses


def test_init_and_dropout_keys():
    init, dropout = trainer.init_and_dropout_keys(3, "threefry2x32")
    want_init, want_dropout = jax.random.split(jax.random.key(3))
    assert (jax.random.key_data(init) == jax.random.key_data(want_init)).all()
    assert (jax.random.key_data(dropout) == jax.random.key_data(want_dropout)).all()
    init_rbg, dropout_rbg = trainer.init_and_dropout_keys(3, "rbg")
    # Init does not depend on the dropout PRNG; the dropout key is of the asked implementation.
    assert (jax.random.key_data(init_rbg) == jax.random.key_data(want_init)).all()
    assert jax.random.key_impl(dropout_rbg) == jax.random.key_impl(jax.random.key(0, impl="rbg"))
    with pytest.raises(ValueError, match="dropout_rng_impl"):
        trainer.init_and_dropout_keys(3, "philox")


def test_update_is_generic_over_the_loss_and_scales_by_the_learning_rate():
    # Fine-tuning's use: its own loss, a unit-rate optimizer and this step's rate as an argument.
    def loss_fn(params, batch, dropout_rng):
        del dropout_rng
        loss = jnp.sum((params["w"] * batch["x"]) ** 2)
        return loss, {"loss_sum": loss}

    tx = optax.sgd(1.0)
    w = jnp.array([1.0, -2.0, 3.0])
    batch = {"x": jnp.array([1.0, 0.5, 2.0])}
    state = trainer.TrainState.create({"w": w}, tx)
    # Compiled, once for both calls (op by op, each of the update's operations compiles alone).
    update = jax.jit(functools.partial(trainer.update, loss_fn=loss_fn, tx=tx))
    state, metrics = update(state, batch, jax.random.key(0), jnp.float32(0.25))
    np.testing.assert_allclose(state.params["w"], w - 0.25 * 2 * w * batch["x"] ** 2, rtol=1e-6)
    assert int(state.step) == 1 and float(metrics["loss"]) == float(metrics["loss_sum"])
    assert bool(metrics["finite"]) and float(metrics["grad_norm"]) > 0
    poisoned = {"x": batch["x"].at[0].set(jnp.inf)}
    after, metrics = update(state, poisoned, jax.random.key(0), jnp.float32(0.25))
    assert not bool(metrics["finite"]) and int(after.skipped) == 1 and int(after.step) == 2
    np.testing.assert_array_equal(after.params["w"], state.params["w"])
