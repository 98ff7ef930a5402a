"""BERT (Devlin et al., 2018) as pure-functional Flax Linen modules.

The encoder is post-LayerNorm: every sub-layer computes `LayerNorm(x + Dropout(sublayer(x)))`.
Parameters carry logical axis names (`vocab, embed, mlp, heads, kv`) and activations are constrained
with (`batch, length, embed`) at block boundaries; which mesh axes those names land on is decided by
the rules in the config (see `partitioning.py`), never here.

Parameter tree (Flax names; `convert/` maps them to Hugging Face and Google TF1 names):

    bert/embeddings/{word_embeddings,position_embeddings,token_type_embeddings}/embedding
    bert/embeddings/LayerNorm/{scale,bias}
    bert/encoder/layer_{i}/attention/{query,key,value}/{kernel [D,H,K], bias [H,K]}
    bert/encoder/layer_{i}/attention/output/{kernel [H,K,D], bias [D]}
    bert/encoder/layer_{i}/attention_output_LayerNorm/{scale,bias}
    bert/encoder/layer_{i}/intermediate/{kernel [D,F], bias [F]}
    bert/encoder/layer_{i}/output/{kernel [F,D], bias [D]}
    bert/encoder/layer_{i}/output_LayerNorm/{scale,bias}
    bert/pooler/{kernel,bias}
    predictions/transform/{kernel,bias}, predictions/transform_LayerNorm/{scale,bias},
    predictions/output_bias [V]                      (decoder weights tied to word_embeddings)
    seq_relationship/{kernel [D,2], bias [2]}

The config is `bert_config.py`, the building blocks (initializers, Dense, Embed, the
embeddings) `layers.py`, attention by its configured implementation `attend.py`; this file is
the forward pass from attention up, read against the paper's section 3.
"""

from __future__ import annotations

from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.core import shared_layers
from bert_jax.core.attend import attend
from bert_jax.core.bert_config import ACTIVATIONS, REMAT_POLICIES, BertConfig
from bert_jax.core.dropout import Dropout
from bert_jax.core.layers import (
    BertEmbeddings,
    dense,
    gathered_table,
    layer_norm,
    zeros,
)

Array = jax.Array
DType = Any


def attention_mask(
    input_mask: Array,
    packed_segment_ids: Array | None = None,
    query_positions: Array | None = None,
    causal: bool = False,
) -> Array:
    """[batch, 1, q, k] boolean mask: True where query q may attend to key k.

    Keys that are padding are hidden. With `packed_segment_ids` ([batch, length], one id per
    instance packed into the row), queries see only keys of their own instance. Queries are all
    positions, or those at `query_positions` ([batch, q]). Without packing the mask does not
    depend on the query and its q axis has size 1.
    """
    keep = input_mask.astype(bool)[:, None, None, :]
    if packed_segment_ids is not None:
        query_ids = packed_segment_ids
        if query_positions is not None:
            query_ids = jnp.take_along_axis(
                packed_segment_ids, query_positions.astype(jnp.int32), axis=1
            )
        same = query_ids[:, :, None] == packed_segment_ids[:, None, :]
        keep = jnp.logical_and(keep, same[:, None, :, :])
    if causal:  # a query sees its own and earlier positions only
        length = input_mask.shape[1]
        queries = (
            jnp.arange(length, dtype=jnp.int32)[None, :]
            if query_positions is None
            else query_positions.astype(jnp.int32)
        )
        earlier = jnp.arange(length, dtype=jnp.int32)[None, None, :] <= queries[:, :, None]
        keep = jnp.logical_and(keep, earlier[:, None, :, :])
    return keep


def last_token_positions(input_mask: Array) -> Array:
    """[batch, 1]: the position of each row's last real token (what a causal model's sentence
    heads read: under a causal mask [CLS] at position 0 has seen nothing of the sentence)."""
    last = jnp.sum(input_mask.astype(jnp.int32), axis=1, keepdims=True) - 1
    return jnp.maximum(last, 0)


