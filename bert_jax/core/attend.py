"""Attention by the configured implementation: `attend(query, key, value, mask, ...)`, the one call
every encoder's self-attention makes after its projections (BERT's, ModernBERT's).

The implementations (`bert_config.ATTENTION_IMPLEMENTATIONS`):
- "xla": explicit einsums, softmax in float32, attention-probability dropout (`dropout.py`);
- "dot_product": `jax.nn.dot_product_attention` with XLA's implementation (no dropout);
- "cudnn": the same through cuDNN's fused kernel (GPU only; no dropout);
- "pallas": our fused kernel (`attention.py`), hash dropout in-kernel, the einsum path's masks
  and results; GPU only, elsewhere the einsum path (one log line);
- "auto": "dot_product" whenever attention dropout is inactive, "xla" otherwise.

Called inside a Linen module's compact method: the dropout it draws belongs to that module (as
`Dropout_0`, the same key on every path, so "pallas" drops exactly what "xla" drops).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from bert_jax.core import attention as attention_lib
from bert_jax.core.dropout import Dropout
from bert_jax.runtime.errors import UserError

Array = jax.Array


def attend(
    query_BxQxHxK: Array,
    key_BxKxHxK: Array,
    value_BxKxHxK: Array,
    mask_Bx1xQxK: Array,
    *,
    impl: str,
    dropout_rate: float,
    dropout_impl: str,
    deterministic: bool,
    dtype: str,
    rate_setting: str = "attention_probs_dropout_prob",
) -> Array:
    """softmax(q k^T / sqrt(head_dim), masked) v, [B, Q, H, K], with dropout on the
    probabilities at `dropout_rate` unless `deterministic`. `rate_setting` names the setting
    that set the rate, for the message of an implementation that cannot drop."""
    head_dim = query_BxQxHxK.shape[-1]
    dropout_active = not deterministic and dropout_rate > 0.0
    requested = impl
    if impl == "auto":
        impl = "xla" if dropout_active else "dot_product"
    mode = attention_lib.pallas_mode() if impl == "pallas" else None
    if impl == "pallas" and mode is None:
        attention_lib.log_fallback_once(jax.default_backend())
        impl = "xla"
    if impl == "pallas" and dropout_active and dropout_impl != "hash":
        raise UserError(
            "attention_impl='pallas' computes attention dropout with the hash "
            f"(dropout_impl='hash'), not {dropout_impl!r}"
        )
    if impl == "pallas":
        rate = dropout_rate if dropout_active else 0.0
        # Named as the einsum path's Dropout, so it draws the same key: same dropped elements.
        words = Dropout(rate, name="Dropout_0").key_words() if rate else None
        return attention_lib.flash_attention(
            query_BxQxHxK,
            key_BxKxHxK,
            value_BxKxHxK,
            mask_Bx1xQxK,
            dropout_rate=rate,
            dropout_words=words,
            interpret=mode == "interpret",
        )
    if impl in ("dot_product", "cudnn"):
        if dropout_active:
            raise UserError(
                f"attention_impl={requested!r} cannot apply attention-probability dropout "
                f"({rate_setting}={dropout_rate}); use 'auto', 'xla' or 'pallas', or set the "
                "dropout to 0"
            )
        if impl == "cudnn":
            # cuDNN takes the mask as a bias of the full [batch, 1, q, k] shape.
            mask_Bx1xQxK = jnp.broadcast_to(
                mask_Bx1xQxK,
                (mask_Bx1xQxK.shape[0], 1, query_BxQxHxK.shape[1], key_BxKxHxK.shape[1]),
            )
        return jax.nn.dot_product_attention(
            query_BxQxHxK,
            key_BxKxHxK,
            value_BxKxHxK,
            mask=mask_Bx1xQxK,
            implementation="cudnn" if impl == "cudnn" else "xla",
        )
    logits_BxHxQxK = jnp.einsum("bqhd,bkhd->bhqk", query_BxQxHxK, key_BxKxHxK).astype(jnp.float32)
    logits_BxHxQxK = logits_BxHxQxK / jnp.sqrt(jnp.float32(head_dim))
    big_neg = jnp.finfo(jnp.float32).min
    logits_BxHxQxK = jnp.where(mask_Bx1xQxK, logits_BxHxQxK, big_neg)
    probs = jax.nn.softmax(logits_BxHxQxK, axis=-1).astype(dtype)
    probs = Dropout(dropout_rate, dropout_impl)(probs, deterministic=deterministic)
    return jnp.einsum("bhqk,bkhd->bqhd", probs, value_BxKxHxK)
