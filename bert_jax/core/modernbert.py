"""ModernBERT (Warner et al., 2024) as Flax Linen modules, beside BERT's `model.py` and built from
the same pieces: `layers.py` (Dense, Embed, LayerNorm, initializers), `attend.py` (attention by
its configured implementation), `dropout.py`, and `model.py`'s masks and vocabulary bias.

Each layer is pre-LayerNorm: `x + attn(norm(x))`, then `x + mlp(norm(x))` (layer 0 reads the
embeddings' norm directly, as transformers' ModernBERT does); the feed-forward is a GeGLU
(`act(x Wi_in) * (x Wi_gate)`, then Wo); queries and keys turn by rotary positions, with base
`global_rope_theta` in global layers and `local_rope_theta` in sliding-window ones, where a token
sees the tokens `local_attention // 2` positions away or less (on long rows computed in blocks:
`local_attention.py`). Biases exist only as the config says. Packed rows are as BERT's
(`packed_segment_ids` keep attention within an instance, `position_ids` restart at each
instance); padding keys are hidden by `input_mask`.

Parameter tree (Flax names; `convert/modernbert_names.py` maps them to transformers'
ModernBertForMaskedLM; "(bias)": only where the config has biases):

    model/embeddings/tok_embeddings/embedding [V, D], model/embeddings/norm/{scale,(bias)}
    model/layers_{i}/attn_norm/{scale,(bias)}                         (i > 0)
    model/layers_{i}/attn/Wqkv/{kernel [D, 3, H, K], (bias) [3, H, K]}
    model/layers_{i}/attn/Wo/{kernel [H, K, D], (bias) [D]}
    model/layers_{i}/mlp_norm/{scale,(bias)}
    model/layers_{i}/mlp/Wi/{kernel [D, 2, F], (bias) [2, F]}        (input, gate)
    model/layers_{i}/mlp/Wo/{kernel [F, D], (bias) [D]}
    model/final_norm/{scale,(bias)}
    head/dense/{kernel [D, D], (bias)}, head/norm/{scale,(bias)}
    decoder_bias [V]                            (decoder weights tied to tok_embeddings)
"""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.core import local_attention, shared_layers
from bert_jax.core.attend import attend
from bert_jax.core.bert_config import ACTIVATIONS, REMAT_POLICIES
from bert_jax.core.dropout import Dropout
from bert_jax.core.layers import Embed, dense, gathered_table, layer_norm, zeros
from bert_jax.core.model import attention_mask, gather_positions, vocab_bias
from bert_jax.core.modernbert_config import GLOBAL, SLIDING, ModernBertConfig

Array = jax.Array


def norm(config: ModernBertConfig, name: str) -> nn.LayerNorm:
    return layer_norm(config, name, epsilon=config.norm_eps, use_bias=config.norm_bias)


def rotary_angles(positions_BxL: Array, head_dim: int, theta: float) -> tuple[Array, Array]:
    """cos and sin [B, L, 1, head_dim] (float32) of the rotary angles position x theta^(-2i/d),
    each frequency twice (the halves `rotate` pairs up)."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    angles = positions_BxL.astype(jnp.float32)[..., None] * inv_freq[None, None, :]
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]
    return jnp.cos(angles), jnp.sin(angles)


def rotate(x_BxLxHxK: Array, cos: Array, sin: Array) -> Array:
    """x turned by the rotary angles: x cos + (-x2, x1) sin, in float32, back in x's dtype."""
    x = x_BxLxHxK.astype(jnp.float32)
    half = x.shape[-1] // 2
    turned = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return (x * cos + turned * sin).astype(x_BxLxHxK.dtype)


def sliding_window(mask_Bx1xQxK: Array, length: int, window: int) -> Array:
    """`mask` where also |q - k| <= window // 2 (row positions: within a packed instance they
    differ as the instance's positions do). The masked full matrix: rows long enough for
    `local_attention.use_bands` take `local_attention.band_mask`, the same mask in blocks."""
    index = jnp.arange(length, dtype=jnp.int32)
    near = jnp.abs(index[:, None] - index[None, :]) <= window // 2
    return jnp.logical_and(mask_Bx1xQxK, near[None, None, :, :])