class BertSelfAttention(nn.Module):
    """Multi-head self-attention. Queries come from `query_hidden` when given (a subset of the
    positions, [batch, q, hidden]), keys and values always from every position of `hidden`."""

    config: BertConfig

    @nn.compact
    def __call__(
        self,
        hidden: Array,
        mask_Bx1xQxK: Array,
        deterministic: bool,
        query_hidden: Array | None = None,
    ) -> Array:
        cfg = self.config
        heads, head_dim = cfg.num_attention_heads, cfg.head_dim
        qkv_axes = ("embed", "heads", "kv")
        query_input = hidden if query_hidden is None else query_hidden
        query = dense(cfg, (heads, head_dim), qkv_axes, "query")(query_input)
        key = dense(cfg, (heads, head_dim), qkv_axes, "key")(hidden)
        value = dense(cfg, (heads, head_dim), qkv_axes, "value")(hidden)

        context = attend(
            query,
            key,
            value,
            mask_Bx1xQxK,
            impl=cfg.attention_impl,
            dropout_rate=cfg.attention_probs_dropout_prob,
            dropout_impl=cfg.dropout_impl,
            deterministic=deterministic,
            dtype=cfg.dtype,
        )
        # A subset of positions is not a `length` axis: it stays whole wherever `length` goes.
        length = "length" if query_hidden is None else None
        context = nn.with_logical_constraint(context, ("batch", length, "heads", "kv"))
        return dense(cfg, cfg.hidden_size, ("heads", "kv", "embed"), "output", num_input_axes=2)(
            context
        )


class BertLayer(nn.Module):
    """One post-LN Transformer block: attention -> add & norm -> GELU FFN -> add & norm.

    With `query_positions` ([batch, q]) the block is computed only at those positions (their
    queries attend to every key), and returns [batch, q, hidden]; `mask_Bx1xQxK` then has q rows.
    """

    config: BertConfig
    # Where the layer draws dropout (path within the layer -> draws a step): the hidden
    # dropout after attention and after the FFN, the probabilities' in attention
    # (`shared_layers.py` gives each layer its own masks by these).
    DROPOUT_SITES: ClassVar[dict[tuple[str, ...], int]] = {
        ("Dropout_0",): 2,
        ("attention", "Dropout_0"): 1,
    }

    @nn.compact
    def __call__(
        self,
        hidden: Array,
        mask_Bx1xQxK: Array,
        deterministic: bool,
        query_positions: Array | None = None,
    ) -> Array:
        cfg = self.config
        dropout = Dropout(cfg.hidden_dropout_prob, cfg.dropout_impl)
        length = "length"
        residual = hidden
        if query_positions is not None:
            residual = gather_positions(hidden, query_positions)
            length = None
        attention = BertSelfAttention(cfg, name="attention")
        attended = attention(
            hidden,
            mask_Bx1xQxK,
            deterministic,
            query_hidden=None if query_positions is None else residual,
        )
        attended = dropout(attended, deterministic=deterministic)
        hidden = layer_norm(cfg, "attention_output_LayerNorm")(residual + attended)
        hidden = nn.with_logical_constraint(hidden, ("batch", length, "embed"))

        inner = dense(cfg, cfg.intermediate_size, ("embed", "mlp"), "intermediate")(hidden)
        inner = ACTIVATIONS[cfg.hidden_act](inner)
        inner = nn.with_logical_constraint(inner, ("batch", length, "mlp"))
        out = dense(cfg, cfg.hidden_size, ("mlp", "embed"), "output")(inner)
        out = dropout(out, deterministic=deterministic)
        hidden = layer_norm(cfg, "output_LayerNorm")(hidden + out)
        return nn.with_logical_constraint(hidden, ("batch", length, "embed"))


class BertEncoder(nn.Module):
    config: BertConfig

    @nn.compact
    def __call__(
        self,
        hidden: Array,
        mask_Bx1xQxK: Array,
        deterministic: bool,
        last_layer_positions: Array | None = None,
        last_layer_mask: Array | None = None,
    ) -> tuple[Array, tuple[Array, ...]]:
        """Returns the last hidden state and all hidden states (embeddings first).

        With `last_layer_positions` ([batch, q]; `last_layer_mask` holds its q query rows) the
        last layer runs only at those positions and its output is [batch, q, hidden].
        """
        cfg = self.config
        all_hidden = [hidden]
        last = cfg.num_hidden_layers - 1
        policy = REMAT_POLICIES[cfg.remat]
        layer_class = BertLayer
        if cfg.remat != "none":
            # `deterministic` (argument 3, counting the module) is a Python bool: static.
            layer_class = nn.remat(BertLayer, policy=policy, static_argnums=(3,))
        dropout_active = not deterministic and (
            cfg.hidden_dropout_prob > 0 or cfg.attention_probs_dropout_prob > 0
        )
        for i in range(cfg.num_hidden_layers):
            name = f"layer_{i}"
            mask, positions = mask_Bx1xQxK, None
            if i == last and last_layer_positions is not None:
                mask, positions = last_layer_mask, last_layer_positions
            if shared_layers.can_share(
                self, name, dropout_active=dropout_active, dropout_impl=cfg.dropout_impl
            ):
                hidden = shared_layers.apply_shared(
                    self,
                    BertLayer(cfg, parent=None),
                    name,
                    hidden,
                    mask,
                    deterministic=deterministic,
                    query_positions=positions,
                    dropout_sites=BertLayer.DROPOUT_SITES,
                    remat=cfg.remat != "none",
                    remat_policy=policy,
                )
            else:
                hidden = layer_class(cfg, name=name)(hidden, mask, deterministic, positions)
            all_hidden.append(hidden)
        return hidden, tuple(all_hidden)


