"""StableAdamW (Wortsman et al., 2023), ModernBERT's optimizer, with optimi's semantics.

`optimi.StableAdamW` (torch-optimi, the implementation ModernBERT trained with) is AdamW whose
learning rate for each tensor is divided by max(1, RMS(g^2 / max(v_hat, eps^2))), its moments kept
bias-corrected. Here it is an optax transform (`scale_by_stable_adam`) in a chain with the usual
pieces: global-norm clipping if asked, the learning-rate schedule. tests/test_stable_adamw.py
holds it equal to optimi step for step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax


class ScaleByStableAdamState(NamedTuple):
    """The step and both moments, already bias-corrected: optimi keeps them so (its betas are
    debiased at each step), and so the state here holds the same numbers as its."""

    count: jax.Array
    mu: Any
    nu: Any


def _debiased_complement(beta: float, count: jax.Array) -> jax.Array:
    """1 - beta_hat, optimi's debiased beta at step `count` (1-based): (1 - beta) / (1 - beta^t).

    Written with expm1 because 1 - beta^t loses most of its digits in float32 at the first steps
    (beta 0.999, t 2: 0.001999 from two numbers near 1); optimi computes it in double.
    """
    t = count.astype(jnp.float32)
    return (1.0 - beta) / -jnp.expm1(t * jnp.log(jnp.float32(beta)))


def scale_by_stable_adam(
    b1: float = 0.9,
    b2: float = 0.99,
    eps: float = 1e-6,
    weight_decay: float = 0.0,
    mask: Any = None,
) -> optax.GradientTransformation:
    """StableAdamW's step before the learning rate (`optimi.StableAdamW`, kahan summation off).

    Each tensor's Adam direction m_hat / (sqrt(v_hat) + eps), plus `weight_decay` x the parameter
    where `mask` says (decoupled: the learning rate scales it too), is divided by
    max(1, RMS(g^2 / max(v_hat, eps^2))): the mean over all of the tensor's elements of its
    gradient squared against the second moment updated with it. That update clipping is Adafactor's
    (Shazeer and Stern, 2018): a tensor whose gradient jumps far above its running average takes
    a smaller step, in place of clipping the global gradient norm. The decay goes through the same
    division because optimi shrinks the parameter by the clipped rate.
    """
    decay = optax.add_decayed_weights(weight_decay, mask=mask) if weight_decay else None

    def init(params):
        return ScaleByStableAdamState(
            count=jnp.zeros([], jnp.int32),
            mu=jax.tree.map(jnp.zeros_like, params),
            nu=jax.tree.map(jnp.zeros_like, params),
        )

    def update(updates, state, params=None):
        if decay is not None and params is None:
            raise ValueError("scale_by_stable_adam with weight decay needs the parameters")
        count = optax.safe_increment(state.count)
        keep1, keep2 = _debiased_complement(b1, count), _debiased_complement(b2, count)

        def moments(g, m, v):
            m = m + keep1.astype(m.dtype) * (g - m)
            v = (1 - keep2).astype(v.dtype) * v + keep2.astype(v.dtype) * jnp.square(g)
            return m, v

        out = jax.tree.map(moments, updates, state.mu, state.nu)
        treedef = jax.tree.structure(updates)
        leaves = treedef.flatten_up_to(out)
        mu, nu = (treedef.unflatten([leaf[i] for leaf in leaves]) for i in range(2))
        steps = jax.tree.map(lambda m, v: m / (jnp.sqrt(v) + eps), mu, nu)
        if decay is not None:
            steps, _ = decay.update(steps, decay.init(params), params)

        def clipped(step, g, v):
            ratio = jnp.square(g.astype(jnp.float32)) / jnp.maximum(v.astype(jnp.float32), eps**2)
            rms = jnp.sqrt(jnp.mean(ratio))
            return step / jnp.maximum(1.0, rms).astype(step.dtype)

        steps = jax.tree.map(clipped, steps, updates, nu)
        return steps, ScaleByStableAdamState(count=count, mu=mu, nu=nu)

    return optax.GradientTransformation(init, update)


def stable_adamw(
    schedule: Callable[[jax.Array], jax.Array],
    b1: float = 0.9,
    b2: float = 0.98,
    eps: float = 1e-6,
    weight_decay: float = 1e-5,
    clip_norm: float | None = None,
    mask: Any = None,
) -> optax.GradientTransformation:
    """StableAdamW (Wortsman et al., 2023), ModernBERT's optimizer: clip (if asked) -> Adam
    with per-tensor update clipping and masked decoupled weight decay -> scale by -lr.

    ModernBERT clips no gradient norm (its update clipping takes that place): `clip_norm` None.
    Weight decay applies where `mask` says (a pytree of bools or a function of the parameters,
    as optax's; None: everywhere): optim.decay_mask skips LayerNorm parameters and biases, as
    ModernBERT's `filter_bias_norm_wd`.
    """
    chain = []
    if clip_norm:
        chain.append(optax.clip_by_global_norm(clip_norm))
    chain += [
        scale_by_stable_adam(b1, b2, eps, weight_decay, mask),
        optax.scale_by_learning_rate(schedule),
    ]
    return optax.chain(*chain)
