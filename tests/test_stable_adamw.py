"""StableAdamW (`optimizer.name=stableadamw`) step for step against `optimi.StableAdamW`."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optimi
import pytest
import torch

from bert_jax.core import optim
from bert_jax.training import config_lib

# Several ranks, decayed (kernels, embeddings) and not (biases, LayerNorm scales).
SHAPES = {
    "embeddings": {"embedding": (11, 4)},
    "layer": {"kernel": (4, 6), "bias": (6,)},
    "attention": {"kernel": (4, 2, 3)},
    "norm": {"scale": (6,)},
}
STEPS = 20
# Steps whose gradient jumps (x30) above the running second moment: there the update clipping
# engages; elsewhere the gradients halve at each step, so g^2 stays under v_hat and from the
# third step it does not (the first step's RMS is 1 exactly: v_hat is g^2).
JUMPS = (6, 13)


def _gradients(rng: np.random.Generator, params: dict) -> list[dict]:
    scales = [30.0 if step in JUMPS else 0.5**step for step in range(STEPS)]
    return [
        jax.tree.map(lambda p, s=s: (s * rng.standard_normal(p.shape)).astype(np.float32), params)
        for s in scales
    ]


def _optimizer_config(decouple_lr: bool, clip_norm: float):
    optimizer = config_lib.pretraining_config("tiny").optimizer
    optimizer.name = "stableadamw"
    optimizer.learning_rate, optimizer.warmup_steps = 0.05, 4
    optimizer.decay, optimizer.decay_fraction = "wsd", 0.5
    optimizer.b1, optimizer.b2, optimizer.eps = 0.9, 0.98, 1e-6
    # Large enough to show in 20 steps (the decay is checked, not lost in rounding); decoupled
    # from the rate, under the 1e-3 optimi warns about.
    optimizer.weight_decay = 0.2 if not decouple_lr else 5e-4
    optimizer.decouple_lr, optimizer.clip_norm = decouple_lr, clip_norm
    return optimizer


def _torch_clip(grads: list[np.ndarray], clip_norm: float) -> list[np.ndarray]:
    """optax.clip_by_global_norm on NumPy arrays: g x clip / norm where the norm exceeds it."""
    if not clip_norm:
        return grads
    norm = np.sqrt(sum(float(np.sum(np.square(g, dtype=np.float64))) for g in grads))
    return (
        grads if norm < clip_norm else [(g * (clip_norm / norm)).astype(np.float32) for g in grads]
    )


@pytest.mark.parametrize("decouple_lr, clip_norm", [(True, 0.0), (False, 5.0)])
def test_stable_adamw_equals_optimi_step_for_step(decouple_lr, clip_norm):
    """20 steps over a warmup-stable-decay schedule, with and without the update clipping
    engaging, equal optimi's StableAdamW (kahan summation off) to 1e-6 relative; weight decay
    on kernels and embeddings only."""
    rng = np.random.default_rng(0)
    params = jax.tree.map(
        lambda s: rng.standard_normal(s).astype(np.float32), SHAPES, is_leaf=_leaf
    )
    grads = _gradients(rng, params)
    opt_config = _optimizer_config(decouple_lr, clip_norm)
    tx, schedule = optim.from_config(opt_config, [STEPS])

    leaves, treedef = jax.tree.flatten(params)
    decays = treedef.flatten_up_to(optim.decay_mask(params))
    tensors = [torch.tensor(leaf, requires_grad=True) for leaf in leaves]
    groups = [
        {
            "params": [t for t, d in zip(tensors, decays) if d],
            "weight_decay": opt_config.weight_decay,
        },
        {"params": [t for t, d in zip(tensors, decays) if not d], "weight_decay": 0.0},
    ]
    peak = opt_config.learning_rate
    reference = optimi.StableAdamW(
        groups,
        lr=peak,
        betas=(opt_config.b1, opt_config.b2),
        eps=opt_config.eps,
        decouple_lr=decouple_lr,
        max_lr=peak if decouple_lr else None,
        kahan_sum=False,
        foreach=False,
        triton=False,
    )

    state = tx.init(params)
    step_fn = jax.jit(lambda p, s, g: _apply(tx, p, s, g))
    engaged = []
    for step, grad in enumerate(grads):
        params, state = step_fn(params, state, grad)
        clipped = _torch_clip(treedef.flatten_up_to(grad), clip_norm)
        for group in reference.param_groups:
            group["lr"] = float(schedule(step))
        for tensor, g in zip(tensors, clipped):
            tensor.grad = torch.tensor(g)
        reference.step()
        engaged.append(_update_clipping_engaged(reference, tensors, clipped, opt_config.eps))
        for ours, theirs in zip(jax.tree.leaves(params), tensors):
            np.testing.assert_allclose(
                np.asarray(ours), theirs.detach().numpy(), rtol=1e-6, atol=1e-7
            )
    assert any(engaged[step] for step in JUMPS), "the large gradients never clipped the update"
    assert not any(engaged[step] for step in range(2, JUMPS[0])), "clipped where it should not"
    assert float(schedule(STEPS - 1)) < peak  # the decay ran, as the warmup did


def _apply(tx, params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state


def _leaf(x) -> bool:
    return isinstance(x, tuple)


def _update_clipping_engaged(reference, tensors, grads, eps: float) -> bool:
    """Whether any tensor's RMS(g^2 / max(v_hat, eps^2)) passed 1 at the step optimi just took
    (its exp_avg_sq is the bias-corrected second moment)."""
    for tensor, g in zip(tensors, grads):
        v_hat = reference.state[tensor]["exp_avg_sq"].numpy()
        if np.sqrt(np.mean(np.square(g) / np.maximum(v_hat, eps**2))) > 1.0:
            return True
    return False


def test_decouple_lr_divides_the_decay_by_the_peak_for_every_optimizer():
    """`optimizer.decouple_lr`: the decay per step is lr / peak x weight_decay, here shown by
    AdamW on zero gradients (its Adam direction is 0, so only the decay moves the weights)."""
    opt_config = _optimizer_config(True, 0.0)
    opt_config.name, opt_config.weight_decay, opt_config.warmup_steps = "adamw", 0.01, 0
    tx, schedule = optim.from_config(opt_config, [STEPS])
    params = {"layer": {"kernel": jnp.ones((2, 3)), "bias": jnp.ones((3,))}}
    updates, _ = tx.update(jax.tree.map(jnp.zeros_like, params), tx.init(params), params)
    share = float(schedule(0)) / opt_config.learning_rate
    np.testing.assert_allclose(updates["layer"]["kernel"], -share * 0.01, rtol=1e-6)
    np.testing.assert_array_equal(updates["layer"]["bias"], 0.0)


@pytest.mark.parametrize("size, peak", [("base", 8e-4), ("large", 5e-4)])
def test_modernbert_recipes_train_with_the_papers_stable_adamw(size, peak):
    """modernbert:base and :large: StableAdamW with ModernBERT's betas, eps and weight decay
    decoupled from the rate, no gradient clipping (the update clipping takes its place)."""
    from bert_jax.configs import modernbert

    optimizer = modernbert.get_config(size).optimizer
    assert (optimizer.name, optimizer.learning_rate) == ("stableadamw", peak)
    assert (optimizer.b1, optimizer.b2, optimizer.eps) == (0.9, 0.98, 1e-6)
    assert (optimizer.weight_decay, optimizer.decouple_lr, optimizer.clip_norm) == (1e-5, True, 0)
