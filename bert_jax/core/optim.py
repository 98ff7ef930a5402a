"""Optimizers and learning-rate schedules of BERT pretraining.

`bert_adamw` is the original code's optimizer: Adam (b1 0.9, b2 0.999, eps 1e-6) with decoupled
weight decay 0.01 that skips LayerNorm parameters and biases, after clipping the global gradient
norm to 1.0. The original `AdamWeightDecayOptimizer` applies no bias correction;
`bias_correction=False` reproduces that, the default follows the paper's "Adam". `lamb` is LAMB
for large batches; ModernBERT's StableAdamW is in stable_adamw.py.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bert_jax.core.stable_adamw import stable_adamw
from bert_jax.runtime.errors import UserError

Schedule = Callable[[jax.Array], jax.Array]


# The shapes of the learning rate's decay after the warmup (config `optimizer.decay`; the config
# checks refuse others up front): "linear", the paper's (google-research/bert's polynomial decay of
# power 1), "cosine" (half a cosine period from the peak down to the end rate), or "wsd" (warmup-
# stable-decay, ModernBERT's trapezoid: the peak held, then a 1-sqrt decay over the last
# `decay_fraction` of the steps).
DECAYS = ("linear", "cosine", "wsd")
DEFAULT_DECAY = "linear"


def warmup_decay(
    peak_lr: float,
    warmup_steps: int,
    total_steps: int,
    end_lr: float = 0.0,
    *,
    decay: str = DEFAULT_DECAY,
    from_warmup_end: bool = False,
    decay_fraction: float = 0.0,
) -> Schedule:
    """Linear warmup from 0 to `peak_lr`, then a `decay`-shaped decay to `end_lr` at `total_steps`.

    What is left of the decay at a step is `1 - step / total` by default: measured from step 0, as
    google-research/bert's polynomial_decay does (the curve is continuous only when the warmup is
    short relative to the run); with `from_warmup_end`, `(total - step) / (total - warmup)`, as
    transformers' `get_linear_schedule_with_warmup` (Hugging Face's fine-tuning recipe). The rate
    is `end + (peak - end) * left` for "linear", `end + (peak - end) * (1 - cos(pi * left)) / 2`
    for "cosine"; during the warmup, `peak * step / warmup`.

    "wsd" (ModernBERT's trapezoid) holds `peak_lr` after the warmup until the last
    `decay_fraction` of `total_steps`, then decays as `end + (peak - end) * (1 - sqrt(p))`, p the
    share of the decay done (0 at its first step, 1 at `total_steps`). The 1-sqrt shape is the
    one ModernBERT trained with: Hägele et al. (2024) found it beat a linear cool-down of the
    same length, and it keeps the rate high longer before the drop. The decay never starts
    inside the warmup; `decay_fraction` 0 holds the peak to the end.
    """
    if total_steps <= 0:
        raise UserError(f"total_steps must be positive, got {total_steps}")
    if decay not in DECAYS:
        raise UserError(f"optimizer.decay={decay!r} is not one of {', '.join(map(repr, DECAYS))}")

    if decay == "wsd":
        return _warmup_stable_decay(peak_lr, warmup_steps, total_steps, end_lr, decay_fraction)

    def schedule(step: jax.Array) -> jax.Array:
        step = jnp.asarray(step, jnp.float32)
        if from_warmup_end:
            left = jnp.clip((total_steps - step) / max(1, total_steps - warmup_steps), 0.0, 1.0)
            warm = peak_lr * (step / max(1, warmup_steps))
        else:
            left = 1.0 - jnp.clip(step / total_steps, 0.0, 1.0)
            warm = peak_lr * step / max(1, warmup_steps)
        if decay == "cosine":
            left = 0.5 * (1.0 - jnp.cos(jnp.pi * left))
        decayed = end_lr + (peak_lr - end_lr) * left
        if warmup_steps <= 0:
            return decayed
        return jnp.where(step < warmup_steps, warm, decayed)

    return schedule


def _warmup_stable_decay(
    peak_lr: float, warmup_steps: int, total_steps: int, end_lr: float, decay_fraction: float
) -> Schedule:
    """warmup_decay's "wsd": warmup, the peak held, a 1-sqrt decay over the last steps."""
    if not 0.0 <= decay_fraction <= 1.0:
        raise UserError(f"optimizer.decay_fraction={decay_fraction} must be in [0, 1]")
    decay_start = max(float(warmup_steps), total_steps * (1.0 - decay_fraction))
    decay_steps = total_steps - decay_start

    def schedule(step: jax.Array) -> jax.Array:
        step = jnp.asarray(step, jnp.float32)
        done = jnp.clip((step - decay_start) / max(decay_steps, 1e-9), 0.0, 1.0)
        stable = end_lr + (peak_lr - end_lr) * (1.0 - jnp.sqrt(done))
        if decay_steps <= 0:
            stable = jnp.full_like(step, peak_lr)
        if warmup_steps <= 0:
            return stable
        return jnp.where(step < warmup_steps, peak_lr * step / warmup_steps, stable)

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


_ADAM_STATES = (optax.ScaleByAdamState, ScaleByAdamNoBiasCorrectionState)


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


# Adam's epsilon in google-research/bert's AdamWeightDecayOptimizer (and the paper's pretraining).
BERT_EPSILON = 1e-6


def bert_adamw(
    schedule: Schedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = BERT_EPSILON,
    weight_decay: float = 0.01,
    clip_norm: float | None = 1.0,
    bias_correction: bool = True,
) -> optax.GradientTransformation:
    """Clip -> Adam -> decoupled weight decay (masked) -> scale by -lr, one pass per parameter.

    The math and the state are those of the optax chain `bert_adamw_chain` (same NamedTuples,
    so checkpoints are interchangeable). The update computes each parameter's clipped gradient,
    both moments and its update in one elementwise expression, which XLA fuses into fewer passes
    over memory than the chain's transform-by-transform trees (docs/performance.md has the
    measured figures). `update` takes the gradients' `grad_norm` (`global_norm`) where the
    caller has it, as `trainer.update` does, so the clipping computes it no second time.
    """
    chain = bert_adamw_chain(schedule, b1, b2, eps, weight_decay, clip_norm, bias_correction)

    def update(updates, state, params=None, *, grad_norm=None):
        if weight_decay and params is None:
            raise ValueError("bert_adamw with weight decay needs the parameters in update()")
        keep = norm = None
        if clip_norm:
            norm = global_norm(updates) if grad_norm is None else grad_norm
            keep = jnp.squeeze(norm < clip_norm)
        parts, moments, count, lr = fused_parts(state, schedule, bias_correction)
        corrections = None
        if bias_correction:
            corrections = (1 - b1**count, 1 - b2**count)
        decays = decay_mask(updates) if weight_decay else jax.tree.map(lambda _: False, updates)
        # Without weight decay the parameters are never read; the gradients stand in for them.
        params = updates if params is None else params
        settings = dict(b1=b1, b2=b2, eps=eps, clip_norm=clip_norm)

        def one(g, m, v, p, decay):
            return _bert_adamw_leaf(
                g, m, v, p, keep, norm, corrections, lr,
                weight_decay=weight_decay if decay else 0.0, **settings,
            )  # fmt: skip

        steps, mu, nu = map_leaves(one, updates, moments.mu, moments.nu, params, decays)
        moments = moments._replace(mu=mu, nu=nu)
        parts[adam_index(parts)] = moments._replace(count=count) if bias_correction else moments
        return steps, tuple(parts)

    return optax.GradientTransformationExtraArgs(chain.init, update)


def global_norm(tree: Any) -> jax.Array:
    """`optax.tree.norm(tree)` (the L2 norm over every leaf), the same sum in the same order,
    with each leaf's sum of squares a jitted function: a step's leaves of one shape share one
    trace instead of each tracing its own ops."""
    sums = [_sum_of_squares(leaf) for leaf in jax.tree.leaves(tree)]
    return jnp.array(jnp.sqrt(functools.reduce(operator.add, sums, 0)))


@functools.partial(jax.jit, inline=True)
def _sum_of_squares(leaf: jax.Array) -> jax.Array:
    return jnp.sum(jnp.square(leaf.real) + jnp.square(leaf.imag))


def adam_index(parts: list) -> int:
    (adam,) = [i for i, part in enumerate(parts) if isinstance(part, _ADAM_STATES)]
    return adam


def fused_parts(state: tuple, schedule: Schedule, bias_correction: bool) -> tuple:
    """A one-pass update's view of its chain's state: the parts (a list, the schedule's count
    advanced), Adam's moments, Adam's next count and the step's learning rate."""
    parts = list(state)  # the chain's states, in order
    moments = parts[adam_index(parts)]
    lr = schedule  # a constant learning rate is a scale with no state
    for i, part in enumerate(parts):
        if isinstance(part, optax.ScaleByScheduleState):
            lr = schedule(part.count)
            parts[i] = part._replace(count=optax.safe_increment(part.count))
    count = optax.safe_increment(moments.count) if bias_correction else None
    return parts, moments, count, lr


def map_leaves(one: Callable, updates: Any, *trees: Any) -> tuple:
    """`one` over the leaves of `updates` and `trees`; its tuple of results as a tuple of trees
    shaped as `updates`."""
    treedef = jax.tree.structure(updates)
    out = jax.tree.map(one, updates, *trees)
    leaves = treedef.flatten_up_to(out)
    return tuple(treedef.unflatten([leaf[i] for leaf in leaves]) for i in range(len(leaves[0])))


@functools.partial(
    jax.jit, inline=True, static_argnames=("b1", "b2", "eps", "clip_norm", "weight_decay")
)
def _bert_adamw_leaf(
    g, m, v, p, keep, norm, corrections, lr, *, b1, b2, eps, clip_norm, weight_decay
):
    """One parameter's `bert_adamw` update: (step, m, v). Jitted, its settings static: the
    parameters of one shape share a trace."""
    if clip_norm:
        g = jax.lax.select(keep, g, (g / norm.astype(g.dtype)) * clip_norm)
    m = (1 - b1) * g + b1 * m
    v = (1 - b2) * g**2 + b2 * v
    if corrections is not None:
        correction1, correction2 = corrections
        m_hat = m / correction1.astype(m.dtype)
        step = m_hat / (jnp.sqrt(v / correction2.astype(v.dtype)) + eps)
    else:
        step = m / (jnp.sqrt(v) + eps)
    if weight_decay:
        step = step + weight_decay * p
    return jnp.array(-lr, dtype=step.dtype) * step, m, v


def bert_adamw_chain(
    schedule: Schedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = BERT_EPSILON,
    weight_decay: float = 0.01,
    clip_norm: float | None = 1.0,
    bias_correction: bool = True,
) -> optax.GradientTransformation:
    """`bert_adamw` as a chain of optax transforms: the reference for its math and state."""
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


def lamb(
    schedule: Schedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-6,
    weight_decay: float = 0.01,
    clip_norm: float | None = 1.0,
) -> optax.GradientTransformation:
    """LAMB (You et al., 2019) for large batches: Adam direction, layer-wise trust ratio.

    Weight decay skips LayerNorm and biases, as in BERT AdamW.
    """
    chain = []
    if clip_norm:
        chain.append(optax.clip_by_global_norm(clip_norm))
    chain += [
        optax.scale_by_adam(b1=b1, b2=b2, eps=eps),
        optax.add_decayed_weights(weight_decay, mask=decay_mask),
        optax.scale_by_trust_ratio(),
        optax.scale_by_learning_rate(schedule),
    ]
    return optax.chain(*chain)


def phased_schedule(
    peak_lrs: Sequence[float],
    warmups: Sequence[int],
    phase_steps: Sequence[int],
    end_lr: float = 0.0,
    decay: str = DEFAULT_DECAY,
    decay_fraction: float = 0.0,
) -> Schedule:
    """Warmup + decay restarted at every phase boundary (NVIDIA's two-phase LAMB recipe)."""
    schedules = [
        warmup_decay(lr, warm, steps, end_lr, decay=decay, decay_fraction=decay_fraction)
        for lr, warm, steps in zip(peak_lrs, warmups, phase_steps)
    ]
    starts = np.cumsum([0, *phase_steps[:-1]]).tolist()

    def schedule(step: jax.Array) -> jax.Array:
        step = jnp.asarray(step, jnp.float32)
        value = schedules[0](step)
        for start, phase_schedule in zip(starts[1:], schedules[1:]):
            value = jnp.where(step >= start, phase_schedule(step - start), value)
        return value

    return schedule


# The values of `optimizer.name` and `optimizer.schedule` (config_checks refuses others up front).
OPTIMIZERS = ("adamw", "lamb", "stableadamw")
SCHEDULES = ("whole_run", "per_phase")


def from_config(
    opt_config, phase_steps: Sequence[int], phase_configs: Sequence[Any] = ()
) -> tuple[optax.GradientTransformation, Schedule]:
    """The optimizer and schedule named by a config's `optimizer` section.

    `optimizer.schedule` is "whole_run" (one warmup, one decay over all phases, as the paper)
    or "per_phase" (each phase warms up and decays on its own; a phase config may set its own
    `learning_rate` / `warmup_steps`, where -1 or absent means the optimizer's);
    `optimizer.decay` the decay's shape (DECAYS; absent: the paper's linear one) and, for "wsd",
    `optimizer.decay_fraction` the share of the steps it decays over (absent: none);
    `optimizer.decouple_lr` the weight decay relative to the peak rate (absent: not).
    """
    total = int(sum(phase_steps))
    decay = str(opt_config.get("decay", DEFAULT_DECAY))
    decay_fraction = float(opt_config.get("decay_fraction", 0.0))
    peak_lr = opt_config.learning_rate
    if opt_config.schedule == "whole_run":
        schedule = warmup_decay(
            opt_config.learning_rate,
            opt_config.warmup_steps,
            total,
            opt_config.end_learning_rate,
            decay=decay,
            decay_fraction=decay_fraction,
        )
    elif opt_config.schedule == "per_phase":

        def own(phase, key, default):
            value = phase.get(key, -1) if phase is not None else -1
            return default if value is None or value < 0 else value

        phases = list(phase_configs) + [None] * (len(phase_steps) - len(phase_configs))
        peak_lrs = [own(p, "learning_rate", opt_config.learning_rate) for p in phases]
        peak_lr = max(peak_lrs)
        schedule = phased_schedule(
            peak_lrs,
            [int(own(p, "warmup_steps", opt_config.warmup_steps)) for p in phases],
            phase_steps,
            opt_config.end_learning_rate,
            decay,
            decay_fraction,
        )
    else:
        raise UserError(f"optimizer.schedule={opt_config.schedule!r} is not one of {SCHEDULES}")
    weight_decay = opt_config.weight_decay
    if opt_config.get("decouple_lr", False):
        # Each optimizer here adds weight_decay x p to the update that lr(t) then scales; optimi's
        # decouple_lr scales the decay by lr(t) / max_lr instead: the same with weight_decay /
        # max_lr (max_lr the schedule's highest peak, optimi's default: the rate it was built with).
        weight_decay = weight_decay / peak_lr if peak_lr > 0 else 0.0
    common = dict(
        b1=opt_config.b1,
        b2=opt_config.b2,
        eps=opt_config.eps,
        weight_decay=weight_decay,
        clip_norm=opt_config.clip_norm,
    )
    if opt_config.name == "adamw":
        tx = bert_adamw(schedule, bias_correction=opt_config.bias_correction, **common)
    elif opt_config.name == "lamb":
        tx = lamb(schedule, **common)
    elif opt_config.name == "stableadamw":
        tx = stable_adamw(schedule, mask=decay_mask, **common)
    else:
        raise UserError(f"optimizer.name={opt_config.name!r} is not one of {OPTIMIZERS}")
    return tx, schedule
