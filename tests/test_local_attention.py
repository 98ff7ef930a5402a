"""Sliding-window attention in blocks (core/local_attention.py) against the masked full matrix.

With dropout off, outputs and gradients equal `attend` under `modernbert.sliding_window`'s mask
to float32 rounding at every position (padding that sees no key too), for lengths that are not
a multiple of the block, padding, packed rows of 2-3 instances and windows wider than some
instances; a ModernBERT model with banded sliding-window layers equals the same model on the
full path and transformers' model; dropout stays exact-rate in blocks, and the fused kernel
drops there what the einsums drop; the mesh shards the blocked path as it shards the full one.
"""

from __future__ import annotations

from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from bert_jax.core import local_attention, optim, partitioning, trainer
from bert_jax.core.attend import attend
from bert_jax.core.model import attention_mask
from bert_jax.core.modernbert import ModernBertForMaskedLM, sliding_window
from bert_jax.core.modernbert_config import ModernBertConfig
from tests.helpers import random_params
from tests.modernbert_fixtures import TINY as TINY_VALUES
from tests.modernbert_fixtures import hf_masked_lm, params_from_hf

SETTINGS = dict(impl="xla", dropout_rate=0.0, dropout_impl="hash", deterministic=True)


class InModule(nn.Module):
    """`attend` draws its dropout as a submodule: run `fn` inside a module."""

    fn: Callable

    @nn.compact
    def __call__(self, *args):
        return self.fn(*args)


def _rows(rng, length: int, instances: list[list[int]]):
    """input_mask and packed segment ids [B, length]: row b holds instances of those lengths
    (ids 1, 2, ...), then padding (id 0)."""
    mask = np.zeros((len(instances), length), np.int32)
    segments = np.zeros_like(mask)
    for row, lengths in enumerate(instances):
        start = 0
        for i, n in enumerate(lengths):
            mask[row, start : start + n] = 1
            segments[row, start : start + n] = i + 1
            start += n
    return jnp.asarray(mask), jnp.asarray(segments)


def _both(length, window, instances, packed, dtype="float32", seed=0):
    """(banded, full) functions of (q, k, v) and the random q, k, v [B, L, 2, 4]."""
    rng = np.random.default_rng(seed)
    input_mask, segments = _rows(rng, length, instances)
    segments = segments if packed else None
    qkv = [
        jnp.asarray(rng.normal(size=(len(instances), length, 2, 4)), jnp.float32) for _ in range(3)
    ]
    # Both masks in one compiled program (op by op, each operation compiles alone).
    full_mask, band = jax.jit(
        lambda mask, ids: (
            sliding_window(attention_mask(mask, ids), length, window),
            local_attention.band_mask(mask, ids, window),
        )
    )(input_mask, segments)
    settings = SETTINGS | {"dtype": dtype}

    def banded(q, k, v):
        return InModule(lambda *a: local_attention.attend_in_bands(*a, band, **settings)).apply(
            {}, q, k, v
        )

    def full(q, k, v):
        return InModule(lambda *a: attend(*a, full_mask, **settings)).apply({}, q, k, v)

    return banded, full, qkv, np.asarray(input_mask)