class BertModel(nn.Module):
    """Embeddings + encoder + tanh pooler on [CLS]. Outputs a dict of arrays.

    `cls_positions` ([batch, n]) pools several [CLS] tokens per row (packed instances); without it
    the pooler reads position 0 and `pooled_output` is [batch, hidden].

    `output_positions` ([batch, p]) computes the last layer only at those positions (and at the
    [CLS] positions the pooler reads): `sequence_output`, and the last of `hidden_states`, are
    then [batch, p, hidden], the states at `output_positions` in order.
    """

    config: BertConfig
    add_pooler: bool = True

    @nn.compact
    def __call__(
        self,
        input_ids: Array,
        input_mask: Array,
        segment_ids: Array,
        position_ids: Array | None = None,
        packed_segment_ids: Array | None = None,
        cls_positions: Array | None = None,
        deterministic: bool = True,
        output_positions: Array | None = None,
    ) -> dict[str, Array]:
        cfg = self.config
        hidden = BertEmbeddings(cfg, name="embeddings")(
            input_ids, segment_ids, position_ids, deterministic
        )
        causal = cfg.is_decoder
        mask = attention_mask(input_mask, packed_segment_ids, causal=causal)
        # Where the pooler reads: [CLS] at 0, each packed instance's [CLS], or under a causal
        # mask the last real token (the only one that has seen the whole input).
        single = cls_positions is None
        pool_positions = cls_positions
        if single:
            pool_positions = (
                last_token_positions(input_mask)
                if causal
                else jnp.zeros((input_ids.shape[0], 1), jnp.int32)
            )
        encoder = BertEncoder(cfg, name="encoder")
        if output_positions is None:
            sequence_output, hidden_states = encoder(hidden, mask, deterministic)
        else:
            # The last layer at the requested positions, then where the pooler reads.
            num_outputs = output_positions.shape[1]
            queries = output_positions.astype(jnp.int32)
            if self.add_pooler:
                queries = jnp.concatenate([queries, pool_positions.astype(jnp.int32)], axis=1)
            last, hidden_states = encoder(
                hidden,
                mask,
                deterministic,
                last_layer_positions=queries,
                last_layer_mask=attention_mask(
                    input_mask, packed_segment_ids, queries, causal=causal
                ),
            )
            sequence_output = last[:, :num_outputs]
            hidden_states = (*hidden_states[:-1], sequence_output)
        outputs = {"sequence_output": sequence_output, "hidden_states": hidden_states}
        if self.add_pooler:
            if output_positions is not None:
                first = last[:, num_outputs:]
            elif single and not causal:
                first = sequence_output[:, :1]
            else:
                first = gather_positions(sequence_output, pool_positions)
            first = first[:, 0] if single else first
            pooled = dense(cfg, cfg.hidden_size, ("embed", "mlp"), "pooler")(first)
            outputs["pooled_output"] = jnp.tanh(pooled)
        return outputs


def gather_positions(sequence_BxLxD: Array, positions_BxP: Array) -> Array:
    """Picks the hidden states at `positions` for every row: [B, L, D], [B, P] -> [B, P, D]."""
    return jnp.take_along_axis(sequence_BxLxD, positions_BxP[..., None].astype(jnp.int32), axis=1)


