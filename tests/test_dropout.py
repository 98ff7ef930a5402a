"""Dropout masks: the counter-hash masks have the exact rate and look independent; "prng" is
Flax's nn.Dropout."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from bert_jax.core.dropout import Dropout, drop_threshold, hash_bits, hash_key_words
from bert_jax.core.model import BertConfig


def _apply(module: nn.Module, x, key, deterministic=False):
    return module.apply({}, x, deterministic, rngs={"dropout": key})


class _OursThenFlax(nn.Module):
    impl: str

    @nn.compact
    def __call__(self, x, deterministic):
        return Dropout(0.3, self.impl)(x, deterministic), Dropout(0.3, self.impl)(x, deterministic)


class _Flax(nn.Module):
    @nn.compact
    def __call__(self, x, deterministic):
        return nn.Dropout(0.3)(x, deterministic), nn.Dropout(0.3)(x, deterministic)


def test_prng_impl_is_flax_dropout():
    x = jnp.arange(1.0, 4097.0).reshape(4, 32, 32)
    key = jax.random.key(7)
    ours = _apply(_OursThenFlax("prng"), x, key)
    flax_ = _apply(_Flax(), x, key)
    for a, b in zip(ours, flax_, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.9])
def test_hash_dropout_has_the_rate_and_scales_the_kept_values(rate):
    x = jnp.ones((64, 128, 96), jnp.float32)
    y = np.asarray(Dropout(rate).apply({}, x, False, rngs={"dropout": jax.random.key(3)}))
    dropped = float(np.mean(y == 0.0))
    sigma = np.sqrt(rate * (1 - rate) / y.size)
    assert abs(dropped - rate) < 5 * sigma, (dropped, rate)
    np.testing.assert_allclose(y[y != 0.0], 1.0 / (1.0 - rate), rtol=1e-6)
    assert drop_threshold(rate) == round(rate * 2**32)


def test_hash_bits_are_uniform_and_uncorrelated():
    """Each bit is a fair coin, bytes are uniform (chi-square), and keep masks are uncorrelated
    with their neighbours along every axis, across keys and across consecutive steps' keys."""
    shape = (16, 12, 64, 64)  # [batch, heads, queries, keys]: 786k words
    key = jax.random.key(11)
    # One compiled program for the three keys (op by op, each operation compiles alone).
    bits_of = jax.jit(lambda key, shape: hash_bits(hash_key_words(key), shape), static_argnums=1)
    bits = np.asarray(bits_of(key, shape))
    n = bits.size
    bit_means = [np.mean((bits >> b) & 1) for b in range(32)]
    np.testing.assert_allclose(bit_means, 0.5, atol=5 * 0.5 / np.sqrt(n))
    byte_counts = np.bincount((bits & 0xFF).ravel(), minlength=256)
    assert stats.chisquare(byte_counts).pvalue > 1e-4

    def corr(a, b):
        return abs(np.corrcoef(a.ravel().astype(np.float64), b.ravel().astype(np.float64))[0, 1])

    bound = 5 / np.sqrt(n / 2)
    keep = bits >= 2**31
    for axis in range(len(shape)):
        a = np.take(keep, np.arange(shape[axis] - 1), axis=axis)
        b = np.take(keep, np.arange(1, shape[axis]), axis=axis)
        assert corr(a, b) < bound, f"neighbours along axis {axis} are correlated"
    for other in (jax.random.fold_in(key, 1), jax.random.key(12)):
        assert corr(keep, np.asarray(bits_of(other, shape)) >= 2**31) < bound
    # Neighbouring rows' words are not related by a shift or an xor of their columns.
    rows = bits.reshape(shape[0], -1)
    assert len(np.intersect1d(rows[0], rows[1])) < 10


def test_hash_masks_differ_by_site_and_key_and_repeat_for_the_same_key():
    x = jnp.ones((8, 16, 32))
    a1, b1 = _apply(_OursThenFlax("hash"), x, jax.random.key(0))
    a2, b2 = _apply(_OursThenFlax("hash"), x, jax.random.key(0))
    c1, _ = _apply(_OursThenFlax("hash"), x, jax.random.key(1))
    np.testing.assert_array_equal(a1, a2)
    np.testing.assert_array_equal(b1, b2)
    assert np.mean(np.asarray(a1) != np.asarray(b1)) > 0.1
    assert np.mean(np.asarray(a1) != np.asarray(c1)) > 0.1
    # Any key implementation seeds it (pretraining's dropout keys are rbg).
    r1, _ = _apply(_OursThenFlax("hash"), x, jax.random.key(0, impl="rbg"))
    assert np.mean(np.asarray(r1) != np.asarray(a1)) > 0.1


def test_gradient_is_the_scaled_mask():
    x = jnp.linspace(-1.0, 1.0, 4096).reshape(8, 512)
    key = jax.random.key(5)
    y = _apply(Dropout(0.25), x, key)
    grad = jax.jit(jax.grad(lambda v: jnp.sum(_apply(Dropout(0.25), v, key))))(x)
    np.testing.assert_allclose(grad, np.where(np.asarray(y) != 0, 1 / 0.75, 0.0), rtol=1e-6)