CASES = {
    # length, window, instances per row, packed
    "one_block_tail": (29, 6, [[29], [17]], False),  # 29 = 4 blocks of 6 + 5; a padded row
    "odd_window": (23, 5, [[23], [20]], False),
    "packed": (31, 6, [[10, 4, 9], [3, 20]], True),  # instances shorter than the window too
    "wide_window": (40, 10, [[12, 2, 20], [40]], True),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_outputs_and_gradients_equal_the_masked_full_matrix(name):
    length, window, instances, packed = CASES[name]
    banded, full, qkv, real = _both(length, window, instances, packed)
    out_banded, out_full = jax.jit(banded)(*qkv), jax.jit(full)(*qkv)
    assert out_banded.shape == out_full.shape
    # Every position, padding included (far padding sees no key: the row's mean value).
    assert np.abs(np.asarray(out_banded) - np.asarray(out_full)).max() <= 2e-6

    # A loss over every position, padding weighted too: gradients for q, k and v.
    weights = jnp.asarray(np.random.default_rng(1).normal(size=out_full.shape))
    assert not real.all()  # each case has padding

    def loss(fn):
        return jax.jit(jax.grad(lambda *a: jnp.sum(fn(*a) * weights), argnums=(0, 1, 2)))

    for g_banded, g_full in zip(loss(banded)(*qkv), loss(full)(*qkv)):
        assert np.abs(np.asarray(g_banded) - np.asarray(g_full)).max() <= 2e-6


def test_the_rule_bands_rows_of_four_windows_or_more():
    assert not local_attention.use_bands(8191, 2048)
    assert local_attention.use_bands(8192, 2048)
    assert local_attention.use_bands(8192, 128) and not local_attention.use_bands(128, 128)


@pytest.mark.parametrize("dropout_impl", ["hash", "prng"])
def test_dropout_in_blocks_keeps_its_rate(dropout_impl):
    """Dropout on the blocked probabilities: each kept probability scaled by 1 / (1 - rate),
    the outputs' mean unchanged in expectation (v = 1 everywhere: every output row sums its
    dropped-and-scaled probabilities)."""
    length, window, rate = 96, 8, 0.25
    input_mask, _ = _rows(None, length, [[length]] * 2)
    band = local_attention.band_mask(input_mask, None, window)
    query = jnp.zeros((2, length, 2, 4))  # uniform probabilities over the window
    value = jnp.ones((2, length, 2, 4))
    settings = dict(impl="xla", dropout_rate=rate, dropout_impl=dropout_impl, deterministic=False)

    banded = InModule(
        lambda *a: local_attention.attend_in_bands(*a, band, dtype="float32", **settings)
    )
    # Compiled: run op by op, the blocked program compiles each of its many operations alone.
    out = jax.jit(lambda q, v, key: banded.apply({}, q, q, v, rngs={"dropout": key}))(
        query, value, jax.random.key(0)
    )
    sums = np.asarray(out)[:, window:-window, :, 0]  # rows whose window lies inside the row
    # Each is (kept of window + 1) / (window + 1) / (1 - rate): mean 1 over many rows.
    assert abs(sums.mean() - 1.0) < 0.05
    assert np.all(sums < 1.0 / (1 - rate) + 1e-5)
    assert len(np.unique(np.round(sums, 5))) > 3  # elements dropped, not whole rows


def test_fused_kernel_in_blocks_drops_what_the_einsums_drop(monkeypatch):
    """attention_impl="pallas" (Pallas' interpreter here) on the blocks, with hash dropout on,
    gives the einsum path's blocked result: the same key, the same blocked coordinates."""
    from bert_jax.core import attention

    length, window = 26, 6
    input_mask, segments = _rows(None, length, [[9, 12], [20]])
    band = local_attention.band_mask(input_mask, segments, window)
    rng = np.random.default_rng(5)
    qkv = [jnp.asarray(rng.normal(size=(2, length, 2, 8)), jnp.float32) for _ in range(3)]
    settings = dict(dropout_rate=0.2, dropout_impl="hash", deterministic=False, dtype="float32")

    def run(impl):
        module = InModule(
            lambda *a: local_attention.attend_in_bands(*a, band, impl=impl, **settings)
        )
        apply = jax.jit(lambda key, *a: module.apply({}, *a, rngs={"dropout": key}))
        return np.asarray(apply(jax.random.key(1), *qkv))

    einsums = run("xla")
    settings["deterministic"] = True
    assert np.abs(run("xla") - einsums).max() > 0.1  # something was dropped
    settings["deterministic"] = False
    monkeypatch.setattr(attention, "force_interpret", True)
    assert np.abs(run("pallas") - einsums).max() <= 1e-5


TINY = ModernBertConfig(
    **TINY_VALUES,
    global_attn_every_n_layers=2,  # a global layer, then a sliding-window one
    local_attention=6,
    attention_impl="xla",
)


def _inputs(length, packed):
    rng = np.random.default_rng(2)
    input_mask, segments = _rows(rng, length, [[12, 5, 13], [length - 3]])
    positions = np.zeros((2, length), np.int32)
    for row in range(2):
        ids = np.asarray(segments[row])
        for s in np.unique(ids[ids > 0]):
            where = np.flatnonzero(ids == s)
            positions[row, where] = np.arange(len(where))
    ids = np.where(np.asarray(input_mask) == 1, rng.integers(5, 300, (2, length)), 3)
    inputs = {"input_ids": jnp.asarray(ids, jnp.int32), "input_mask": input_mask}
    if packed:
        inputs |= {"packed_segment_ids": segments, "position_ids": jnp.asarray(positions)}
    return inputs


def test_model_with_banded_layers_equals_the_full_path(monkeypatch):
    """ModernBertForMaskedLM at length 31 >= 4 x 6 (banded; rematerialized, so the band mask
    passes through nn.remat) against the same model forced onto the masked full matrix: logits
    at every position and the parameter gradients of a loss over all of them, padding included
    (packed rows' padding sees no key)."""
    config = TINY.replace(remat="full")
    inputs = _inputs(31, packed=True)
    assert local_attention.use_bands(31, config.local_attention)
    module = ModernBertForMaskedLM(config)
    params = random_params(module, **inputs)["params"]

    def loss(params):
        logits = module.apply({"params": params}, **inputs)["mlm_logits"]
        return jnp.sum(jnp.tanh(logits)), logits

    (_, banded_logits), banded_grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    monkeypatch.setattr(local_attention, "use_bands", lambda length, window: False)
    (_, full_logits), full_grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    assert np.abs(np.asarray(banded_logits) - np.asarray(full_logits)).max() <= 1e-5
    for a, b in zip(jax.tree.leaves(banded_grads), jax.tree.leaves(full_grads)):
        # float32 rounding of sums over the batch: relative to the gradient's scale
        scale = max(1.0, float(np.abs(np.asarray(b)).max()))
        assert np.abs(np.asarray(a) - np.asarray(b)).max() <= 1e-6 * scale


def test_banded_model_equals_transformers():
    """The banded model against transformers' ModernBertForMaskedLM (eager, full-matrix sliding
    window) at every real position of a padded row."""
    config = TINY
    length = 29
    model = hf_masked_lm(config, seed=0)
    params = params_from_hf(model, config)
    inputs = _inputs(length, packed=False)
    apply = jax.jit(ModernBertForMaskedLM(config).apply)
    ours = apply({"params": params}, **inputs)["mlm_logits"]
    with torch.no_grad():
        theirs = model(
            input_ids=torch.tensor(np.asarray(inputs["input_ids"])).long(),
            attention_mask=torch.tensor(np.asarray(inputs["input_mask"])),
        ).logits.numpy()
    real = np.asarray(inputs["input_mask"], bool)
    assert np.abs(np.asarray(ours) - theirs)[real].max() <= 1e-5


def test_sharded_training_step_with_banded_layers():
    """On the 8-device mesh (data 2, fsdp 2, tensor 2) the banded model's sharded train step
    gives the unsharded forward's loss, on packed rows."""
    config = TINY.replace(attention_impl="auto")
    length = 31
    inputs = {k: np.concatenate([np.asarray(v)] * 2) for k, v in _inputs(length, True).items()}
    rng = np.random.default_rng(4)
    batch = inputs | {
        "segment_ids": np.zeros((4, length), np.int32),
        "masked_lm_positions": np.tile(np.arange(length, dtype=np.int32), (4, 1)),
        "masked_lm_ids": rng.integers(5, 300, (4, length)).astype(np.int32),
        "masked_lm_weights": inputs["input_mask"].astype(np.float32),
        "next_sentence_labels": np.zeros((4,), np.int32),
    }
    schedule = optim.warmup_decay(1e-2, warmup_steps=0, total_steps=10)
    mesh = partitioning.make_mesh((2, 2, 2))
    sharded = trainer.ShardedTrainer(config, optim.bert_adamw(schedule), mesh, schedule=schedule)
    state = sharded.init(jax.random.key(0))
    sums = trainer.compute_sums(
        jax.device_get(nn.meta.unbox(state.params)),
        {k: jnp.asarray(v) for k, v in batch.items()},
        sharded.model,
        deterministic=True,
    )
    state, metrics = sharded.train_step(state, sharded.global_batch(batch), jax.random.key(1))
    metrics = jax.device_get(metrics)
    expected = float(sums["mlm_loss_sum"]) / float(sums["mlm_weight"])
    assert abs(float(metrics["mlm_loss_sum"]) / float(metrics["mlm_weight"]) - expected) <= 1e-5
