"""Model: parity with Hugging Face transformers (PyTorch), real weights, parameter counts."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from bert_jax.convert import hf as hf_convert
from bert_jax.convert import mapping
from bert_jax.core import losses, shared_layers, trainer
from bert_jax.core.layers import Embed
from bert_jax.core.model import BertConfig, BertForPreTraining, BertLayer, BertModel
from tests.helpers import (
    REAL_SENTENCES,
    hf_config,
    minilm_dir,
    random_batch,
    random_params,
    tiny_config,
)


def _hf_pretraining_model(config: BertConfig, seed: int = 0):
    torch.manual_seed(seed)
    model = transformers.BertForPreTraining(hf_config(config)).eval()
    # Non-trivial biases and LayerNorm parameters, so a mapping mistake cannot hide behind 0/1.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name:
                param.add_(0.1 * torch.randn_like(param))
    return model


def _init(model, inputs, seed: int = 0):
    """`model.init` compiled, unboxed: an eager init runs op by op (about 3 CPU-s in a fresh
    process, against about 1 s compiled)."""
    return nn.meta.unbox(jax.jit(model.init)(jax.random.key(seed), **inputs))


@pytest.fixture(scope="module")
def tiny_variables():
    """Variables of BertForPreTraining(tiny_config()), shared by the tests that read that model
    (its parameters do not depend on the batch's shape, nor on the compute dtype): transformers'
    model's, converted, so no init is compiled for them (an init program compiles in about twice
    a forward's CPU time; test_padded_vocabulary runs the model's init)."""
    config = tiny_config()
    state_dict = _hf_pretraining_model(config, seed=3).state_dict()
    return {"params": hf_convert.params_from_hf(state_dict, config)}


def _torch_inputs(batch):
    return dict(
        input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
        attention_mask=torch.tensor(batch["input_mask"], dtype=torch.long),
        token_type_ids=torch.tensor(batch["segment_ids"], dtype=torch.long),
    )


@pytest.mark.parametrize("hidden_act", ["gelu", "gelu_new"])
def test_pretraining_outputs_match_transformers(hidden_act):
    # Every position through the last layer, to compare all hidden states.
    config = tiny_config(hidden_act=hidden_act, num_hidden_layers=3, sparse_last_layer=False)
    hf_model = _hf_pretraining_model(config)
    params = hf_convert.params_from_hf(hf_model.state_dict(), config)
    batch = random_batch(np.random.default_rng(0), 4, 32, 6, config.vocab_size)
    assert batch["input_mask"].min() == 0, "the batch must contain padding"

    model = BertForPreTraining(config)
    ours = jax.jit(lambda variables, inputs: model.apply(variables, **inputs, deterministic=True))(
        {"params": params}, trainer.model_inputs(batch)
    )
    with torch.no_grad():
        ref = hf_model(**_torch_inputs(batch), output_hidden_states=True)
        ref_seq = hf_model.bert(**_torch_inputs(batch))
    positions = torch.tensor(batch["masked_lm_positions"], dtype=torch.long)
    ref_mlm = torch.gather(
        ref.prediction_logits, 1, positions[..., None].expand(-1, -1, config.vocab_size)
    )

    def close(a, b):
        np.testing.assert_allclose(np.asarray(a), b.numpy(), atol=1e-5, rtol=0)

    close(ours["sequence_output"], ref_seq.last_hidden_state)
    close(ours["pooled_output"], ref_seq.pooler_output)
    close(ours["mlm_logits"], ref_mlm)
    close(ours["nsp_logits"], ref.seq_relationship_logits)
    for ours_h, ref_h in zip(ours["hidden_states"], ref.hidden_states):
        close(ours_h, ref_h)


def test_loss_and_gradient_norm_match_transformers():
    config = tiny_config()
    hf_model = _hf_pretraining_model(config, seed=1)
    params = hf_convert.params_from_hf(hf_model.state_dict(), config)
    batch = random_batch(np.random.default_rng(1), 4, 32, 6, config.vocab_size)
    model = BertForPreTraining(config)

    def loss_fn(p):
        return losses.pretraining_loss(trainer.compute_sums(p, batch, model, deterministic=True))

    loss, grads = jax.jit(jax.value_and_grad(loss_fn))(params)
    # In NumPy: each eager jnp operation on a new shape compiles a program of its own.
    grad_norm = float(np.sqrt(sum(np.sum(np.asarray(g) ** 2) for g in jax.tree.leaves(grads))))

    labels = np.full(batch["input_ids"].shape, -100, np.int64)
    for row in range(len(labels)):
        for pos, tok, w in zip(
            batch["masked_lm_positions"][row],
            batch["masked_lm_ids"][row],
            batch["masked_lm_weights"][row],
        ):
            if w > 0:
                labels[row, pos] = tok
    out = hf_model(
        **_torch_inputs(batch),
        labels=torch.tensor(labels),
        next_sentence_label=torch.tensor(batch["next_sentence_labels"], dtype=torch.long),
    )
    out.loss.backward()
    ref_norm = float(
        torch.sqrt(sum((p.grad**2).sum() for p in hf_model.parameters() if p.grad is not None))
    )
    np.testing.assert_allclose(float(loss), out.loss.item(), rtol=1e-4)
    np.testing.assert_allclose(grad_norm, ref_norm, rtol=1e-4)


def test_real_minilm_weights_match_transformers():
    """all-MiniLM-L6-v2 (6 layers, hidden 384, encoder only) on real sentences."""
    from safetensors.numpy import load_file

    directory = minilm_dir()
    hf_model = transformers.BertModel.from_pretrained(directory, attn_implementation="eager").eval()
    tokenizer = transformers.BertTokenizer(f"{directory}/vocab.txt", do_lower_case=True)
    state = load_file(f"{directory}/model.safetensors")
    config = hf_convert.config_from_hf(hf_model.config.to_dict())
    assert not hf_convert.has_pretraining_heads(state)
    params = hf_convert.params_from_hf(state, config)

    encoded = tokenizer(REAL_SENTENCES, padding=True, return_tensors="np")
    ours = jax.jit(BertModel(config).apply)(
        {"params": params["bert"]},
        encoded["input_ids"],
        encoded["attention_mask"],
        encoded["token_type_ids"],
    )
    with torch.no_grad():
        ref = hf_model(**{k: torch.tensor(v) for k, v in encoded.items()})
    # Float32 through 6 real layers: XLA's and PyTorch's matmuls sum in different orders, and
    # how far apart that puts them depends on the CPU's vector units (AVX2 machines reach
    # ~3e-5 on a few of the 46k values, with values up to ~5); the mean error stays far lower.
    for got, want in (
        (ours["sequence_output"], ref.last_hidden_state),
        (ours["pooled_output"], ref.pooler_output),
    ):
        error = np.abs(np.asarray(got) - want.numpy())
        assert error.max() < 1e-4, error.max()
        assert error.mean() < 2e-6, error.mean()


def _count(config: BertConfig) -> tuple[int, int]:
    batch = trainer.dummy_batch(1, 8, 2)
    shapes = jax.eval_shape(
        lambda: BertForPreTraining(config).init(jax.random.key(0), **trainer.model_inputs(batch))
    )
    params = nn.meta.unbox(shapes)["params"]
    total = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
    encoder = sum(
        int(np.prod(x.shape))
        for path, x in jax.tree_util.tree_flatten_with_path(params["bert"])[0]
        if "pooler" not in jax.tree_util.keystr(path)
    )
    return total, encoder


def test_parameter_counts_match_the_paper():
    base = BertConfig()
    large = BertConfig(
        hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096
    )
    base_total, base_encoder = _count(base)
    large_total, large_encoder = _count(large)
    pooler = lambda d: d * d + d  # noqa: E731
    assert base_total == 110_106_428
    assert large_total == 336_226_108
    assert base_encoder + pooler(768) == 109_482_240
    assert large_encoder + pooler(1024) == 335_141_888


OUTPUTS_BATCH = random_batch(np.random.default_rng(2), 2, 16, 4, tiny_config().vocab_size)


def _compiled_outputs(tiny_variables):
    model = BertForPreTraining(tiny_config())
    return jax.jit(lambda p, b: model.apply({"params": p}, **b))(
        tiny_variables["params"], trainer.model_inputs(OUTPUTS_BATCH)
    )


def test_outputs_without_jit_equal_the_compiled_ones(tiny_variables):
    """The model runs op by op too (each operation compiled alone: seconds of CPU)."""
    model = BertForPreTraining(tiny_config())
    eager = model.apply(tiny_variables, **trainer.model_inputs(OUTPUTS_BATCH))
    np.testing.assert_allclose(
        eager["mlm_logits"], _compiled_outputs(tiny_variables)["mlm_logits"], atol=1e-5
    )


def test_outputs_finite_and_in_bfloat16(tiny_variables):
    config = tiny_config()
    batch = OUTPUTS_BATCH
    jitted = _compiled_outputs(tiny_variables)
    assert jitted["mlm_logits"].shape == (2, 4, config.vocab_size)
    assert jitted["nsp_logits"].shape == (2, 2)
    assert np.isfinite(np.asarray(jitted["mlm_logits"])).all()

    bf16 = BertForPreTraining(config.replace(dtype="bfloat16"))
    bf16_shapes = jax.eval_shape(bf16.init, jax.random.key(0), **trainer.model_inputs(batch))
    bf16_shapes = nn.meta.unbox(bf16_shapes)
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(bf16_shapes))
    assert jax.tree.structure(bf16_shapes) == jax.tree.structure(tiny_variables)
    out = jax.jit(bf16.apply)(tiny_variables, **trainer.model_inputs(batch))
    assert out["sequence_output"].dtype == jnp.bfloat16
    assert out["mlm_logits"].dtype == jnp.float32
    assert np.isfinite(np.asarray(out["mlm_logits"])).all()
    # bf16 activations track the float32 model to bf16 precision.
    np.testing.assert_allclose(out["nsp_logits"], jitted["nsp_logits"], atol=5e-2)


ATTENTION_BATCH = random_batch(np.random.default_rng(3), 3, 16, 4, tiny_config().vocab_size)


@pytest.fixture(scope="module")
def xla_attention_output(tiny_variables):
    """The reference both implementations are compared with: XLA's attention, computed once."""
    reference = BertForPreTraining(tiny_config().replace(attention_impl="xla"))
    return jax.jit(reference.apply)(tiny_variables, **trainer.model_inputs(ATTENTION_BATCH))