def test_edge_cases_and_bad_settings():
    x = jnp.ones((4, 8))
    key = jax.random.key(0)
    np.testing.assert_array_equal(_apply(Dropout(0.5), x, key, deterministic=True), x)
    np.testing.assert_array_equal(_apply(Dropout(0.0), x, key), x)
    np.testing.assert_array_equal(_apply(Dropout(1.0), x, key), np.zeros((4, 8)))
    assert hash_bits(hash_key_words(key), ()).shape == ()
    with pytest.raises(ValueError, match=r"rate 1.5 is not in \[0, 1\]"):
        _apply(Dropout(1.5), x, key)
    with pytest.raises(ValueError, match="'philox' is not one of"):
        _apply(Dropout(0.1, "philox"), x, key)
    with pytest.raises(ValueError, match="dropout_impl 'philox' is not one of"):
        BertConfig(dropout_impl="philox")
    # Counted in uint32 within a row of axis 0; a larger row is refused before anything is built.
    with pytest.raises(ValueError, match=r"shape \(1, 65536, 65536\).*dropout_impl='prng'"):
        hash_bits(hash_key_words(key), (1, 65536, 65536))


@pytest.mark.parametrize("impl", ["hash", "prng"])
def test_a_fine_tuning_models_masks_are_independent_across_sites_heads_and_steps(impl, monkeypatch):
    """Every dropout of `BertForSequenceClassification` as fine-tuning runs it (the embeddings,
    each layer's attention probabilities, attention output and FFN output, the classifier input:
    transformers' places) draws its own mask: the rate is kept at each site, and no two masks of a
    step, no two steps' masks of a site and no two heads' attention masks are correlated."""
    from bert_jax.core import dropout as dropout_module
    from bert_jax.core import shared_layers
    from bert_jax.finetune.heads.pooled import BertForSequenceClassification
    from tests.helpers import random_params, tiny_config

    masks = []
    hash_words = dropout_module.hash_bits
    bernoulli = jax.random.bernoulli

    # Recorded while the step is traced, and returned by its compiled program (run op by op, a
    # forward costs several times its compile).
    def recorded_hash(key_words, shape):
        words = hash_words(key_words, shape)
        masks.append(words >= drop_threshold(0.1))
        return words

    def recorded_bernoulli(key, p=0.5, shape=None):
        keep = bernoulli(key, p=p, shape=shape)
        masks.append(keep)
        return keep

    monkeypatch.setattr(dropout_module, "hash_bits", recorded_hash)
    monkeypatch.setattr(jax.random, "bernoulli", recorded_bernoulli)
    # Each layer traced as a module, so each records its masks: a shared layer trace records
    # them once, inside its own trace (test_model checks the shared layers draw these masks).
    monkeypatch.setattr(shared_layers, "can_share", lambda *args, **kwargs: False)
    config = tiny_config(dropout_impl=impl, attention_impl="xla")
    model = BertForSequenceClassification(config, 2, 0.1)
    ids = np.random.default_rng(0).integers(5, config.vocab_size, (4, 16)).astype(np.int32)
    inputs = (ids, np.ones_like(ids), np.zeros_like(ids))
    params = random_params(model, *inputs)["params"]

    @jax.jit
    def step_masks(key):
        masks.clear()
        model.apply({"params": params}, *inputs, deterministic=False, rngs={"dropout": key})
        return list(masks)

    steps = []
    for step in range(3):  # train.update's dropout key of each step
        key = jax.random.fold_in(jax.random.key(1), step)
        steps.append([np.asarray(mask) for mask in step_masks(key)])
    sites = steps[0]
    # Embeddings, 2 x (attention probabilities, attention output, FFN output), classifier.
    assert [m.ndim for m in sites] == [3, 4, 3, 3, 4, 3, 3, 2]

    def corr(a, b):
        return abs(np.corrcoef(a.ravel().astype(np.float64), b.ravel().astype(np.float64))[0, 1])

    for mask in sites:
        assert abs(np.mean(mask) - 0.9) < 5 * np.sqrt(0.09 / mask.size), np.mean(mask)
    pairs = [(a, b) for i, a in enumerate(sites) for b in sites[i + 1 :] if a.shape == b.shape]
    pairs += [(s[i], t[i]) for s, t in zip(steps, steps[1:]) for i in range(len(sites))]
    for mask in sites:
        if mask.ndim == 4:
            pairs += [(mask[:, h], mask[:, h + 1]) for h in range(mask.shape[1] - 1)]
    assert len(pairs) > 30
    for a, b in pairs:
        assert corr(a, b) < 5 / np.sqrt(a.size), (a.shape, corr(a, b))


@pytest.mark.parametrize("impl", ["hash", "prng"])
def test_hash_dropout_derives_each_layers_words_without_a_prng_call(impl):
    """A hash layer's words are its path and draw count mixed into the step key's words: a
    model's forward holds no threefry hash (Flax's make_rng and jax.random.bits would add two per
    dropout layer, each compiled on its own), while "prng" draws through JAX's PRNG; a module that
    drops twice in one call draws two masks."""
    from bert_jax.finetune.heads.pooled import BertForSequenceClassification
    from tests.helpers import random_params, tiny_config

    config = tiny_config(dropout_impl=impl, attention_impl="xla")
    model = BertForSequenceClassification(config, 2, 0.1)
    ids = np.full((2, 8), 5, np.int32)
    inputs = (ids, np.ones_like(ids), np.zeros_like(ids))
    params = random_params(model, *inputs)
    forward = jax.make_jaxpr(
        lambda key: model.apply(params, *inputs, deterministic=False, rngs={"dropout": key})
    )(jax.random.key(0))
    drawn = [name for name in ("random_fold_in", "random_bits") if name in str(forward)]
    assert drawn == ([] if impl == "hash" else ["random_fold_in", "random_bits"])

    class _Twice(nn.Module):
        @nn.compact
        def __call__(self, x):
            drop = Dropout(0.5, impl)
            return drop(x, False), drop(x, False)

    first, second = _Twice().apply({}, jnp.ones((4, 64)), rngs={"dropout": jax.random.key(0)})
    assert np.mean(np.asarray(first) != np.asarray(second)) > 0.2
