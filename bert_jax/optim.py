"""Optimizers and learning-rate schedules of BERT pretraining.

`bert_adamw` is the original code's optimizer: Adam (b1 0.9, b2 0.999, eps 1e-6) with decoupled
weight decay 0.01 that skips LayerNorm parameters and biases, after clipping the global gradient
norm to 1.0. The original `AdamWeightDecayOptimizer` applies no bias correction;
`bias_correction=False` reproduces that, the default follows the paper's "Adam".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

Schedule = Callable[[jax.Array], jax.Array]


def warmup_linear_decay(
    peak_lr: float, warmup_steps: int, total_steps: int, end_lr: float = 0.0
) -> Schedule:
    """The original schedule: linear warmup from 0, then linear decay measured from step 0.

    For step >= warmup: lr = end + (peak - end) * (1 - step / total); before: peak * step / warmup.
    (The decay starts from the full run, as google-research/bert's polynomial_decay does, so the
    curve is continuous only when warmup is short relative to total.)
    """
    if total_steps <= 0:
        raise ValueError(f"total_steps must be positive, got {total_steps}")

    def schedule(step: jax.Array) -> jax.Array:
        step = jnp.asarray(step, jnp.float32)
        frac = jnp.clip(step / total_steps, 0.0, 1.0)
        decayed = end_lr + (peak_lr - end_lr) * (1.0 - frac)
        if warmup_steps <= 0:
            return decayed
        warm = peak_lr * step / warmup_steps
        return jnp.where(step < warmup_steps, warm, decayed)

    return schedule


def decay_mask(params: Any) -> Any:
    """True for parameters that get weight decay: kernels and embeddings (not LayerNorm, biases)."""

    def decays(path, _leaf) -> bool:
        name = getattr(path[-1], "key", None)
        return name in ("kernel", "embedding")

    return jax.tree_util.tree_map_with_path(decays, params, is_leaf=_is_box)


def _is_box(x: Any) -> bool:
    # Logical-partitioning boxes (flax.linen.Partitioned) wrap leaves while shardings are derived.
    return hasattr(x, "unbox") and hasattr(x, "names")


class ScaleByAdamNoBiasCorrectionState(NamedTuple):
    mu: Any
    nu: Any


def scale_by_adam_no_bias_correction(b1: float, b2: float, eps: float):
    """m / (sqrt(v) + eps) without bias correction, as google-research/bert's optimizer."""

    def init(params):
        zeros = jax.tree.map(jnp.zeros_like, params)
        return ScaleByAdamNoBiasCorrectionState(mu=zeros, nu=jax.tree.map(jnp.zeros_like, params))

    def update(updates, state, params=None):
        del params
        mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, updates)
        nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * jnp.square(g), state.nu, updates)
        updates = jax.tree.map(lambda m, v: m / (jnp.sqrt(v) + eps), mu, nu)
        return updates, ScaleByAdamNoBiasCorrectionState(mu=mu, nu=nu)

    return optax.GradientTransformation(init, update)


def bert_adamw(
    schedule: Schedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-6,
    weight_decay: float = 0.01,
    clip_norm: float | None = 1.0,
    bias_correction: bool = True,
) -> optax.GradientTransformation:
    """Clip -> Adam -> decoupled weight decay (masked) -> scale by -lr."""
    chain = []
    if clip_norm:
        chain.append(optax.clip_by_global_norm(clip_norm))
    if bias_correction:
        chain.append(optax.scale_by_adam(b1=b1, b2=b2, eps=eps))
    else:
        chain.append(scale_by_adam_no_bias_correction(b1, b2, eps))
    if weight_decay:
        chain.append(optax.add_decayed_weights(weight_decay, mask=decay_mask))
    chain.append(optax.scale_by_learning_rate(schedule))
    return optax.chain(*chain)


def from_config(opt_config, total_steps: int) -> tuple[optax.GradientTransformation, Schedule]:
    """The optimizer and schedule named by a config's `optimizer` section."""
    schedule = warmup_linear_decay(
        opt_config.learning_rate, opt_config.warmup_steps, total_steps, opt_config.end_learning_rate
    )
    if opt_config.name != "adamw":
        raise ValueError(f"optimizer.name={opt_config.name!r} is not supported (use 'adamw')")
    tx = bert_adamw(
        schedule,
        b1=opt_config.b1,
        b2=opt_config.b2,
        eps=opt_config.eps,
        weight_decay=opt_config.weight_decay,
        clip_norm=opt_config.clip_norm,
        bias_correction=opt_config.bias_correction,
    )
    return tx, schedule