@pytest.mark.parametrize("impl", ["xla", "dot_product"])
def test_attention_implementations_agree(impl, tiny_variables, xla_attention_output):
    config = tiny_config()
    expected = xla_attention_output
    got = jax.jit(BertForPreTraining(config.replace(attention_impl=impl)).apply)(
        tiny_variables, **trainer.model_inputs(ATTENTION_BATCH)
    )
    np.testing.assert_allclose(got["sequence_output"], expected["sequence_output"], atol=1e-5)


def test_dropout_is_active_in_training_and_fused_attention_refuses_it(tiny_variables):
    config = tiny_config()
    batch = random_batch(np.random.default_rng(4), 2, 16, 4, config.vocab_size)
    model = BertForPreTraining(config)
    params = tiny_variables
    run = jax.jit(
        lambda key: model.apply(
            params, **trainer.model_inputs(batch), deterministic=False, rngs={"dropout": key}
        )["nsp_logits"]
    )
    assert not np.allclose(run(jax.random.key(1)), run(jax.random.key(2)))
    fused = BertForPreTraining(config.replace(attention_impl="dot_product"))
    with pytest.raises(ValueError, match="attention_probs_dropout_prob"):
        # Traced only (the refusal is raised while tracing): op by op, each operation before it
        # would compile alone.
        jax.eval_shape(
            lambda: fused.apply(
                params,
                **trainer.model_inputs(batch),
                deterministic=False,
                rngs={"dropout": jax.random.key(1)},
            )
        )


