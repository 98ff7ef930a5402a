"""Optimizer and schedule: the original BERT recipe, checked against optax and closed forms."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_jax.core import hf_adamw, optim


def test_warmup_then_linear_decay_values():
    schedule = optim.warmup_decay(1e-4, warmup_steps=10, total_steps=100)
    values = [float(schedule(s)) for s in (0, 5, 9, 10, 50, 99, 100, 150)]
    expected = [0.0, 5e-5, 9e-5, 9e-5, 5e-5, 1e-6, 0.0, 0.0]
    np.testing.assert_allclose(values, expected, rtol=1e-6, atol=1e-12)
    with pytest.raises(ValueError, match="total_steps"):
        optim.warmup_decay(1e-4, 10, 0)


def test_cosine_decay_is_optaxs_cosine_after_the_same_warmup():
    steps = np.arange(0, 131)
    peak, end, warmup, total = 1e-3, 1e-5, 10, 120
    # Measured from step 0 (the paper's whole-run measure): optax's cosine over the whole run.
    ours = np.asarray(optim.warmup_decay(peak, warmup, total, end, decay="cosine")(steps))
    cosine = optax.cosine_decay_schedule(peak, total, alpha=end / peak)
    expected = np.where(steps < warmup, peak * steps / warmup, cosine(steps))
    np.testing.assert_allclose(ours, expected, rtol=2e-5, atol=1e-10)
    # Measured from the warmup's end: optax's warmup_cosine_decay_schedule.
    ours = optim.warmup_decay(peak, warmup, total, end, decay="cosine", from_warmup_end=True)
    reference = optax.warmup_cosine_decay_schedule(0.0, peak, warmup, total, end)
    np.testing.assert_allclose(ours(steps), reference(steps), rtol=2e-5, atol=1e-10)
    with pytest.raises(
        ValueError, match="optimizer.decay='step' is not one of 'linear', 'cosine', 'wsd'"
    ):
        optim.warmup_decay(peak, warmup, total, decay="step")


def test_warmup_stable_decay_holds_the_peak_then_decays_as_one_minus_sqrt():
    """ModernBERT's trapezoid: 10 warmup steps, the peak to step 80, then 1 - sqrt over the last
    20% down to the end rate at step 100 (and after)."""
    peak, end = 1e-3, 1e-5
    schedule = optim.warmup_decay(peak, 10, 100, end, decay="wsd", decay_fraction=0.2)
    steps = (0, 5, 10, 11, 50, 80, 85, 95, 99, 100, 120)
    values = [float(schedule(s)) for s in steps]
    drop = peak - end
    expected = [0.0, 5e-4, peak, peak, peak, peak]
    expected += [end + drop * (1 - np.sqrt(p)) for p in (0.25, 0.75, 0.95, 1.0, 1.0)]
    np.testing.assert_allclose(values, expected, rtol=1e-6, atol=1e-12)
    # No decay share: the peak to the end; a decay longer than the run starts after the warmup.
    flat = optim.warmup_decay(peak, 10, 100, end, decay="wsd", decay_fraction=0.0)
    assert [float(flat(s)) for s in (10, 99, 100)] == pytest.approx([peak] * 3)
    whole = optim.warmup_decay(peak, 10, 100, 0.0, decay="wsd", decay_fraction=1.0)
    assert float(whole(10)) == pytest.approx(peak)
    assert float(whole(55)) == pytest.approx(peak * (1 - np.sqrt(0.5)), rel=1e-6)
    with pytest.raises(ValueError, match="optimizer.decay_fraction=1.5 must be in"):
        optim.warmup_decay(peak, 10, 100, decay="wsd", decay_fraction=1.5)


def test_hugging_faces_linear_schedule_decays_from_the_warmups_end():
    ours = optim.warmup_decay(1e-4, 10, 110, from_warmup_end=True)
    values = [float(ours(s)) for s in (0, 5, 10, 60, 110, 150)]
    np.testing.assert_allclose(values, [0.0, 5e-5, 1e-4, 5e-5, 0.0, 0.0], rtol=1e-6, atol=1e-12)


def test_the_configs_decay_shapes_the_schedule_whole_run_and_per_phase():
    import ml_collections

    optimizer = ml_collections.ConfigDict(
        dict(name="adamw", learning_rate=1e-3, end_learning_rate=0.0, warmup_steps=10, b1=0.9,
             b2=0.999, eps=1e-6, weight_decay=0.01, clip_norm=1.0, bias_correction=True,
             schedule="whole_run", decay="cosine")
    )  # fmt: skip
    _, schedule = optim.from_config(optimizer, [90, 10])
    expected = optim.warmup_decay(1e-3, 10, 100, decay="cosine")
    np.testing.assert_array_equal(schedule(np.arange(100)), expected(np.arange(100)))
    assert float(schedule(50)) == pytest.approx(0.5e-3, rel=1e-5)  # half way: half the peak
    optimizer.schedule = "per_phase"
    _, schedule = optim.from_config(optimizer, [90, 10])
    second = optim.warmup_decay(1e-3, 10, 10, decay="cosine")
    np.testing.assert_array_equal(schedule(np.arange(90, 100)), second(np.arange(10)))
    # One declaration: the config's default and the checks' choices are optim's.
    from bert_jax.training import config_checks, config_lib

    assert config_lib.pretraining_config("base").optimizer.decay == optim.DEFAULT_DECAY
    assert config_checks.CHOICES["optimizer.decay"] is optim.DECAYS
    del optimizer.decay  # configs written before the setting: the paper's linear decay
    optimizer.schedule = "whole_run"
    _, schedule = optim.from_config(optimizer, [90, 10])
    assert float(schedule(50)) == pytest.approx(0.5e-3, rel=1e-5)
    assert float(schedule(75)) == pytest.approx(0.25e-3, rel=1e-5)


def test_decay_mask_skips_layer_norm_and_biases():
    params = {
        "embeddings": {"word_embeddings": {"embedding": 1}, "LayerNorm": {"scale": 1, "bias": 1}},
        "dense": {"kernel": 1, "bias": 1},
        "predictions": {"output_bias": 1},
    }
    mask = optim.decay_mask(params)
    assert mask["embeddings"]["word_embeddings"]["embedding"]
    assert mask["dense"]["kernel"]
    assert not mask["dense"]["bias"]
    assert not mask["embeddings"]["LayerNorm"]["scale"]
    assert not mask["embeddings"]["LayerNorm"]["bias"]
    assert not mask["predictions"]["output_bias"]


def _params_and_grads():
    rng = np.random.default_rng(0)
    params = {
        "dense": {
            "kernel": jnp.asarray(rng.normal(size=(3, 4)), jnp.float32),
            "bias": jnp.asarray(rng.normal(size=(4,)), jnp.float32),
        },
    }
    grads = [
        jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
        for _ in range(3)
    ]
    return params, grads


def _compiled_step(tx: optax.GradientTransformation):
    """`tx`'s update and its application in one compiled program: (updates, state, params).
    Run op by op, each of an optimizer's operations compiles alone: seconds for a few steps."""

    def step(grads, state, params):
        updates, state = tx.update(grads, state, params)
        return updates, state, optax.apply_updates(params, updates)

    return jax.jit(step)


