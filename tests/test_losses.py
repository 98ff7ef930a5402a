"""Losses: sums and weights agree with a direct NumPy/SciPy computation."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from scipy.special import log_softmax

from bert_jax.core import losses


def test_masked_lm_sums_ignore_padded_slots():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 5, 11)).astype(np.float32)
    ids = rng.integers(0, 11, size=(3, 5))
    weights = (rng.random((3, 5)) > 0.3).astype(np.float32)
    out = losses.masked_lm(jnp.asarray(logits), jnp.asarray(ids), jnp.asarray(weights))
    nll = -np.take_along_axis(log_softmax(logits, -1), ids[..., None], -1)[..., 0]
    np.testing.assert_allclose(out["mlm_loss_sum"], (nll * weights).sum(), rtol=1e-5)
    np.testing.assert_allclose(out["mlm_weight"], weights.sum())
    correct = (logits.argmax(-1) == ids) * weights
    np.testing.assert_allclose(out["mlm_correct_sum"], correct.sum())


def test_next_sentence_and_total_loss():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(6, 2)).astype(np.float32)
    labels = rng.integers(0, 2, size=6)
    out = losses.next_sentence(jnp.asarray(logits), jnp.asarray(labels))
    nll = -log_softmax(logits, -1)[np.arange(6), labels]
    np.testing.assert_allclose(out["nsp_loss_sum"], nll.sum(), rtol=1e-5)
    assert float(out["nsp_weight"]) == 6.0
    np.testing.assert_allclose(out["nsp_correct_sum"], (logits.argmax(-1) == labels).sum())

    mlm = {"mlm_loss_sum": 6.0, "mlm_weight": 3.0, "mlm_correct_sum": 1.0}
    sums = {**mlm, **{k: float(v) for k, v in out.items()}}
    total = float(losses.pretraining_loss({k: jnp.asarray(v) for k, v in sums.items()}))
    np.testing.assert_allclose(total, 2.0 + nll.mean(), rtol=1e-5)
    summary = losses.summarize(sums)
    np.testing.assert_allclose(summary["loss"], total, rtol=1e-5)
    np.testing.assert_allclose(summary["mlm_accuracy"], 1 / 3)


def test_sums_add_up_across_micro_batches():
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(4, 3, 7)).astype(np.float32)
    ids = rng.integers(0, 7, size=(4, 3))
    weights = (rng.random((4, 3)) > 0.5).astype(np.float32)
    whole = losses.masked_lm(logits, ids, weights)
    halves = [losses.masked_lm(logits[s], ids[s], weights[s]) for s in (slice(0, 2), slice(2, 4))]
    for key in whole:
        np.testing.assert_allclose(whole[key], halves[0][key] + halves[1][key], rtol=1e-5)
