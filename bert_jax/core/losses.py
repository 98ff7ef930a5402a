"""Pretraining losses and metrics, returned as (sum, weight) pairs.

Sums add up exactly across micro-batches, devices and hosts; the division happens once, where the
mean is needed (in the loss for the gradient, on the host for logged metrics).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

Array = jax.Array


def masked_lm(
    mlm_logits_BxPxV: Array, masked_lm_ids_BxP: Array, masked_lm_weights_BxP: Array
) -> dict[str, Array]:
    """Cross-entropy and accuracy over the weighted masked positions (padded slots weigh 0).

    The logits may have more columns than the vocabulary (`mlm_logits_padded`) when those hold
    the lowest float: they add nothing to the softmax and never win the argmax.
    """
    logits = mlm_logits_BxPxV.astype(jnp.float32)
    weights = masked_lm_weights_BxP.astype(jnp.float32)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    ids = masked_lm_ids_BxP.astype(jnp.int32)
    token_nll = -jnp.take_along_axis(log_probs, ids[..., None], axis=-1)[..., 0]
    correct = (jnp.argmax(logits, axis=-1) == ids).astype(jnp.float32)
    return {
        "mlm_loss_sum": jnp.sum(token_nll * weights),
        "mlm_correct_sum": jnp.sum(correct * weights),
        "mlm_weight": jnp.sum(weights),
    }


def next_sentence(
    nsp_logits_Bx2: Array, next_sentence_labels_B: Array, weights_B: Array | None = None
) -> dict[str, Array]:
    """Cross-entropy and accuracy of next-sentence prediction (label 1 = B is random), with the
    weighted counts of label 1 and of predicted 1 (the majority baseline and whether the model
    predicts one class: training/heldout_eval.py)."""
    logits = nsp_logits_Bx2.astype(jnp.float32)
    labels = next_sentence_labels_B.astype(jnp.int32)
    if weights_B is None:
        weights_B = jnp.ones(labels.shape, jnp.float32)
    weights = weights_B.astype(jnp.float32)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]
    predicted = jnp.argmax(logits, axis=-1)
    correct = (predicted == labels).astype(jnp.float32)
    return {
        "nsp_loss_sum": jnp.sum(nll * weights),
        "nsp_correct_sum": jnp.sum(correct * weights),
        "nsp_weight": jnp.sum(weights),
        "nsp_random_next_label_sum": jnp.sum((labels == 1).astype(jnp.float32) * weights),
        "nsp_random_next_predicted_sum": jnp.sum((predicted == 1).astype(jnp.float32) * weights),
    }


def no_next_sentence() -> dict[str, Array]:
    """The NSP sums of an objective without NSP: zero weight, so no NSP loss and no metrics."""
    zero = jnp.zeros((), jnp.float32)
    keys = ("nsp_loss_sum", "nsp_correct_sum", "nsp_weight")
    keys += ("nsp_random_next_label_sum", "nsp_random_next_predicted_sum")
    return dict.fromkeys(keys, zero)


def next_token_targets(input_ids_BxL: Array, input_mask_BxL: Array) -> tuple[Array, Array, Array]:
    """The left-to-right objective as masked-LM slots: every position predicts the next token.

    Returns (positions [B, L], ids [B, L], weights [B, L]): position t's target is token t + 1,
    weighted when that token is real; the last position has no target (weight 0). The same L
    slots as the input keep shapes even.
    """
    batch, length = input_ids_BxL.shape
    positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32)[None, :], (batch, length))
    pad = jnp.zeros((batch, 1), jnp.int32)
    ids = jnp.concatenate([input_ids_BxL[:, 1:].astype(jnp.int32), pad], axis=1)
    weights = jnp.concatenate([input_mask_BxL[:, 1:].astype(jnp.int32), pad], axis=1)
    return positions, ids, weights.astype(jnp.float32)


def pretraining_loss(sums: dict[str, Array]) -> Array:
    """The paper's objective: mean masked-LM loss + mean next-sentence loss (0 without NSP)."""
    mlm = sums["mlm_loss_sum"] / jnp.maximum(sums["mlm_weight"], 1e-5)
    nsp = sums["nsp_loss_sum"] / jnp.maximum(sums["nsp_weight"], 1e-5)
    return mlm + nsp


def summarize(sums: dict[str, float]) -> dict[str, float]:
    """Host-side means from accumulated sums (call once, after adding up steps or hosts).

    `mlm_perplexity` is exp of the mean masked-token loss (the paper's Table 6 "LM (ppl)"; for
    the left-to-right objective, of the mean next-token loss). Without NSP (weight 0: an
    objective without it) there are no nsp_* entries.
    """
    mlm_w = max(float(sums["mlm_weight"]), 1e-5)
    out = {
        "mlm_loss": float(sums["mlm_loss_sum"]) / mlm_w,
        "mlm_accuracy": float(sums["mlm_correct_sum"]) / mlm_w,
    }
    out["mlm_perplexity"] = math.exp(min(out["mlm_loss"], 700.0))
    out["loss"] = out["mlm_loss"]
    if float(sums.get("nsp_weight", 0.0)) > 0:
        nsp_w = float(sums["nsp_weight"])
        out["nsp_loss"] = float(sums["nsp_loss_sum"]) / nsp_w
        out["nsp_accuracy"] = float(sums["nsp_correct_sum"]) / nsp_w
        out["loss"] = out["mlm_loss"] + out["nsp_loss"]
    return out