def test_bert_adamw_equals_optax_adamw_with_the_same_mask():
    params, grads = _params_and_grads()
    schedule = optim.warmup_decay(1e-2, 1, 10)
    ours = optim.bert_adamw(schedule, clip_norm=None)
    ref = optax.adamw(
        schedule, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01, mask=optim.decay_mask
    )
    p1, p2 = params, params
    s1, s2 = jax.jit(ours.init)(params), jax.jit(ref.init)(params)
    step1, step2 = _compiled_step(ours), _compiled_step(ref)
    for g in grads:
        _, s1, p1 = step1(g, s1, p1)
        _, s2, p2 = step2(g, s2, p2)
    for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p2)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


ONE_PASS_CASES = {
    "bert-paper": (optim.bert_adamw, optim.bert_adamw_chain, {}),
    "bert-original-code": (optim.bert_adamw, optim.bert_adamw_chain, {"bias_correction": False}),
    "bert-plain-adam": (
        optim.bert_adamw,
        optim.bert_adamw_chain,
        {"clip_norm": None, "weight_decay": 0.0},
    ),
    "bert-clip-inactive": (optim.bert_adamw, optim.bert_adamw_chain, {"clip_norm": 1e3}),
    "torch": (hf_adamw.torch_adamw, hf_adamw.torch_adamw_chain, {}),
    "torch-plain-adam": (
        hf_adamw.torch_adamw,
        hf_adamw.torch_adamw_chain,
        {"clip_norm": None, "weight_decay": 0.0},
    ),
    "torch-clip-inactive": (hf_adamw.torch_adamw, hf_adamw.torch_adamw_chain, {"clip_norm": 1e3}),
}