class BertMLMHead(nn.Module):
    """Dense + GELU + LayerNorm, then scores against the tied word embeddings plus a bias."""

    config: BertConfig

    @nn.compact
    def __call__(self, hidden_BxPxD: Array, embedding_VxD: Array) -> Array:
        cfg = self.config
        hidden = dense(cfg, cfg.hidden_size, ("embed", "mlp"), "transform")(hidden_BxPxD)
        hidden = ACTIVATIONS[cfg.hidden_act](hidden)
        hidden = layer_norm(cfg, "transform_LayerNorm")(hidden)
        logits = jnp.einsum("bpd,vd->bpv", hidden, jnp.asarray(embedding_VxD, cfg.dtype))
        output_bias = self.param(
            "output_bias", zeros(("vocab",)), (cfg.padded_vocab_size,), cfg.param_dtype
        )
        logits = logits.astype(jnp.float32) + vocab_bias(output_bias, cfg)[None, None, :]
        return nn.with_logical_constraint(logits, ("batch", None, "vocab"))


def vocab_bias(output_bias: Array | None, config: Any) -> Array:
    """The float32 bias an MLM decoder adds to its [.., padded_vocab_size] logits: its own
    (None: zeros), plus the lowest float at the vocabulary padding's columns.

    exp() of those columns is 0, so a softmax over all columns is the unpadded one and its
    gradient there is exactly 0 (to the padding rows and bias entries). An added constant has
    no backward op of its own; a select added a pass over the logits' gradient (seen in
    XLA:CPU's HLO)."""
    padded = config.padded_vocab_size
    if output_bias is None:
        bias = jnp.zeros((padded,), jnp.float32)
    else:
        bias = output_bias.astype(jnp.float32)
    if padded != config.vocab_size:
        real = jnp.arange(padded) < config.vocab_size
        bias = bias + jnp.where(real, 0.0, jnp.finfo(jnp.float32).min)
    return bias


class BertForPreTraining(nn.Module):
    """BERT with the masked-LM head (tied decoder, only at `masked_lm_positions`) and NSP head.

    Returns float32 `mlm_logits` [batch, predictions, vocab] (and, with a padded vocabulary,
    `mlm_logits_padded` [batch, predictions, padded_vocab_size], whose padding columns hold the
    lowest float32 and which the losses read) and `nsp_logits` ([batch, 2], or
    [batch, n, 2] with `cls_positions`), plus the outputs of `BertModel`: with
    `config.sparse_last_layer` the last layer runs only where the heads read, and
    `sequence_output` is [batch, predictions, hidden] (the states at `masked_lm_positions`).
    Every objective (`config.objective`) has this one tree; for "ltr" the encoder is causal and
    `masked_lm_positions` are every position (train.objective_batch), the head a next-token head.
    """

    config: BertConfig

    @nn.compact
    def __call__(
        self,
        input_ids: Array,
        input_mask: Array,
        segment_ids: Array,
        masked_lm_positions: Array,
        position_ids: Array | None = None,
        packed_segment_ids: Array | None = None,
        cls_positions: Array | None = None,
        deterministic: bool = True,
    ) -> dict[str, Array]:
        cfg = self.config
        bert = BertModel(cfg, name="bert")
        outputs = bert(
            input_ids,
            input_mask,
            segment_ids,
            position_ids=position_ids,
            packed_segment_ids=packed_segment_ids,
            cls_positions=cls_positions,
            deterministic=deterministic,
            output_positions=masked_lm_positions if cfg.sparse_last_layer else None,
        )
        # Only the gathered positions (~15% of tokens) reach the vocabulary projection.
        if cfg.sparse_last_layer:
            picked = outputs["sequence_output"]
        else:
            picked = gather_positions(outputs["sequence_output"], masked_lm_positions)
        embedding_VxD = nn.meta.unbox(
            bert.variables["params"]["embeddings"]["word_embeddings"]["embedding"]
        )
        mlm_logits = BertMLMHead(cfg, name="predictions")(
            picked, gathered_table(embedding_VxD, "vocab")
        )
        outputs["mlm_logits"] = mlm_logits[..., : cfg.vocab_size]
        if cfg.padded_vocab_size != cfg.vocab_size:
            # What the losses read: cutting the padding off instead costs a slice forward and a
            # pad of the logits' gradient backward (an extra pass over [batch, predictions,
            # vocab] in float32), and, with the vocabulary split over `tensor`, a re-split of
            # the cut logits between shards.
            outputs["mlm_logits_padded"] = mlm_logits
        nsp_logits = dense(cfg, 2, ("embed", None), "seq_relationship")(outputs["pooled_output"])
        outputs["nsp_logits"] = nsp_logits.astype(jnp.float32)
        return outputs