def test_config_errors_name_the_setting():
    with pytest.raises(ValueError, match="num_attention_heads"):
        BertConfig(hidden_size=100, num_attention_heads=3)
    with pytest.raises(ValueError, match="gelu_new"):
        BertConfig(hidden_act="gelu_fast")


def test_sparse_last_layer_gives_the_dense_losses_and_gradients(tiny_variables):
    """The last layer only where the heads read: same logits, losses and gradients."""
    # Two layers: the first runs every position in both models, the last only the heads' in one.
    config = tiny_config(sparse_last_layer=False)
    batch = random_batch(np.random.default_rng(5), 4, 32, 6, config.vocab_size)
    # A repeated position and the padding slot's position 0 (weight 0) must both work.
    batch["masked_lm_positions"][0, 1] = batch["masked_lm_positions"][0, 0]
    dense = BertForPreTraining(config)
    sparse = BertForPreTraining(config.replace(sparse_last_layer=True))
    params = tiny_variables["params"]  # the parameters do not depend on sparse_last_layer

    def run(model):
        """Outputs, loss, sums and gradients: one compiled program per model."""

        def loss(p):
            sums = trainer.compute_sums(p, batch, model, deterministic=True)
            return losses.pretraining_loss(sums), sums

        def both(p):
            outputs = model.apply({"params": p}, **trainer.model_inputs(batch))
            return outputs, jax.value_and_grad(loss, has_aux=True)(p)

        return jax.jit(both)(params)

    out_d, ((loss_d, sums_d), grads_d) = run(dense)
    out_s, ((loss_s, sums_s), grads_s) = run(sparse)
    np.testing.assert_allclose(loss_s, loss_d, rtol=1e-6)
    for key in sums_d:
        np.testing.assert_allclose(sums_s[key], sums_d[key], rtol=1e-6, err_msg=key)
    for path, g_d in jax.tree_util.tree_leaves_with_path(grads_d):
        g_s = _at(grads_s, path)
        np.testing.assert_allclose(g_s, g_d, rtol=1e-4, atol=1e-7, err_msg=str(path))

    picked = np.take_along_axis(
        np.asarray(out_d["sequence_output"]), batch["masked_lm_positions"][..., None], axis=1
    )
    assert out_s["sequence_output"].shape == (4, 6, config.hidden_size)
    np.testing.assert_allclose(out_s["sequence_output"], picked, atol=1e-5)
    np.testing.assert_allclose(out_s["pooled_output"], out_d["pooled_output"], atol=1e-5)
    np.testing.assert_allclose(out_s["mlm_logits"], out_d["mlm_logits"], atol=1e-5)
    assert len(out_s["hidden_states"]) == len(out_d["hidden_states"])
    for h_s, h_d in zip(out_s["hidden_states"][:-1], out_d["hidden_states"][:-1]):
        np.testing.assert_array_equal(h_s, h_d)


