"""Sharding on 8 emulated CPU devices: rules, state born sharded, same numbers as 1 device."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from bert_jax.core import optim, partitioning
from bert_jax.core.trainer import ShardedTrainer, init_and_dropout_keys
from tests.helpers import random_batch, tiny_config

# `make test` trains on the meshes that split every axis (2, 2, 2: the batch, the layers and the
# vocabulary each 2-way) and 4-way tensor parallelism (1, 2, 4: the padded table divided over 4);
# `make test-slow` on pure data parallelism over 8 and 4-way FSDP (tests/conftest.py).
# make test trains on the first two (every axis split; tensor=4, where the vocabulary pads),
# make test-slow on the other two as well (tests/conftest.py names them).
MESHES = [(2, 2, 2), (1, 2, 4), (8, 1, 1), (2, 4, 1)]
# 510 rows do not divide over tensor=4; padded to 512 they do. Every run of this module uses the
# padded table, so each mesh also checks that the padding shards and stays zero (one compile per
# mesh serves both properties).
VOCAB_SIZE = 510
# One encoder layer: every rule the tests check is per layer (layer_0's) and the embeddings and
# heads are whole; a second layer would only double what each of the eight compiles compiles.
LAYERS = 1


def _padded_config(**overrides):
    return tiny_config(
        vocab_size=VOCAB_SIZE, vocab_pad_multiple=128, num_hidden_layers=LAYERS, **overrides
    )


def _trainer(mesh_shape, config=None, devices=None):
    config = config or _padded_config()
    schedule = optim.warmup_decay(1e-3, warmup_steps=2, total_steps=10)
    tx = optim.bert_adamw(schedule)
    mesh = partitioning.make_mesh(mesh_shape, devices=devices)
    return ShardedTrainer(config, tx, mesh, schedule=schedule)


@functools.cache
def _mesh_trainer(mesh_shape):
    """The padded model's trainer on `mesh_shape`, shared by the tests that read that mesh (its
    steps traced and compiled once)."""
    return _trainer(mesh_shape)


def _run(trainer, steps=3, dropout_rng=None, initial=None):
    """`steps` steps from the trainer's init (key 0), or from `initial` (a host copy of a
    state, e.g. the one-device init's) placed on the trainer's mesh: no init compiled."""
    # Pretraining's dropout keys (rbg) and hash masks (the model's default).
    dropout_rng = init_and_dropout_keys(0, "rbg")[1] if dropout_rng is None else dropout_rng
    if initial is None:
        state = trainer.init(jax.random.key(0))
    else:
        state = jax.device_put(initial, trainer.state_shardings)
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(steps):
        # 16 rows: with 4-way batch sharding this is the shape where XLA once produced wrong
        # embedding gradients on the (2, 2, 2) mesh (see layers.gathered_table).
        batch = trainer.global_batch(random_batch(rng, 16, 32, 5, trainer.config.vocab_size))
        state, metrics = trainer.train_step(state, batch, dropout_rng)
        losses.append(float(metrics["loss"]))
    return state, losses


@pytest.fixture(scope="module")
def one_device_init():
    """The one-device init (key 0) as a host copy: the start of the runs whose init is not
    what they test (each mesh's own init is held to it below)."""
    trainer = _trainer((1, 1, 1), devices=jax.devices()[:1])
    return trainer, jax.device_get(trainer.init(jax.random.key(0)))


@pytest.fixture(scope="module")
def single_device_run(one_device_init):
    trainer, initial = one_device_init
    return _run(trainer, initial=initial)


def _mesh_id(mesh_shape) -> str:
    return "x".join(map(str, mesh_shape))


def _spec(array) -> P:
    return array.sharding.spec


@pytest.mark.parametrize("mesh_shape", MESHES, ids=_mesh_id)
def test_sharded_training_matches_one_device(mesh_shape, single_device_run):
    """Same losses and parameters as one device, with pretraining's dropout (hash masks, rbg
    keys) on; the rules place every parameter as documented."""
    assert jax.device_count() == 8
    trainer = _mesh_trainer(mesh_shape)
    state, losses = _run(trainer)
    ref_state, ref_losses = single_device_run

    np.testing.assert_allclose(losses, ref_losses, atol=1e-5, rtol=0)
    for got, want in zip(jax.tree.leaves(state.params), jax.tree.leaves(ref_state.params)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=0)

    # The rules: embed -> fsdp, heads/mlp/vocab -> tensor, kv and positions replicated.
    data, fsdp, tensor = mesh_shape
    fs = "fsdp" if fsdp > 1 else None
    tp = "tensor" if tensor > 1 else None
    params = state.params
    layer = params["bert"]["encoder"]["layer_0"]
    norm = lambda spec: P(*[a if a is None or trainer.mesh.shape[a] > 1 else None for a in spec])  # noqa: E731
    expect = {
        "word_embeddings": (
            params["bert"]["embeddings"]["word_embeddings"]["embedding"],
            P(tp, fs),
        ),
        "position_embeddings": (
            params["bert"]["embeddings"]["position_embeddings"]["embedding"],
            P(None, fs),
        ),
        "query": (layer["attention"]["query"]["kernel"], P(fs, tp, None)),
        "query_bias": (layer["attention"]["query"]["bias"], P(tp, None)),
        "attn_out": (layer["attention"]["output"]["kernel"], P(tp, None, fs)),
        "intermediate": (layer["intermediate"]["kernel"], P(fs, tp)),
        "output": (layer["output"]["kernel"], P(tp, fs)),
        "layer_norm": (layer["output_LayerNorm"]["scale"], P(fs)),
        "output_bias": (params["predictions"]["output_bias"], P(tp)),
    }
    for name, (array, spec) in expect.items():
        assert norm(_spec(array)) == spec, (name, _spec(array), spec)
        assert array.sharding.mesh.shape == trainer.mesh.shape
    # The padded table (510 -> 512 rows) divides over tensor; AdamW (weight decay 0.01) leaves
    # its padding rows, and the MLM bias's padding, at zero.
    table = params["bert"]["embeddings"]["word_embeddings"]["embedding"]
    assert table.shape == (512, 64)
    assert not np.any(np.asarray(table)[VOCAB_SIZE:])
    assert not np.any(np.asarray(params["predictions"]["output_bias"])[VOCAB_SIZE:])
    # Optimizer slots are sharded exactly like their parameters.
    adam = state.opt_state[1]
    mu_query = adam.mu["bert"]["encoder"]["layer_0"]["attention"]["query"]["kernel"]
    assert mu_query.sharding == layer["attention"]["query"]["kernel"].sharding
    # Each device holds only its shard of a sharded parameter.
    shard = layer["intermediate"]["kernel"].addressable_shards[0].data
    assert shard.size == layer["intermediate"]["kernel"].size // (fsdp * tensor)


def test_sharded_optimizer_state_matches_one_device(one_device_init, single_device_run):
    """ZeRO stage 1 on (4, 2, 1): the Adam slots are split over data x fsdp, the parameters
    stay as the rules put them (embed over fsdp only), and the numbers are one device's (from
    the one-device init, placed with the ZeRO shardings)."""
    config = _padded_config()
    schedule = optim.warmup_decay(1e-3, warmup_steps=2, total_steps=10)
    mesh = partitioning.make_mesh((4, 2, 1))
    trainer = ShardedTrainer(
        config, optim.bert_adamw(schedule), mesh, schedule=schedule, shard_optimizer_state=True
    )
    state, losses = _run(trainer, initial=one_device_init[1])
    ref_state, ref_losses = single_device_run
    np.testing.assert_allclose(losses, ref_losses, atol=1e-5, rtol=0)
    for got, want in zip(jax.tree.leaves(state.params), jax.tree.leaves(ref_state.params)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=0)
    kernel = state.params["bert"]["encoder"]["layer_0"]["intermediate"]["kernel"]
    mu = state.opt_state[1].mu["bert"]["encoder"]["layer_0"]["intermediate"]["kernel"]
    assert _spec(kernel)[0] == "fsdp"
    assert (
        _spec(mu)[0] == ("data", "fsdp")
        and trainer.abstract_state()
        .opt_state[1]
        .mu["bert"]["encoder"]["layer_0"]["intermediate"]["kernel"]
        .sharding
        == mu.sharding
    )
    assert mu.addressable_shards[0].data.size == mu.size // 8
    assert kernel.addressable_shards[0].data.size == kernel.size // 2
    assert partitioning.optimizer_state_rules((("embed", None), ("mlp", "tensor"))) == (
        ("embed", ("data",)),
        ("mlp", "tensor"),
    )


def test_prng_dropout_masks_are_the_same_on_any_mesh(one_device_init, single_device_run):
    """Masks drawn through jax.random with rbg keys ("prng") are also the same however the batch
    and the model are split (the default hash masks are checked on every mesh above). Both runs
    start from the one-device init (the inits on the meshes are held to it above)."""
    config = _padded_config(dropout_impl="prng")
    initial = one_device_init[1]
    _, want = _run(_trainer((1, 1, 1), config, devices=jax.devices()[:1]), 2, initial=initial)
    _, got = _run(_trainer((2, 2, 2), config), 2, initial=initial)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    _, hash_losses = single_device_run
    assert abs(hash_losses[0] - want[0]) > 1e-4, "the loss did not depend on the dropout masks"


def test_uneven_shard_is_refused_before_compiling():
    config = tiny_config(vocab_size=510)  # 510 does not divide over tensor=4
    with pytest.raises(
        ValueError, match=r"word_embeddings.*'vocab', size 510.*'tensor'.*vocab_pad_multiple=128"
    ):
        _trainer((1, 2, 4), config=config)


def test_padded_vocabulary_adds_no_collectives():
    """The losses read the padded logits (padding columns pushed to the lowest float) rather
    than a cut: a cut makes XLA re-split the logits between tensor shards."""
    import collections
    import re

    def collectives(trainer):
        batch = trainer.global_batch(random_batch(np.random.default_rng(0), 16, 32, 5, 510))
        rng = init_and_dropout_keys(0, "rbg")[1]
        with jax.set_mesh(trainer.mesh), nn.logical_axis_rules(trainer.rules):
            state = trainer.abstract_state()  # inside the mesh and rules too
            text = trainer._train_step.lower(state, batch, rng).compile().as_text()
        ops = "all-gather|all-reduce|reduce-scatter|all-to-all|collective-permute"
        return collections.Counter(re.findall(rf"= \S+ ({ops})\(", text))

    unpadded_config = tiny_config(vocab_size=512, num_hidden_layers=LAYERS)
    unpadded = collectives(_trainer((1, 2, 4), config=unpadded_config))
    # The program of the (1, 2, 4) run above (510 rows padded to 512, its batch shape and
    # dropout key type): the same cached trainer (`_mesh_trainer`), so it is compiled once.
    padded = collectives(_mesh_trainer((1, 2, 4)))
    assert sum(unpadded.values()) > 0 and padded == unpadded


def test_batch_not_divisible_names_the_setting():
    trainer = _mesh_trainer((8, 1, 1))
    batch = random_batch(np.random.default_rng(0), 6, 32, 5, trainer.config.vocab_size)
    with pytest.raises(ValueError, match="batch_size=6 .*data-parallel size 8"):
        trainer.global_batch(batch)


def test_mesh_shape_errors():
    assert partitioning.make_mesh((-1, 2, 1)).shape == {"data": 4, "fsdp": 2, "tensor": 1}
    with pytest.raises(ValueError, match="needs 16 devices, but 8"):
        partitioning.make_mesh((4, 4, 1))
    with pytest.raises(ValueError, match="not a multiple of 3"):
        partitioning.make_mesh((-1, 3, 1))


def test_compiler_options_only_for_tpu_steps():
    """`mesh.windowed_einsum=False` is an XLA:TPU option; other backends reject unknown options,
    so their steps get none (the TPU side is compiled in tests/test_topology.py)."""
    mesh = partitioning.make_mesh((8, 1, 1))
    assert partitioning.compiler_options(mesh, windowed_einsum=False) is None
    assert partitioning.compiler_options(mesh) is None
