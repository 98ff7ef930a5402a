"""ModernBERT's pooled heads, as transformers' `ModernBertForSequenceClassification` and
`ModernBertForMultipleChoice` have them: the final hidden states pooled (the first token's, or the
mean over real tokens, by the config's `classifier_pooling`), then the head's dense, activation and
norm, dropout, and the classifier (one output per choice for multiple choice, softmax over them).

`ModernBertForSequenceClassification` keeps the tree fine-tuning's `HeadTuner` expects: the
encoder (a model directory's `model` subtree, `core/modernbert.ModernBertModel`) under `bert/`, the
head under `classifier/` (`head/{dense,norm}` and `output/{kernel,bias}`, transformers'
`head.dense`, `head.norm` and `classifier`). `num_labels=1` is regression.
`ModernBertForMultipleChoice` is the same model and tree with one output, run on every choice
(SWAG). ModernBERT has no segment embeddings: a pair's second text is told apart by [SEP] alone.

`--dropout` (`FinetuneSettings.dropout`) sets every dropout ModernBERT has, as it sets BERT's
hidden and attention dropout: after the embeddings, of the attention, of the GeGLU, and before the
classifier (`with_dropout`).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.core.dropout import Dropout
from bert_jax.core.layers import Dense
from bert_jax.core.modernbert import ModernBertModel, ModernBertPredictionHead
from bert_jax.core.modernbert_config import ModernBertConfig
from bert_jax.finetune.heads.pooled import choice_rows, choice_scores, lane_cls_positions

Array = jax.Array


def with_dropout(config: ModernBertConfig, rate: float) -> ModernBertConfig:
    """`config` with every dropout rate at `rate` (a fine-tuning run's `dropout`)."""
    return config.replace(
        embedding_dropout=rate, attention_dropout=rate, mlp_dropout=rate, classifier_dropout=rate
    )


def pool(
    hidden_BxLxD: Array,
    input_mask_BxL: Array,
    pooling: str,
    packed_segment_ids_BxL: Array | None = None,
    cls_positions_BxN: Array | None = None,
) -> Array:
    """The first token's state ("cls"), or the mean over the real tokens ("mean"): [B, D]; of
    packed rows (`cls_positions` [B, N]: where row n starts; its tokens carry packed segment id
    n + 1), each row's: [B, N, D]."""
    if cls_positions_BxN is None:
        if pooling == "cls":
            return hidden_BxLxD[:, 0]
        mask = input_mask_BxL.astype(hidden_BxLxD.dtype)[..., None]
        return jnp.sum(hidden_BxLxD * mask, axis=1) / jnp.maximum(jnp.sum(mask, axis=1), 1.0)
    if pooling == "cls":
        positions = cls_positions_BxN.astype(jnp.int32)[..., None]
        return jnp.take_along_axis(hidden_BxLxD, positions, axis=1)
    rows = jnp.arange(1, cls_positions_BxN.shape[1] + 1, dtype=jnp.int32)
    member = packed_segment_ids_BxL[:, None, :] == rows[None, :, None]
    member = jnp.logical_and(member, input_mask_BxL[:, None, :] != 0).astype(hidden_BxLxD.dtype)
    total = jnp.einsum("bnl,bld->bnd", member, hidden_BxLxD)
    return total / jnp.maximum(jnp.sum(member, axis=2), 1.0)[..., None]


class ModernBertClassifierHead(nn.Module):
    """From the pooled state: dense, activation, norm (`head`), dropout, the classifier
    (`output`, with a bias as transformers' nn.Linear has), float32 [batch, num_labels]."""

    config: ModernBertConfig
    num_labels: int

    @nn.compact
    def __call__(self, pooled_BxD: Array, deterministic: bool = True) -> Array:
        cfg = self.config
        hidden = ModernBertPredictionHead(cfg, name="head")(pooled_BxD)
        hidden = Dropout(cfg.classifier_dropout, cfg.dropout_impl)(hidden, deterministic)
        logits = Dense(
            features=(self.num_labels,),
            kernel_axes=("embed", None),
            num_input_axes=1,
            config=cfg,
            name="output",
        )(hidden)
        return logits.astype(jnp.float32)


class ModernBertForSequenceClassification(nn.Module):
    """ModernBERT, its pooled final state, `ModernBertClassifierHead`: float32 logits
    [batch, num_labels]. `segment_ids` is taken, as every sentence task's batch has it, and not
    read."""

    config: ModernBertConfig
    num_labels: int

    @nn.compact
    def __call__(
        self,
        input_ids: Array,
        input_mask: Array,
        segment_ids: Array | None = None,
        deterministic: bool = True,
        position_ids: Array | None = None,
        packed_segment_ids: Array | None = None,
        cls_positions: Array | None = None,
    ) -> Array:
        del segment_ids
        cfg = self.config
        outputs = ModernBertModel(cfg, name="bert")(
            input_ids,
            input_mask,
            position_ids=position_ids,
            packed_segment_ids=packed_segment_ids,
            deterministic=deterministic,
        )
        pooled = pool(
            outputs["sequence_output"],
            input_mask,
            cfg.classifier_pooling,
            packed_segment_ids,
            cls_positions,
        )
        head = ModernBertClassifierHead(cfg, self.num_labels, name="classifier")
        return head(pooled, deterministic=deterministic)


class ModernBertForMultipleChoice(ModernBertForSequenceClassification):
    """`ModernBertForSequenceClassification` with one output, on each choice: inputs
    [batch, choices, length], float32 scores [batch, choices] (softmax over the choices).

    transformers' CLS pooling here takes each row's first real token; our rows are padded on
    the right, where that is the first token, as `pool` takes it. Packed (`cls_positions`
    [batch, slots, choices], a lane per choice, as `pooled.BertForMultipleChoice` takes them):
    scores [batch, slots, choices]."""

    num_labels: int = 1

    def __call__(
        self,
        input_ids: Array,
        input_mask: Array,
        segment_ids: Array | None = None,
        deterministic: bool = True,
        position_ids: Array | None = None,
        packed_segment_ids: Array | None = None,
        cls_positions: Array | None = None,
    ) -> Array:
        length = input_ids.shape[-1]
        scores = super().__call__(
            choice_rows(input_ids, length),
            choice_rows(input_mask, length),
            deterministic=deterministic,
            position_ids=choice_rows(position_ids, length),
            packed_segment_ids=choice_rows(packed_segment_ids, length),
            cls_positions=lane_cls_positions(cls_positions),
        )
        return choice_scores(scores, input_ids.shape[:-1], cls_positions)