REMAT_BATCH = random_batch(np.random.default_rng(7), 4, 32, 6, tiny_config().vocab_size)


def _remat_step(model):
    def loss(p):
        sums = trainer.compute_sums(p, REMAT_BATCH, model, False, jax.random.key(3))
        return losses.pretraining_loss(sums)

    return jax.jit(jax.value_and_grad(loss))


def _remat_count(traced) -> int:
    """The jax.checkpoint equations (primitive "remat2") in a traced step's program."""
    return [eqn.primitive.name for eqn in _primitives(traced.jaxpr.jaxpr)].count("remat2")


@pytest.fixture(scope="module")
def plain_step(tiny_variables):
    """The model without remat: its parameters, its loss and gradients (dropout on), which each
    remat policy's are compared with (computed once), and its program's remat count."""
    plain = BertForPreTraining(tiny_config(num_hidden_layers=2))
    params = tiny_variables["params"]
    traced = _remat_step(plain).trace(params)
    return params, traced.lower().compile()(params), _remat_count(traced)


# make test checks "full"; make test-slow "dots" too (tests/conftest.py names it).
@pytest.mark.parametrize("remat", ["full", "dots"])
def test_remat_gives_the_same_losses_and_gradients(remat, plain_step):
    """Rematerialized layers (dropout on, same key): same loss and gradients, same parameter
    names, each layer under jax.checkpoint."""
    config = tiny_config(num_hidden_layers=2)
    batch = REMAT_BATCH
    params, (loss_p, grads_p), plain_count = plain_step
    again = BertForPreTraining(config.replace(remat=remat))
    shapes = jax.eval_shape(lambda: again.init(jax.random.key(0), **trainer.model_inputs(batch)))
    assert jax.tree.structure(nn.meta.unbox(shapes["params"])) == jax.tree.structure(params)
    # Traced once: the program it runs is the one whose equations are counted below.
    traced = _remat_step(again).trace(params)
    loss_r, grads_r = traced.lower().compile()(params)
    np.testing.assert_allclose(loss_r, loss_p, rtol=1e-6)
    for path, g_p in jax.tree_util.tree_leaves_with_path(grads_p):
        np.testing.assert_allclose(_at(grads_r, path), g_p, rtol=1e-5, atol=1e-7, err_msg=str(path))
    # One jax.checkpoint per layer in the gradient's program. What that saves is the compiler's
    # to show, at real sizes: README, TPU (Large, seq 512, on v5p-16).
    assert plain_count == 0, plain_count
    assert _remat_count(traced) == config.num_hidden_layers, _remat_count(traced)
    with pytest.raises(ValueError, match="remat"):
        BertConfig(remat="some")


