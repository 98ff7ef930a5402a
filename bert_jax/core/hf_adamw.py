"""`torch.optim.AdamW` as Hugging Face's `Trainer` runs it (fine-tuning's "adamw-hf" optimizer,
for step-for-step comparisons with `transformers`): its gradient clipping, bias-corrected Adam
with eps outside the square root, decoupled weight decay on the parameters `optim.decay_mask`
marks, and the [PAD] row of the token embeddings left untrained (`no_gradient_to_padding_row`,
what the loss reads the params through). `torch_adamw` runs it in one jitted
pass per parameter (as `optim.bert_adamw`); `torch_adamw_chain` is the same as optax transforms,
the reference for its math and state.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax

from bert_jax.core.optim import (
    Schedule,
    adam_index,
    decay_mask,
    fused_parts,
    global_norm,
    map_leaves,
)


def clip_by_global_norm_torch(max_norm: float) -> optax.GradientTransformation:
    """`torch.nn.utils.clip_grad_norm_`: every gradient times min(1, max_norm / (norm + 1e-6))."""

    def update(updates, state, params=None):
        del params
        norm = global_norm(updates)
        scale = jnp.minimum(1.0, max_norm / (norm + 1e-6))
        return jax.tree.map(lambda g: (g * scale).astype(g.dtype), updates), state

    return optax.GradientTransformation(lambda _: optax.EmptyState(), update)


# The token-embedding tables whose [PAD] row transformers never trains: BERT's word embeddings,
# ModernBERT's token embeddings (the tied decoder reads the same table).
TOKEN_EMBEDDING_TABLES = ("word_embeddings", "tok_embeddings")


def no_gradient_to_padding_row(params: Any, row: int) -> Any:
    """`params` as a loss reads them so that the token embeddings' `row` gets no gradient, as
    `torch.nn.Embedding(padding_idx=row)` gives it none: the same arrays forward, that row of
    their cotangent zeroed backward. The gradients, their norm and the clipping are then those of
    `transformers`' model."""

    def at(path, leaf):
        names = [getattr(key, "key", None) for key in path[-2:]]
        table = names[0] if names[-1:] == ["embedding"] and len(names) == 2 else None
        return _no_gradient_to_row(leaf, row) if table in TOKEN_EMBEDDING_TABLES else leaf

    return jax.tree_util.tree_map_with_path(at, params)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _no_gradient_to_row(table: jax.Array, row: int) -> jax.Array:
    return table


def _no_gradient_to_row_fwd(table, row):
    return table, None


def _no_gradient_to_row_bwd(row, _, cotangent):
    return (cotangent.at[row].set(0),)


_no_gradient_to_row.defvjp(_no_gradient_to_row_fwd, _no_gradient_to_row_bwd)


def torch_adamw(
    schedule: Schedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 0.01,
    clip_norm: float | None = 1.0,
) -> optax.GradientTransformation:
    """`torch.optim.AdamW` as Hugging Face's `Trainer` runs it: gradients clipped by
    `clip_grad_norm_`, bias-corrected Adam with eps 1e-8 outside the square root, decoupled weight
    decay (lr * weight_decay * p) on the parameters `decay_mask` marks (the Trainer's groups skip
    biases and LayerNorm weights alike). The [PAD] row's missing gradient is the loss's
    (`no_gradient_to_padding_row`), as transformers' embedding (`padding_idx`) gives it none.

    The math and the state are the optax chain `torch_adamw_chain`'s, in one pass per parameter
    (as `bert_adamw`): a jitted function per parameter, which the parameters of one shape share,
    so a step traces the update for a few shapes instead of every transform for every leaf.
    `update` takes the gradients' `grad_norm` (`optim.global_norm`) where the caller has it, as
    `trainer.update` does: the clipping then computes it no second time."""
    chain = torch_adamw_chain(schedule, b1, b2, eps, weight_decay, clip_norm)

    def update(updates, state, params=None, *, grad_norm=None):
        if weight_decay and params is None:
            raise ValueError("torch_adamw with weight decay needs the parameters in update()")
        scale = None
        if clip_norm:
            norm = global_norm(updates) if grad_norm is None else grad_norm
            scale = jnp.minimum(1.0, clip_norm / (norm + 1e-6))
        parts, moments, count, lr = fused_parts(state, schedule, bias_correction=True)
        corrections = (1 - b1**count, 1 - b2**count)
        decays = decay_mask(updates) if weight_decay else jax.tree.map(lambda _: False, updates)
        params = updates if params is None else params
        settings = dict(b1=b1, b2=b2, eps=eps)

        def one(g, m, v, p, decay):
            return _torch_adamw_leaf(
                g, m, v, p, scale, corrections, -1 * lr,
                weight_decay=weight_decay if decay else 0.0, **settings,
            )  # fmt: skip

        steps, mu, nu = map_leaves(one, updates, moments.mu, moments.nu, params, decays)
        parts[adam_index(parts)] = moments._replace(count=count, mu=mu, nu=nu)
        return steps, tuple(parts)

    return optax.GradientTransformationExtraArgs(chain.init, update)


@functools.partial(jax.jit, inline=True, static_argnames=("b1", "b2", "eps", "weight_decay"))
def _torch_adamw_leaf(g, m, v, p, scale, corrections, step_size, *, b1, b2, eps, weight_decay):
    """One parameter's `torch_adamw` update: (step, m, v), the chain's operations in its order."""
    if scale is not None:
        g = (g * scale).astype(g.dtype)
    m = (1 - b1) * g + b1 * m
    v = (1 - b2) * g**2 + b2 * v
    correction1, correction2 = corrections
    m_hat = m / correction1.astype(m.dtype)
    v_hat = v / correction2.astype(v.dtype)
    step = m_hat / (jnp.sqrt(v_hat + 0.0) + eps)
    if weight_decay:
        step = step + weight_decay * p
    return jnp.array(step_size, dtype=step.dtype) * step, m, v


def torch_adamw_chain(
    schedule: Schedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 0.01,
    clip_norm: float | None = 1.0,
) -> optax.GradientTransformation:
    """`torch_adamw` as a chain of optax transforms: the reference for its math and state."""
    chain = []
    if clip_norm:
        chain.append(clip_by_global_norm_torch(clip_norm))
    chain.append(optax.scale_by_adam(b1=b1, b2=b2, eps=eps))
    if weight_decay:
        chain.append(optax.add_decayed_weights(weight_decay, mask=decay_mask))
    chain.append(optax.scale_by_learning_rate(schedule))
    return optax.chain(*chain)
