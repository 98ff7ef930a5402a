"""flops: the FLOPs formula checked by XLA's cost analysis, the chips' peaks by device kind."""

from __future__ import annotations

import flax.linen as nn
import jax
import pytest

from bert_jax.core import trainer
from bert_jax.core.model import BertConfig, BertForPreTraining
from bert_jax.training import flops


@pytest.mark.parametrize("sparse_last_layer", [False, True])
def test_flops_per_token_matches_xla_cost_analysis(sparse_last_layer):
    """The formula against XLA's own count of the compiled forward + backward.

    XLA counts every operation; the formula counts the matrix multiplies only (the MFU
    convention). What it leaves out (LayerNorm, GELU, softmax, bias adds, the loss, the pooler
    and NSP head) is 4.5% of XLA's count at this size (hidden 128, length 128) and shrinks as the
    hidden size grows. So XLA's count must lie between the formula and 6% above it: a missing or
    doubled term would leave that band (the MLM head's d x V term is 5% here, attention 13%).
    """
    d, seq_len, predictions, batch_size = 128, 128, 20, 4
    config = BertConfig(
        vocab_size=1024,
        hidden_size=d,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=4 * d,
        max_position_embeddings=seq_len,
        vocab_pad_multiple=1,
        sparse_last_layer=sparse_last_layer,
    )
    model = BertForPreTraining(config)
    batch = trainer.dummy_batch(batch_size, seq_len, predictions)
    params = jax.eval_shape(
        lambda: nn.meta.unbox(
            model.init(jax.random.key(0), **trainer.model_inputs(batch), deterministic=True)
        )
    )["params"]

    def loss(params, batch):
        sums = trainer.compute_sums(params, batch, model, deterministic=True)
        return sums["mlm_loss_sum"] + sums["nsp_loss_sum"]

    compiled = jax.jit(jax.grad(loss)).lower(params, batch).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    xla_per_token = cost["flops"] / (batch_size * seq_len)
    # A sparse last layer runs at the masked positions and [CLS] only.
    last_layer = (predictions + 1) / seq_len if sparse_last_layer else 1.0
    formula = flops.flops_per_token(config, seq_len, predictions / seq_len, last_layer)
    assert formula <= xla_per_token <= 1.06 * formula, xla_per_token / formula


def test_peak_flops_by_device_kind():
    assert flops.peak_flops_per_chip("TPU v5 lite") == 197e12
    assert flops.peak_flops_per_chip("TPU v5") == 459e12  # v5p's device kind
    assert flops.peak_flops_per_chip("TPU v6 lite") == 918e12
    assert flops.peak_flops_per_chip("TPU v4") == 275e12
    assert flops.peak_flops_per_chip("NVIDIA H100 80GB HBM3") == 989e12
    assert flops.peak_flops_per_chip("cpu") is None


def test_modernbert_flops_per_token_is_the_hand_count():
    """ModernBERT's formula against a count by hand: base's shapes at length 1024, 22 layers of
    which 8 global (every third from the first) and 14 with the 128-token window."""
    from bert_jax.core.modernbert_config import ModernBertConfig

    config = ModernBertConfig()  # base: d 768, GeGLU 1152, vocab 50368
    d, f, s, vocab, share = 768, 1152, 1024, 50368, 0.3
    dense = 22 * 6 * (4 * d * d + 3 * d * f)  # Wqkv, Wo; GeGLU's Wi (two wide) and Wo
    # A sliding-window query sees the 64 positions on each side: 129 keys, fewer near the edges
    # (the first and last 64 positions lose 64 - i keys each: 64 * 65 / 2 per edge).
    local = (s * 129 - 2 * (64 * 65 // 2)) / s
    attention = 12 * d * (8 * s + 14 * local)
    head = 6 * share * (d * d + d * vocab)
    assert flops.flops_per_token(config, s, share) == pytest.approx(dense + attention + head)
    # Every layer global: the attention term is BERT's, 12 L s d.
    every = config.replace(global_attn_every_n_layers=1)
    expected = dense + 12 * 22 * s * d + head
    assert flops.flops_per_token(every, s, share) == pytest.approx(expected)
    # A row no longer than half the window: every key is in it.
    assert flops.window_keys(50, 128) == 50