# make test checks remat "none"; make test-slow "full" too (tests/conftest.py names it).
@pytest.mark.parametrize("remat", ["none", "full"])
def test_layers_share_one_trace_and_draw_each_layers_own_masks(remat, monkeypatch):
    """The encoder's layers run as calls of one traced layer (one for the sparse last layer),
    and with dropout on their loss and gradients are bit for bit those of the layers applied
    one by one as modules: each layer still draws its own masks."""
    config = tiny_config(num_hidden_layers=3, remat=remat)
    model = BertForPreTraining(config)
    inputs = trainer.model_inputs(REMAT_BATCH)
    params = random_params(model, **inputs)["params"]
    forward = jax.make_jaxpr(
        lambda p: model.apply(
            {"params": p}, **inputs, deterministic=False, rngs={"dropout": jax.random.key(3)}
        )
    )(params)
    calls = [
        eqn.params["jaxpr"]
        for eqn in _primitives(forward.jaxpr)
        if eqn.primitive.name == "jit" and eqn.params["name"] == "_apply"
    ]
    assert len(calls) == config.num_hidden_layers
    assert len({id(jaxpr) for jaxpr in calls}) == 2  # every position, the heads' positions
    shared = _remat_step(model)(params)
    monkeypatch.setattr(shared_layers, "can_share", lambda *args, **kwargs: False)
    one_by_one = _remat_step(model)(params)
    assert jax.tree.structure(shared) == jax.tree.structure(one_by_one)
    for (path, value), again in zip(
        jax.tree_util.tree_leaves_with_path(one_by_one), jax.tree.leaves(shared), strict=True
    ):
        np.testing.assert_array_equal(again, value, err_msg=jax.tree_util.keystr(path))


def test_a_shared_layer_refuses_a_dropout_draw_it_does_not_declare(monkeypatch):
    """A draw at a site missing from the layer's DROPOUT_SITES would get no constants of its
    own: tracing stops there, naming the site."""
    monkeypatch.setattr(BertLayer, "DROPOUT_SITES", {("Dropout_0",): 2})
    config = tiny_config(num_hidden_layers=1)
    model = BertForPreTraining(config)
    inputs = trainer.model_inputs(REMAT_BATCH)
    params = random_params(model, **inputs)["params"]
    with pytest.raises(LookupError, match=r"\('attention', 'Dropout_0', 1\)"):
        jax.eval_shape(
            lambda p: model.apply(
                {"params": p}, **inputs, deterministic=False, rngs={"dropout": jax.random.key(3)}
            ),
            params,
        )


def _at(tree, path):
    for entry in path:
        tree = tree[entry.key]
    return tree


def _primitives(jaxpr) -> list:
    """Every equation of a jaxpr, sub-jaxprs (jit, cond, remat, custom_vjp, ...) included."""
    found = []
    for eqn in jaxpr.eqns:
        found.append(eqn)
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else [value]:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    found += _primitives(inner)
    return found


