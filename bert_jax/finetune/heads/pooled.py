"""Fine-tuning heads on the pooled [CLS] output, and their losses as (sum, weight) pairs.

`BertForSequenceClassification` is `BertModel` (parameters under `bert/`, the same tree as the
pretraining model's `bert` subtree, so a model directory's encoder loads as is) followed by dropout
and one dense layer under `classifier/output/`: softmax over `num_labels` classes, or one regression
output (STS-B, mean squared error) when `num_labels == 1`. Sentence pairs are told apart by
`segment_ids`, as in pretraining. `BertForMultipleChoice` scores each of several choices with one
output on its pooled [CLS] (SWAG).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.core.dropout import Dropout
from bert_jax.core.layers import Dense
from bert_jax.core.model import BertConfig, BertModel

Array = jax.Array


class ClassifierHead(nn.Module):
    """Dropout, then one dense layer from each vector of the last axis (the pooled [CLS], or
    every token's output) to `num_labels` float32 outputs."""

    config: BertConfig
    num_labels: int
    dropout_rate: float = 0.1

    @nn.compact
    def __call__(self, hidden_xD: Array, deterministic: bool = True) -> Array:
        # The encoder's masks (`config.dropout_impl`): "prng" is Flax's nn.Dropout, same keys.
        hidden_xD = Dropout(self.dropout_rate, self.config.dropout_impl)(hidden_xD, deterministic)
        logits = Dense(
            features=(self.num_labels,),
            kernel_axes=("embed", None),
            num_input_axes=1,
            config=self.config,
            name="output",
        )(hidden_xD)
        return logits.astype(jnp.float32)


class BertForSequenceClassification(nn.Module):
    """BERT + `ClassifierHead` on the pooled [CLS]; returns float32 logits [batch, num_labels].

    `num_labels=1` is regression: the single output is the predicted score. Packed rows
    (`tuning/packing.py`: `position_ids`, `packed_segment_ids`, `cls_positions` [batch, slots])
    give [batch, slots, num_labels], one per row's [CLS].
    """

    config: BertConfig
    num_labels: int
    classifier_dropout: float = 0.1

    @nn.compact
    def __call__(
        self,
        input_ids: Array,
        input_mask: Array,
        segment_ids: Array,
        deterministic: bool = True,
        position_ids: Array | None = None,
        packed_segment_ids: Array | None = None,
        cls_positions: Array | None = None,
    ) -> Array:
        outputs = BertModel(self.config, name="bert")(
            input_ids,
            input_mask,
            segment_ids,
            position_ids=position_ids,
            packed_segment_ids=packed_segment_ids,
            cls_positions=cls_positions,
            deterministic=deterministic,
        )
        head = ClassifierHead(
            self.config, self.num_labels, self.classifier_dropout, name="classifier"
        )
        return head(outputs["pooled_output"], deterministic=deterministic)


class BertForMultipleChoice(nn.Module):
    """BERT + `ClassifierHead` with one output on each choice's pooled [CLS] (SWAG): inputs
    [batch, choices, length], float32 scores [batch, choices] (softmax over the choices), as
    Hugging Face's `BertForMultipleChoice`. The head's one vector is the only new parameter.
    Packed (`cls_positions` [batch, slots, choices]; every input [batch, choices, length], a lane
    per choice): scores [batch, slots, choices]."""

    config: BertConfig
    classifier_dropout: float = 0.1

    @nn.compact
    def __call__(
        self,
        input_ids: Array,
        input_mask: Array,
        segment_ids: Array,
        deterministic: bool = True,
        position_ids: Array | None = None,
        packed_segment_ids: Array | None = None,
        cls_positions: Array | None = None,
    ) -> Array:
        length = input_ids.shape[-1]
        outputs = BertModel(self.config, name="bert")(
            choice_rows(input_ids, length),
            choice_rows(input_mask, length),
            choice_rows(segment_ids, length),
            position_ids=choice_rows(position_ids, length),
            packed_segment_ids=choice_rows(packed_segment_ids, length),
            cls_positions=lane_cls_positions(cls_positions),
            deterministic=deterministic,
        )
        head = ClassifierHead(self.config, 1, self.classifier_dropout, name="classifier")
        scores = head(outputs["pooled_output"], deterministic=deterministic)
        return choice_scores(scores, input_ids.shape[:-1], cls_positions)


def choice_rows(x_BxCxL: Array | None, length: int) -> Array | None:
    """[batch, choices, length] as the encoder's rows, [batch * choices, length] (choice c of
    example b, or lane c of packed sequence b, is row b * choices + c); None stays None."""
    return None if x_BxCxL is None else x_BxCxL.reshape(-1, length)


def lane_cls_positions(cls_positions_BxNxC: Array | None) -> Array | None:
    """Packed multiple choice's [CLS] positions by lane: [batch * choices, slots] (lane c of
    sequence b is row b * choices + c), as the encoder sees the lanes; None unpacked."""
    if cls_positions_BxNxC is None:
        return None
    return jnp.swapaxes(cls_positions_BxNxC, 1, 2).reshape(-1, cls_positions_BxNxC.shape[1])


def choice_scores(
    scores: Array, batch_shape: tuple[int, ...], cls_positions: Array | None
) -> Array:
    """One score per choice, from the head's outputs on the encoder's rows: [batch, choices],
    or packed ([batch * choices, slots, 1], by lane) [batch, slots, choices]."""
    if cls_positions is None:
        return scores.reshape(batch_shape)
    batch, slots, choices = cls_positions.shape
    return jnp.swapaxes(scores.reshape(batch, choices, slots), 1, 2)


def classification_loss(logits_BxC: Array, labels_B: Array, weights_B: Array) -> dict[str, Array]:
    """Softmax cross-entropy and accuracy, summed over rows with weight (padding rows have 0).
    Packed outputs ([batch, slots, C], labels and weights [batch, slots]) count each slot."""
    logits_BxC, labels_B, weights_B = flat_rows(logits_BxC, labels_B, weights_B)
    log_probs = jax.nn.log_softmax(logits_BxC.astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(log_probs, labels_B[:, None].astype(jnp.int32), axis=-1)[:, 0]
    weights = weights_B.astype(jnp.float32)
    correct = (jnp.argmax(logits_BxC, axis=-1) == labels_B).astype(jnp.float32)
    return {
        "loss_sum": -jnp.sum(picked * weights),
        "correct_sum": jnp.sum(correct * weights),
        "weight": jnp.sum(weights),
    }


def regression_loss(predictions_Bx1: Array, targets_B: Array, weights_B: Array) -> dict[str, Array]:
    """Squared error summed over rows with weight (the mean is taken on the host)."""
    predictions_Bx1, targets_B, weights_B = flat_rows(predictions_Bx1, targets_B, weights_B)
    error = predictions_Bx1[:, 0].astype(jnp.float32) - targets_B.astype(jnp.float32)
    weights = weights_B.astype(jnp.float32)
    return {"loss_sum": jnp.sum(jnp.square(error) * weights), "weight": jnp.sum(weights)}


def flat_rows(outputs: Array, labels: Array, weights: Array) -> tuple[Array, Array, Array]:
    """Outputs [..., C] and labels, weights [...] as [rows, C] and [rows]: a packed batch's
    [batch, slots] examples as rows."""
    return outputs.reshape(-1, outputs.shape[-1]), labels.reshape(-1), weights.reshape(-1)


def head_loss(logits: Array, labels: Array, weights: Array, regression: bool) -> dict[str, Array]:
    if regression:
        return regression_loss(logits, labels, weights)
    return classification_loss(logits, labels, weights)
