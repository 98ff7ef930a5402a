"""Heads on every token's output (SQuAD spans, CoNLL-2003 tags) and their losses as sums.

`BertForTokenOutputs` is `BertModel` (parameters under `bert/`, so a model directory's encoder loads
as is) followed by dropout and one dense layer under `classifier/output/` applied at every position:
[batch, length, num_outputs] float32 logits (packed rows, `tuning/packing.py`: the same, each
row's tokens attending to its own). For SQuAD `num_outputs` is 2 (start and end logits;
the original run_squad has no dropout before this layer, so its rate is 0 there); for NER it is the
number of tags.

`ModernBertForTokenOutputs` is the same for a ModernBERT encoder, as transformers'
`ModernBertForQuestionAnswering` and `ModernBertForTokenClassification` have it: the encoder under
`bert/`, then at every position `modernbert_pooled.ModernBertClassifierHead` (dense, activation,
norm, dropout at the config's `classifier_dropout`, the classifier) under `classifier/`.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.core.model import BertConfig, BertModel
from bert_jax.core.modernbert import ModernBertModel
from bert_jax.core.modernbert_config import ModernBertConfig
from bert_jax.finetune.heads.modernbert_pooled import ModernBertClassifierHead
from bert_jax.finetune.heads.pooled import ClassifierHead

Array = jax.Array


class BertForTokenOutputs(nn.Module):
    """BERT + a `ClassifierHead` at every position; returns float32 logits [batch, length,
    num_outputs]."""

    config: BertConfig
    num_outputs: int
    head_dropout: float = 0.1

    @nn.compact
    def __call__(
        self,
        input_ids: Array,
        input_mask: Array,
        segment_ids: Array,
        deterministic: bool = True,
        position_ids: Array | None = None,
        packed_segment_ids: Array | None = None,
    ) -> Array:
        outputs = BertModel(self.config, name="bert")(
            input_ids,
            input_mask,
            segment_ids,
            position_ids=position_ids,
            packed_segment_ids=packed_segment_ids,
            deterministic=deterministic,
        )
        head = ClassifierHead(self.config, self.num_outputs, self.head_dropout, name="classifier")
        return head(outputs["sequence_output"], deterministic=deterministic)


class ModernBertForTokenOutputs(nn.Module):
    """ModernBERT + a `ModernBertClassifierHead` at every position; float32 logits [batch,
    length, num_outputs]. `segment_ids` is taken, as every token task's batch has it, and not
    read: ModernBERT tells a question from its context by [SEP] alone."""

    config: ModernBertConfig
    num_outputs: int

    @nn.compact
    def __call__(
        self,
        input_ids: Array,
        input_mask: Array,
        segment_ids: Array | None = None,
        deterministic: bool = True,
        position_ids: Array | None = None,
        packed_segment_ids: Array | None = None,
    ) -> Array:
        del segment_ids
        outputs = ModernBertModel(self.config, name="bert")(
            input_ids,
            input_mask,
            position_ids=position_ids,
            packed_segment_ids=packed_segment_ids,
            deterministic=deterministic,
        )
        head = ModernBertClassifierHead(self.config, self.num_outputs, name="classifier")
        return head(outputs["sequence_output"], deterministic=deterministic)


def span_loss(
    logits_BxLx2: Array, start_positions_B: Array, end_positions_B: Array, weights_B: Array
) -> dict[str, Array]:
    """SQuAD's loss: the mean of the start and the end cross-entropy over positions, summed over
    rows with weight. The softmax runs over every position of each row it is given, as
    google-research/bert's run_squad and Hugging Face's `BertForQuestionAnswering` compute it
    (the tuner gives padding `token_tuning.PADDING_LOGIT`, so a window's real tokens count; a
    packed batch comes as one row per slot, `token_tuning.slot_rows`, its targets positions in
    that row); the row's [CLS] (position 0 unpacked) is the target of an unanswerable question
    or of a window that does not hold the answer."""
    weights = weights_B.astype(jnp.float32)
    total = jnp.zeros((), jnp.float32)
    for index, positions in enumerate((start_positions_B, end_positions_B)):
        log_probs = jax.nn.log_softmax(logits_BxLx2[..., index].astype(jnp.float32), axis=-1)
        picked = jnp.take_along_axis(log_probs, positions[:, None].astype(jnp.int32), axis=-1)
        total = total - jnp.sum(picked[:, 0] * weights)
    return {"loss_sum": total / 2.0, "weight": jnp.sum(weights)}


def token_loss(
    logits_BxLxC: Array, labels_BxL: Array, label_weights_BxL: Array
) -> dict[str, Array]:
    """Tagging loss: softmax cross-entropy at the labelled positions (the first sub-token of each
    word; weight 0 elsewhere), summed; `weight` counts the labelled positions."""
    log_probs = jax.nn.log_softmax(logits_BxLxC.astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(log_probs, labels_BxL[..., None].astype(jnp.int32), axis=-1)
    weights = label_weights_BxL.astype(jnp.float32)
    correct = (jnp.argmax(logits_BxLxC, axis=-1) == labels_BxL).astype(jnp.float32)
    return {
        "loss_sum": -jnp.sum(picked[..., 0] * weights),
        "correct_sum": jnp.sum(correct * weights),
        "weight": jnp.sum(weights),
    }