def test_embedding_lookups_read_the_same_rows_with_the_same_gradients(tiny_variables):
    config = tiny_config()
    ids = jnp.asarray(np.random.default_rng(5).integers(0, 7, size=(3, 9)), jnp.int32)
    weights = jnp.asarray(np.random.default_rng(6).standard_normal((3, 9, 64)), jnp.float32)
    gather = Embed(7, None, config, lookup="gather")
    one_hot = Embed(7, None, config, lookup="one_hot")
    params = nn.meta.unbox(jax.jit(gather.init)(jax.random.key(0), ids))

    def objective(module, p):
        return jnp.sum(module.apply(p, ids) * weights)

    np.testing.assert_array_equal(
        jax.jit(one_hot.apply)(params, ids), jax.jit(gather.apply)(params, ids)
    )
    with pytest.raises(ValueError, match="one_hot"):
        Embed(7, None, config, lookup="onehot").init(jax.random.key(0), ids)
    np.testing.assert_allclose(
        jax.jit(jax.grad(lambda p: objective(one_hot, p)))(params)["params"]["embedding"],
        jax.jit(jax.grad(lambda p: objective(gather, p)))(params)["params"]["embedding"],
        rtol=1e-6,
        atol=1e-6,
    )

    # Without ids: rows 0..length-1 for every row of the batch, the same as explicit ids.
    batch = random_batch(np.random.default_rng(7), 3, 16, 4, config.vocab_size)
    model = BertModel(config)
    inputs = {k: batch[k] for k in ("input_ids", "input_mask", "segment_ids")}
    params = {"params": tiny_variables["params"]["bert"]}  # BertForPreTraining's encoder
    explicit = np.broadcast_to(np.arange(16, dtype=np.int32), (3, 16))

    def pooled(p, **extra):
        return jnp.sum(model.apply(p, **inputs, **extra)["pooled_output"])

    value, grads = jax.jit(jax.value_and_grad(pooled))(params)
    value_explicit, grads_explicit = jax.jit(
        jax.value_and_grad(lambda p: pooled(p, position_ids=explicit))
    )(params)
    np.testing.assert_allclose(value, value_explicit, rtol=1e-6)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_explicit)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("packed", [False, True])
def test_bf16_gradients_never_scatter_add_in_bf16(packed, tiny_variables):
    """Embedding gradients accumulate in float32. GPUs run a bf16 scatter-add as
    compare-and-swap loops; where every token updates the same rows (token types, positions)
    those serialize: 75 of 142 ms of a BERT-Base step at batch 256 x 128 on one H100."""
    config = tiny_config(dtype="bfloat16")
    # 3 rows: no batch-shaped array is mistaken for the 2-row token-type table.
    batch = random_batch(np.random.default_rng(8), 3, 16, 4, config.vocab_size)
    if packed:
        batch["position_ids"] = np.tile(np.arange(8, dtype=np.int32), (3, 2))
        batch["packed_segment_ids"] = np.repeat(np.array([[1, 2]], np.int32), 8, axis=1).repeat(
            3, axis=0
        )
    model = BertForPreTraining(config)
    params = tiny_variables["params"]  # float32, as a bfloat16 model's (test above)

    def loss(p):
        sums = trainer.compute_sums(
            p, batch, model, deterministic=False, dropout_rng=jax.random.key(1)
        )
        return losses.pretraining_loss(sums)

    # Scatter-adds into [rows, hidden] tables; the [batch, length, hidden] ones are the
    # gradients of gathering a few positions per row (masked slots), which rarely collide.
    table_scatters = [
        eqn
        for eqn in _primitives(jax.make_jaxpr(jax.grad(loss))(params).jaxpr)
        if "scatter" in eqn.primitive.name and eqn.invars[0].aval.ndim == 2
    ]
    assert table_scatters, "the word-embedding gradient is a scatter-add"
    for eqn in table_scatters:
        assert eqn.invars[0].aval.dtype == jnp.float32, eqn
    # Token types (every token reads one of two rows) and default positions take no scatter.
    rows = {int(eqn.invars[0].aval.shape[0]) for eqn in table_scatters}
    assert config.type_vocab_size not in rows
    assert (config.max_position_embeddings in rows) == packed