@pytest.mark.parametrize("case", list(ONE_PASS_CASES))
def test_one_pass_optimizers_are_their_optax_chains(case):
    """`bert_adamw` and `torch_adamw` (one jitted pass per parameter) equal their chains of
    optax transforms bit for bit, clipping on and off, and keep the chain's state (so
    checkpoints restore into either)."""
    fused_of, chain_of, settings = ONE_PASS_CASES[case]
    rng = np.random.default_rng(1)
    shapes = {
        "embeddings": {"word_embeddings": {"embedding": (50, 8)}, "LayerNorm": {"scale": (8,)}},
        "dense": {"kernel": (8, 16), "bias": (16,)},
        "other": {"kernel": (8, 16), "bias": (16,)},  # shapes shared: one trace serves both
    }
    params = jax.tree.map(
        lambda s: jnp.asarray(rng.normal(size=s), jnp.float32),
        shapes,
        is_leaf=lambda x: isinstance(x, tuple),
    )
    schedule = optim.warmup_decay(1e-2, 2, 10)
    fused = fused_of(schedule, **settings)
    chain = chain_of(schedule, **settings)
    p1, p2 = params, params
    s1, s2 = jax.jit(fused.init)(params), jax.jit(chain.init)(params)
    assert jax.tree.structure(s1) == jax.tree.structure(s2)
    step1, step2 = _compiled_step(fused), _compiled_step(chain)
    for scale in (1.0, 0.01, 3.0, 0.001, 1.0):  # global norms ~30, 0.3, 90, 0.03, 30
        g = jax.tree.map(lambda p, s=scale: jnp.asarray(s * rng.normal(size=p.shape), p.dtype), p1)
        # Given the norm the trainer computed (`grad_norm`), the update is the same.
        given = jax.jit(lambda g, s, p: fused.update(g, s, p, grad_norm=optim.global_norm(g)))
        u3, s3 = given(g, s1, p1)
        u1, s1, p1 = step1(g, s1, p1)
        u2, s2, p2 = step2(g, s2, p2)
        for a, b, c in zip(*map(jax.tree.leaves, (u1, u2, u3)), strict=True):
            np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(c, b)
        assert jax.tree.structure(s3) == jax.tree.structure(s1)
    assert jax.tree.structure(s1) == jax.tree.structure(s2)
    for a, b in zip(jax.tree.leaves((s1, p1)), jax.tree.leaves((s2, p2)), strict=True):
        np.testing.assert_array_equal(a, b)
    if settings.get("weight_decay", 0.01):
        with pytest.raises(ValueError, match="needs the parameters"):
            fused.update(g, s1)


