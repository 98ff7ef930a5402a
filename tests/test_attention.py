"""The fused Pallas attention (`attention.py`) against the einsum path, in Pallas' interpreter on
CPU: masks (padding, packed segments, general/causal), query subsets, block sizes, dropout off and
on (the same elements dropped), gradients; the whole model with each; the fallback line."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.core import attention
from bert_jax.core.dropout import hash_key_words
from bert_jax.core.model import BertConfig, BertModel, attention_mask
from tests.helpers import random_params, tiny_config

TOL = 2e-6  # float32, different summation order


def _qkv(rng, batch, queries, keys, heads=2, head_dim=8):
    def normal(*shape):
        return jnp.asarray(rng.normal(size=shape), jnp.float32)

    return (
        normal(batch, queries, heads, head_dim),
        normal(batch, keys, heads, head_dim),
        normal(batch, keys, heads, head_dim),
    )


def _masks(rng, batch, queries, keys):
    """Name -> (boolean mask, query positions or None) of every kind the model makes, and more."""
    lengths = rng.integers(keys // 2, keys + 1, size=batch)
    input_mask = np.arange(keys)[None, :] < lengths[:, None]
    segments = np.cumsum(rng.random((batch, keys)) < 0.15, axis=1).astype(np.int32)
    positions = np.sort(rng.choice(keys, size=(batch, queries), replace=True), axis=1)
    padding, packed, packed_query_subset, causal = _model_masks(
        input_mask, segments, positions.astype(np.int32)
    )
    return {
        "padding": padding,
        "packed": packed,
        "packed_query_subset": packed_query_subset,
        "causal": causal,
        "per_head": jnp.asarray(rng.random((batch, 2, queries, keys)) < 0.7),
        "none": None,
    }


@jax.jit  # one program per shape (op by op, each operation compiles alone)
def _model_masks(input_mask, segments, positions):
    keys = input_mask.shape[1]
    causal = jnp.tril(jnp.ones((keys, keys), bool))[None, None]
    return (
        attention_mask(input_mask),
        attention_mask(input_mask, segments),
        attention_mask(input_mask, segments, positions),
        jnp.logical_and(causal, attention_mask(input_mask)),
    )


def _loss_and_grads(fn, query, key, value, weights):
    def loss(q, k, v):
        out = fn(q, k, v)
        return jnp.sum(out * weights), out

    return jax.jit(jax.value_and_grad(loss, (0, 1, 2), has_aux=True))(query, key, value)


def _loss_and_grads_of_mask(fn):
    """`fn(q, k, v, mask)`'s output and the gradients of sum(output * weights), compiled once
    for every mask of a shape (each compile of the interpreted kernel costs seconds)."""

    def loss(q, k, v, mask, weights):
        out = fn(q, k, v, mask)
        return jnp.sum(out * weights), out

    return jax.jit(jax.value_and_grad(loss, (0, 1, 2), has_aux=True))


# (queries, keys, block_q, block_k, dropout rate): two blocks each way, the causal mask among
# them; 7 gathered queries of 40 positions, both padded to their blocks. `make test` runs each
# shape once, dropout on in one and off in the other; `make test-slow` the other two
# (tests/conftest.py names them).
KERNEL_CASES = [
    (24, 24, 16, 16, 0.1),
    (7, 40, 16, 32, 0.0),
    (24, 24, 16, 16, 0.0),
    (7, 40, 16, 32, 0.1),
]


@pytest.mark.parametrize(("queries", "keys", "block_q", "block_k", "rate"), KERNEL_CASES)
def test_kernel_equals_einsum_path(queries, keys, block_q, block_k, rate):
    """Outputs and gradients (the Pallas backward kernels) for every kind of mask."""
    rng = np.random.default_rng(queries + keys)
    query, key, value = _qkv(rng, 2, queries, keys)
    weights = jnp.asarray(rng.normal(size=query.shape), jnp.float32)
    words = hash_key_words(jax.random.key(5))

    # The masks are arguments: those of one shape (padding, packed and causal at 24 x 24) share
    # a program.
    @_loss_and_grads_of_mask
    def fused(q, k, v, mask):
        return attention.flash_attention(
            q, k, v, mask, dropout_rate=rate, dropout_words=words, block_q=block_q,
            block_k=block_k, interpret=True,
        )  # fmt: skip

    @_loss_and_grads_of_mask
    def einsum(q, k, v, mask):
        return attention.reference_attention(q, k, v, mask, words, rate)

    for name, mask in _masks(rng, 2, queries, keys).items():
        if mask is not None and mask.shape[2] not in (1, queries):
            continue  # a full-length mask and a query subset do not go together
        if name == "causal" and queries != keys:
            continue
        (_, got), got_grads = fused(query, key, value, mask, weights)
        (_, want), want_grads = einsum(query, key, value, mask, weights)
        np.testing.assert_allclose(got, want, atol=TOL, rtol=0, err_msg=name)
        for g, w, what in zip(got_grads, want_grads, "qkv", strict=True):
            np.testing.assert_allclose(g, w, atol=TOL, rtol=0, err_msg=f"{name} d{what}")


def test_dropout_drops_the_rate_and_depends_on_the_key():
    rng = np.random.default_rng(1)
    query, key, value = _qkv(rng, 1, 16, 16)
    value = jnp.ones_like(value)  # each output is then the kept share of its probabilities

    @jax.jit  # one program for both keys (op by op, each operation compiles alone)
    def run(words):
        return attention.flash_attention(
            query, key, value, dropout_rate=0.5, dropout_words=words, interpret=True
        )

    a, b = run(hash_key_words(jax.random.key(0))), run(hash_key_words(jax.random.key(1)))
    assert not np.allclose(a, b)
    np.testing.assert_allclose(float(a.mean()), 1.0, atol=0.15)


def test_reference_backward_equals_kernels(monkeypatch):
    """BERT_JAX_ATTENTION_BACKWARD=reference (the einsum form's vjp) gives the same gradients."""
    rng = np.random.default_rng(2)
    query, key, value = _qkv(rng, 2, 16, 32)
    mask = _masks(rng, 2, 16, 32)["packed_query_subset"]
    words = hash_key_words(jax.random.key(9))
    weights = jnp.asarray(rng.normal(size=query.shape), jnp.float32)

    def fused(q, k, v):
        return attention.flash_attention(
            q, k, v, mask, dropout_rate=0.1, dropout_words=words, interpret=True
        )

    _, kernels = _loss_and_grads(fused, query, key, value, weights)
    monkeypatch.setattr(attention, "backward", "reference")
    _, reference = _loss_and_grads(fused, query, key, value, weights)
    for g, w in zip(kernels, reference, strict=True):
        np.testing.assert_allclose(g, w, atol=TOL, rtol=0)


def _model_outputs_and_grads(config, batch, rngs):
    model = BertModel(config, add_pooler=False)
    params = model.init(jax.random.key(0), **batch)

    def loss(params):
        out = model.apply(params, **batch, deterministic=False, rngs=rngs)["sequence_output"]
        return jnp.sum(out * jnp.sin(jnp.arange(out.size).reshape(out.shape))), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    return out, grads


def test_model_pallas_equals_xla_with_dropout(monkeypatch):
    """The whole encoder, packed rows, the last layer at gathered positions: the fused layers
    draw the einsum layers' dropout keys, so outputs and parameter gradients agree."""
    monkeypatch.setattr(attention, "force_interpret", True)
    rng = np.random.default_rng(3)
    batch_size, seq_len = 2, 32
    batch = {
        "input_ids": jnp.asarray(rng.integers(5, 500, size=(batch_size, seq_len)), jnp.int32),
        "input_mask": jnp.asarray(np.arange(seq_len)[None, :] < np.array([[32], [27]])),
        "segment_ids": jnp.zeros((batch_size, seq_len), jnp.int32),
        "packed_segment_ids": jnp.asarray(np.repeat([[0, 1], [0, 1]], [12, 20], axis=1)),
        "output_positions": jnp.asarray([[1, 5, 20], [3, 13, 25]], jnp.int32),
    }
    rngs = {"dropout": jax.random.key(11)}
    base = tiny_config(num_attention_heads=2, attention_probs_dropout_prob=0.2)
    out_x, grads_x = _model_outputs_and_grads(base.replace(attention_impl="xla"), batch, rngs)
    out_p, grads_p = _model_outputs_and_grads(base.replace(attention_impl="pallas"), batch, rngs)
    np.testing.assert_allclose(out_p, out_x, atol=1e-5, rtol=0)
    diffs = jax.tree.map(
        lambda a, b: float(jnp.max(jnp.abs(a - b)) / (1 + jnp.max(jnp.abs(b)))), grads_p, grads_x
    )
    assert max(jax.tree.leaves(diffs)) < 1e-5, diffs


def test_cpu_falls_back_to_einsum_with_one_line(monkeypatch, caplog):
    monkeypatch.setattr(attention, "_fallback_logged", False)
    config = tiny_config(num_hidden_layers=2, attention_impl="pallas")
    ids = jnp.ones((1, 8), jnp.int32)
    model = BertModel(config, add_pooler=False)
    # Compiled (op by op, each operation compiles alone); each call its own trace, as each
    # eager call was, so the fallback is met three times (the init's trace too) and said once.
    with caplog.at_level(logging.WARNING, logger="bert_jax"):
        params = random_params(model, ids, ids, ids * 0)  # init traced, not compiled
        out = jax.jit(lambda p: model.apply(p, ids, ids, ids * 0))(params)["sequence_output"]
        jax.jit(lambda p: model.apply(p, ids, ids, ids * 0))(params)
    lines = [r.getMessage() for r in caplog.records if "attention_impl='pallas'" in r.getMessage()]
    assert len(lines) == 1 and "einsum" in lines[0], lines
    reference = BertModel(config.replace(attention_impl="xla"), add_pooler=False)
    want = jax.jit(lambda p: reference.apply(p, ids, ids, ids * 0))(params)["sequence_output"]
    np.testing.assert_array_equal(out, want)


def test_attention_impl_is_validated():
    assert BertConfig(attention_impl="pallas").attention_impl == "pallas"
    with pytest.raises(Exception, match="attention_impl"):
        BertConfig(attention_impl="flash")


@pytest.mark.skipif(not os.path.exists("/dev/nvidiactl"), reason="needs a GPU: the compiled kernel")
def test_compiled_kernel_on_gpu_equals_einsum_path():
    """The compiled (Triton) kernel, in a child process: this suite pins JAX to CPU."""
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    result = subprocess.run(
        [sys.executable, "-m", "tests.pallas_gpu_check"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_pallas_refuses_prng_dropout(monkeypatch):
    """The kernel draws hash masks; with dropout_impl="prng" it would drop other elements."""
    monkeypatch.setattr(attention, "force_interpret", True)
    config = tiny_config(num_hidden_layers=1, attention_impl="pallas", dropout_impl="prng")
    ids = jnp.ones((1, 8), jnp.int32)
    model = BertModel(config, add_pooler=False)
    params = random_params(model, ids, ids, ids * 0)  # the init is not under test
    # Traced under jit: eagerly, the layers before the refusal run op by op, each compiled alone.
    apply = jax.jit(
        lambda p: model.apply(
            p, ids, ids, ids * 0, deterministic=False, rngs={"dropout": jax.random.key(1)}
        )
    )
    with pytest.raises(Exception, match="dropout_impl='hash'"):
        apply(params)