def test_padded_vocabulary_computes_what_the_unpadded_model_does():
    """Padding rows (init zero, logits cut off): same outputs, losses and gradients; the padding
    rows' gradients are exactly zero, so AdamW with weight decay leaves them at zero."""
    # One layer: the padding concerns the embeddings and the heads only.
    config = tiny_config(vocab_size=300, num_hidden_layers=1)
    padded_config = config.replace(vocab_pad_multiple=128)
    assert padded_config.padded_vocab_size == 384
    batch = random_batch(np.random.default_rng(7), 4, 32, 6, config.vocab_size)
    inputs = trainer.model_inputs(batch)
    model, padded_model = BertForPreTraining(config), BertForPreTraining(padded_config)

    fresh = _init(padded_model, inputs, seed=3)["params"]
    fresh_table = fresh["bert"]["embeddings"]["word_embeddings"]["embedding"]
    assert fresh_table.shape == (384, config.hidden_size)
    assert not np.any(fresh_table[300:]) and np.all(np.std(fresh_table[:300], axis=1) > 0)
    assert fresh["predictions"]["output_bias"].shape == (384,)

    # The unpadded model's parameters: the fresh ones cut to 300 rows (one init compiled, not two).
    params = mapping.repad_vocab(jax.device_get(fresh), config)
    assert params["bert"]["embeddings"]["word_embeddings"]["embedding"].shape == (300, 64)
    # Nonzero biases, so that a padding column leaking into the softmax would show.
    params["predictions"]["output_bias"] = jnp.linspace(-1.0, 1.0, config.vocab_size)
    padded = mapping.repad_vocab(jax.device_get(params), padded_config)

    def run(m, p):
        """Outputs, loss and gradients: one compiled program per model."""

        def loss(p):
            return losses.pretraining_loss(trainer.compute_sums(p, batch, m, deterministic=True))

        return jax.jit(lambda p: (m.apply({"params": p}, **inputs), jax.value_and_grad(loss)(p)))(p)

    out, (loss, grads) = run(model, params)
    out_padded, (loss_padded, grads_padded) = run(padded_model, padded)
    assert out_padded["mlm_logits"].shape == out["mlm_logits"].shape == (4, 6, 300)
    assert "mlm_logits_padded" not in out
    full = np.asarray(out_padded["mlm_logits_padded"])
    assert full.shape == (4, 6, 384) and np.all(full[..., 300:] == np.finfo(np.float32).min)
    np.testing.assert_array_equal(full[..., :300], out_padded["mlm_logits"])
    for key in ("mlm_logits", "nsp_logits", "pooled_output"):
        np.testing.assert_allclose(out_padded[key], out[key], atol=1e-5, err_msg=key)

    np.testing.assert_allclose(loss_padded, loss, rtol=1e-6)
    want = mapping.repad_vocab(jax.device_get(grads), padded_config)
    for path, g in jax.tree_util.tree_leaves_with_path(grads_padded):
        np.testing.assert_allclose(g, _at(want, path), rtol=1e-4, atol=1e-7, err_msg=str(path))
    table_grad = grads_padded["bert"]["embeddings"]["word_embeddings"]["embedding"]
    assert not np.any(table_grad[300:])
    assert not np.any(grads_padded["predictions"]["output_bias"][300:])


def test_vocabulary_padding_is_checked_and_round_trips_through_conversion():
    with pytest.raises(ValueError, match="vocab_pad_multiple"):
        BertConfig(vocab_pad_multiple=0)
    assert BertConfig().padded_vocab_size == 30522
    assert BertConfig(vocab_pad_multiple=128).padded_vocab_size == 30592 == 239 * 128
    assert BertConfig(vocab_size=256, vocab_pad_multiple=128).padded_vocab_size == 256

    config = tiny_config(vocab_size=300, vocab_pad_multiple=64)
    hf_model = _hf_pretraining_model(config.replace(vocab_pad_multiple=1), seed=2)
    state_dict = hf_model.state_dict()
    params = hf_convert.params_from_hf(state_dict, config)
    table = params["bert"]["embeddings"]["word_embeddings"]["embedding"]
    assert table.shape == (320, config.hidden_size) and not np.any(table[300:])
    np.testing.assert_array_equal(
        table[:300], state_dict["bert.embeddings.word_embeddings.weight"].numpy()
    )
    assert params["predictions"]["output_bias"].shape == (320,)
    exported = hf_convert.hf_state_dict_from(params, config)
    for key, value in state_dict.items():
        if key in exported:
            np.testing.assert_array_equal(exported[key], value.numpy(), err_msg=key)
    assert exported["cls.predictions.bias"].shape == (300,)