def test_global_norm_is_optax_tree_norm():
    rng = np.random.default_rng(2)
    tree = {"a": jnp.asarray(rng.normal(size=(7, 3)), jnp.float32), "b": [jnp.float32(-2.5)]}
    np.testing.assert_array_equal(optim.global_norm(tree), optax.tree.norm(tree))
    np.testing.assert_array_equal(jax.jit(optim.global_norm)(tree), optax.tree.norm(tree))


def test_no_bias_correction_follows_the_original_update_rule():
    params, grads = _params_and_grads()
    lr, wd, b1, b2, eps = 1e-2, 0.01, 0.9, 0.999, 1e-6
    tx = optim.bert_adamw(lambda _: lr, weight_decay=wd, clip_norm=None, bias_correction=False)
    state = jax.jit(tx.init)(params)
    update = _compiled_step(tx)
    p = jax.tree.map(np.asarray, params)
    m = jax.tree.map(np.zeros_like, p)
    v = jax.tree.map(np.zeros_like, p)
    current = params
    for g in grads:
        _, state, current = update(g, state, current)
        g = jax.tree.map(np.asarray, g)
        m = jax.tree.map(lambda m_, g_: b1 * m_ + (1 - b1) * g_, m, g)
        v = jax.tree.map(lambda v_, g_: b2 * v_ + (1 - b2) * g_**2, v, g)
        step = jax.tree.map(lambda m_, v_: m_ / (np.sqrt(v_) + eps), m, v)
        step["dense"]["kernel"] = step["dense"]["kernel"] + wd * p["dense"]["kernel"]
        p = jax.tree.map(lambda p_, s_: p_ - lr * s_, p, step)
    for a, b in zip(jax.tree.leaves(current), jax.tree.leaves(p)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_gradients_are_clipped_to_global_norm_one():
    params = {"kernel": jnp.zeros((4,))}
    tx = optim.bert_adamw(lambda _: 1.0, weight_decay=0.0, clip_norm=1.0)
    grads = {"kernel": jnp.full((4,), 10.0)}
    clipped, _ = jax.jit(tx.update)(grads, jax.jit(tx.init)(params), params)
    # First Adam step with bias correction is sign(g) * |g| / (|g| + eps) ~ 1 regardless of scale,
    # so look at the clipping stage directly.
    first, _ = optax.clip_by_global_norm(1.0).update(grads, None)
    np.testing.assert_allclose(optax.tree.norm(first), 1.0, rtol=1e-6)
    assert np.isfinite(np.asarray(clipped["kernel"])).all()


def test_no_gradient_to_padding_row_is_torchs_padding_idx():
    """Forward the same table; backward the [PAD] row's gradient is zero, every other row's as
    without it (`torch.nn.Embedding(padding_idx=...)`); other leaves untouched."""
    rng = np.random.default_rng(3)
    params = {
        "embeddings": {"word_embeddings": {"embedding": jnp.asarray(rng.normal(size=(6, 4)))}},
        "dense": {"kernel": jnp.asarray(rng.normal(size=(4, 4)))},
    }
    ids = jnp.array([0, 2, 0, 5, 2])

    def loss(p):
        rows = p["embeddings"]["word_embeddings"]["embedding"][ids]
        return jnp.sum(jnp.tanh(rows @ p["dense"]["kernel"]))

    plain = jax.grad(loss)(params)
    wrapped = jax.grad(lambda p: loss(hf_adamw.no_gradient_to_padding_row(p, 0)))(params)
    np.testing.assert_array_equal(
        loss(hf_adamw.no_gradient_to_padding_row(params, 0)), loss(params)
    )
    table, table_plain = (g["embeddings"]["word_embeddings"]["embedding"] for g in (wrapped, plain))
    assert np.abs(np.asarray(table_plain[0])).sum() > 0
    np.testing.assert_array_equal(table[0], np.zeros(4))
    np.testing.assert_array_equal(table[1:], table_plain[1:])
    np.testing.assert_array_equal(wrapped["dense"]["kernel"], plain["dense"]["kernel"])