class ModernBertAttention(nn.Module):
    """Fused Wqkv projection, rotary positions on queries and keys, attention, Wo, dropout."""

    config: ModernBertConfig

    @nn.compact
    def __call__(
        self,
        hidden: Array,
        mask_Bx1xQxK: Array | local_attention.BandMask,
        cos: Array,
        sin: Array,
        deterministic: bool,
    ) -> Array:
        cfg = self.config
        heads, head_dim = cfg.num_attention_heads, cfg.head_dim
        qkv = dense(
            cfg,
            (3, heads, head_dim),
            ("embed", None, "heads", "kv"),
            "Wqkv",
            use_bias=cfg.attention_bias,
        )(hidden)
        query, key, value = (
            nn.with_logical_constraint(qkv[:, :, i], ("batch", "length", "heads", "kv"))
            for i in range(3)
        )
        # A sliding-window layer's band mask says its attention computes in blocks.
        banded = isinstance(mask_Bx1xQxK, local_attention.BandMask)
        context = (local_attention.attend_in_bands if banded else attend)(
            rotate(query, cos, sin),
            rotate(key, cos, sin),
            value,
            mask_Bx1xQxK,
            impl=cfg.attention_impl,
            dropout_rate=cfg.attention_dropout,
            dropout_impl=cfg.dropout_impl,
            deterministic=deterministic,
            dtype=cfg.dtype,
            rate_setting="attention_dropout",
        )
        context = nn.with_logical_constraint(context, ("batch", "length", "heads", "kv"))
        out = dense(
            cfg,
            cfg.hidden_size,
            ("heads", "kv", "embed"),
            "Wo",
            num_input_axes=2,
            use_bias=cfg.attention_bias,
            init_std=cfg.out_init_std,
        )(context)
        return Dropout(cfg.attention_dropout, cfg.dropout_impl, name="out_drop")(out, deterministic)


class ModernBertMLP(nn.Module):
    """GeGLU: Wi makes an input and its gate; act(input) x gate, dropout, Wo."""

    config: ModernBertConfig

    @nn.compact
    def __call__(self, hidden: Array, deterministic: bool) -> Array:
        cfg = self.config
        both = dense(
            cfg,
            (2, cfg.intermediate_size),
            ("embed", None, "mlp"),
            "Wi",
            use_bias=cfg.mlp_bias,
        )(hidden)
        inner = ACTIVATIONS[cfg.hidden_activation](both[..., 0, :]) * both[..., 1, :]
        inner = nn.with_logical_constraint(inner, ("batch", "length", "mlp"))
        inner = Dropout(cfg.mlp_dropout, cfg.dropout_impl, name="drop")(inner, deterministic)
        return dense(
            cfg,
            cfg.hidden_size,
            ("mlp", "embed"),
            "Wo",
            use_bias=cfg.mlp_bias,
            init_std=cfg.out_init_std,
        )(inner)


class ModernBertLayer(nn.Module):
    """One pre-LN block: x + attn(attn_norm(x)), then x + mlp(mlp_norm(x)). `first`: layer 0,
    whose input is the embeddings' norm already (transformers: an Identity there)."""

    config: ModernBertConfig
    first: bool
    # Where the layer draws dropout (path within the layer -> draws a step), as
    # `model.BertLayer.DROPOUT_SITES`: attention's probabilities and output, the MLP's.
    DROPOUT_SITES: ClassVar[dict[tuple[str, ...], int]] = {
        ("attn", "Dropout_0"): 1,
        ("attn", "out_drop"): 1,
        ("mlp", "drop"): 1,
    }

    @nn.compact
    def __call__(
        self,
        hidden: Array,
        mask_Bx1xQxK: Array | local_attention.BandMask,
        cos: Array,
        sin: Array,
        deterministic: bool,
    ) -> Array:
        cfg = self.config
        normed = hidden if self.first else norm(cfg, "attn_norm")(hidden)
        attention = ModernBertAttention(cfg, name="attn")
        hidden = hidden + attention(normed, mask_Bx1xQxK, cos, sin, deterministic)
        hidden = hidden + ModernBertMLP(cfg, name="mlp")(
            norm(cfg, "mlp_norm")(hidden), deterministic
        )
        return nn.with_logical_constraint(hidden, ("batch", "length", "embed"))


class ModernBertEmbeddings(nn.Module):
    """Token embeddings, norm, dropout (positions are rotary, in attention)."""

    config: ModernBertConfig

    @nn.compact
    def __call__(self, input_ids: Array, deterministic: bool) -> Array:
        cfg = self.config
        words = Embed(
            cfg.padded_vocab_size, "vocab", cfg, used_rows=cfg.vocab_size, name="tok_embeddings"
        )(input_ids)
        hidden = norm(cfg, "norm")(words)
        hidden = Dropout(cfg.embedding_dropout, cfg.dropout_impl, name="drop")(
            hidden, deterministic
        )
        return nn.with_logical_constraint(hidden, ("batch", "length", "embed"))


class ModernBertModel(nn.Module):
    """Embeddings, the layers (global or sliding-window attention each), the final norm.

    Returns `sequence_output` [B, L, D] and `hidden_states` (the embeddings' output, then each
    layer's; the last one before the final norm)."""

    config: ModernBertConfig

    @nn.compact
    def __call__(
        self,
        input_ids: Array,
        input_mask: Array,
        position_ids: Array | None = None,
        packed_segment_ids: Array | None = None,
        deterministic: bool = True,
    ) -> dict[str, Array]:
        cfg = self.config
        length = input_ids.shape[1]
        hidden = ModernBertEmbeddings(cfg, name="embeddings")(input_ids, deterministic)
        if position_ids is None:
            position_ids = jnp.arange(length, dtype=jnp.int32)[None, :]
        global_mask = attention_mask(input_mask, packed_segment_ids)
        by_type = {
            GLOBAL: (global_mask, *rotary_angles(position_ids, cfg.head_dim, cfg.global_rope_theta))
        }
        if SLIDING in cfg.layer_types:
            if local_attention.use_bands(length, cfg.local_attention):
                local_mask = local_attention.band_mask(
                    input_mask, packed_segment_ids, cfg.local_attention
                )
            else:
                local_mask = sliding_window(global_mask, length, cfg.local_attention)
            local_angles = rotary_angles(position_ids, cfg.head_dim, cfg.local_rope_theta)
            by_type[SLIDING] = (local_mask, *local_angles)
        policy = REMAT_POLICIES[cfg.remat]
        layer_class = ModernBertLayer
        if cfg.remat != "none":
            # `deterministic` (argument 5, counting the module) is a Python bool: static.
            layer_class = nn.remat(ModernBertLayer, policy=policy, static_argnums=(5,))
        dropout_active = not deterministic and (cfg.attention_dropout > 0 or cfg.mlp_dropout > 0)
        all_hidden = [hidden]
        for i, kind in enumerate(cfg.layer_types):
            mask, cos, sin = by_type[kind]
            name = f"layers_{i}"
            # Layers of one kind after the first share a trace (`shared_layers.py`).
            if shared_layers.can_share(
                self, name, dropout_active=dropout_active, dropout_impl=cfg.dropout_impl
            ):
                hidden = shared_layers.apply_shared(
                    self,
                    ModernBertLayer(cfg, i == 0, parent=None),
                    name,
                    hidden,
                    mask,
                    cos,
                    sin,
                    deterministic=deterministic,
                    dropout_sites=ModernBertLayer.DROPOUT_SITES,
                    remat=cfg.remat != "none",
                    remat_policy=policy,
                )
            else:
                layer = layer_class(cfg, i == 0, name=name)
                hidden = layer(hidden, mask, cos, sin, deterministic)
            all_hidden.append(hidden)
        sequence_output = norm(cfg, "final_norm")(hidden)
        sequence_output = nn.with_logical_constraint(sequence_output, ("batch", "length", "embed"))
        return {"sequence_output": sequence_output, "hidden_states": tuple(all_hidden)}


class ModernBertPredictionHead(nn.Module):
    """dense, activation, norm: the MLM head's transform (and the task heads')."""

    config: ModernBertConfig

    @nn.compact
    def __call__(self, hidden: Array) -> Array:
        cfg = self.config
        hidden = dense(
            cfg,
            cfg.hidden_size,
            ("embed", "mlp"),
            "dense",
            use_bias=cfg.classifier_bias,
            init_std=cfg.out_init_std,
        )(hidden)
        return norm(cfg, "norm")(ACTIVATIONS[cfg.classifier_activation](hidden))


class ModernBertForMaskedLM(nn.Module):
    """ModernBERT with its MLM head: the head's transform, then scores against the tied token
    embeddings plus `decoder_bias`.

    Takes the trainer's batch keys (`core/trainer.model_inputs`): `segment_ids` and
    `cls_positions` are accepted and not read (ModernBERT has no token types and no NSP head).
    With `masked_lm_positions` ([B, P]) the head runs only there; without, at every position.
    Returns float32 `mlm_logits` [B, P or L, vocab] (with a padded vocabulary also
    `mlm_logits_padded`, whose padding columns hold the lowest float32 and which the losses
    read), plus `ModernBertModel`'s outputs.
    """

    config: ModernBertConfig

    @nn.compact
    def __call__(
        self,
        input_ids: Array,
        input_mask: Array,
        segment_ids: Array | None = None,
        masked_lm_positions: Array | None = None,
        position_ids: Array | None = None,
        packed_segment_ids: Array | None = None,
        cls_positions: Array | None = None,
        deterministic: bool = True,
    ) -> dict[str, Array]:
        del segment_ids, cls_positions  # the trainer's batch carries them; nothing reads them
        cfg = self.config
        model = ModernBertModel(cfg, name="model")
        outputs = model(
            input_ids,
            input_mask,
            position_ids=position_ids,
            packed_segment_ids=packed_segment_ids,
            deterministic=deterministic,
        )
        picked = outputs["sequence_output"]
        if masked_lm_positions is not None:
            picked = gather_positions(picked, masked_lm_positions)
        picked = ModernBertPredictionHead(cfg, name="head")(picked)
        embedding_VxD = nn.meta.unbox(
            model.variables["params"]["embeddings"]["tok_embeddings"]["embedding"]
        )
        table = jnp.asarray(gathered_table(embedding_VxD, "vocab"), cfg.dtype)
        logits = jnp.einsum("bpd,vd->bpv", picked, table).astype(jnp.float32)
        bias = None
        if cfg.decoder_bias:
            bias = self.param(
                "decoder_bias", zeros(("vocab",)), (cfg.padded_vocab_size,), cfg.param_dtype
            )
        logits = logits + vocab_bias(bias, cfg)[None, None, :]
        logits = nn.with_logical_constraint(logits, ("batch", None, "vocab"))
        outputs["mlm_logits"] = logits[..., : cfg.vocab_size]
        if cfg.padded_vocab_size != cfg.vocab_size:
            outputs["mlm_logits_padded"] = logits
        return outputs
