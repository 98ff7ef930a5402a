"""The paper's feature-based NER model (Table 7): frozen BERT layers into a two-layer BiLSTM.

BERT is not fine-tuned: `word_features` runs the encoder under `stop_gradient` and gathers, at the
first sub-token of each word, the hidden states a variant needs (indexed as `encode.py` and Hugging
Face's `hidden_states` are: 0 the embedding output, i the output of layer i):

    embeddings          hidden state 0
    second_to_last      the second-to-last layer
    last                the last layer
    sum_last_four       a learned weighted sum of the last four layers
    concat_last_four    the last four layers concatenated (4 x hidden features)
    sum_all             a learned weighted sum of every layer (1..L; the paper's "all 12 layers"
                        of BERT-Base, the embedding output not included)

A weighted sum is ELMo's scalar mix: softmax-normalised weights (equal at the start) times one
learned scale. `BiLstmTagger` mixes the layers, runs two bidirectional LSTM layers (Flax's
`nn.RNN` over `nn.OptimizedLSTMCell`, `lstm_size` units each way, 768 as in the paper) over the
words of a window (padding words cut off by `seq_lengths`), and classifies every word.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.core.model import BertConfig, BertModel
from bert_jax.runtime.errors import UserError

Array = jax.Array
VARIANTS = (
    "embeddings",
    "second_to_last",
    "last",
    "sum_last_four",
    "concat_last_four",
    "sum_all",
)


def check_variant(variant: str) -> str:
    if variant not in VARIANTS:
        raise UserError(f"--features {variant!r} is not one of {', '.join(VARIANTS)}")
    return variant


def variant_layers(variant: str, num_hidden_layers: int) -> tuple[str, tuple[int, ...]]:
    """(how the layers combine: "pick", "sum" or "concat"; which hidden states, in order)."""
    check_variant(variant)
    last_four = tuple(range(num_hidden_layers - 3, num_hidden_layers + 1))
    if num_hidden_layers < 4 and variant in ("sum_last_four", "concat_last_four"):
        raise UserError(f"--features {variant} needs 4 layers; the model has {num_hidden_layers}")
    return {
        "embeddings": ("pick", (0,)),
        "second_to_last": ("pick", (num_hidden_layers - 1,)),
        "last": ("pick", (num_hidden_layers,)),
        "sum_last_four": ("sum", last_four),
        "concat_last_four": ("concat", last_four),
        "sum_all": ("sum", tuple(range(1, num_hidden_layers + 1))),
    }[variant]


def word_features(bert_params, batch, *, config: BertConfig, layers: Sequence[int]) -> Array:
    """Frozen hidden states at each word's first sub-token: [batch, words, len(layers), hidden]
    float32, for `batch`'s input_ids/input_mask/segment_ids [B, L] and word_positions [B, W]."""
    outputs = BertModel(config, add_pooler=False).apply(
        {"params": bert_params},
        batch["input_ids"],
        batch["input_mask"],
        batch["segment_ids"],
        deterministic=True,
    )
    stacked = jnp.stack([outputs["hidden_states"][i] for i in layers], axis=2)  # [B, L, K, D]
    positions = batch["word_positions"].astype(jnp.int32)[:, :, None, None]
    picked = jnp.take_along_axis(stacked, positions, axis=1)
    return jax.lax.stop_gradient(picked.astype(jnp.float32))


class LayerMix(nn.Module):
    """[B, W, K, D] -> [B, W, D] (pick, learned weighted sum) or [B, W, K*D] (concat)."""

    mode: str

    @nn.compact
    def __call__(self, features_BxWxKxD: Array) -> Array:
        batch, words, count, hidden = features_BxWxKxD.shape
        if self.mode == "pick":
            return features_BxWxKxD[:, :, 0]
        if self.mode == "concat":
            return features_BxWxKxD.reshape(batch, words, count * hidden)
        weights = self.param("layer_weights", nn.initializers.zeros, (count,), jnp.float32)
        scale = self.param("scale", nn.initializers.ones, (), jnp.float32)
        mixed = jnp.einsum("k,bwkd->bwd", jax.nn.softmax(weights), features_BxWxKxD)
        return scale * mixed


class BiLstmTagger(nn.Module):
    """Layer mix -> dropout -> two BiLSTM layers -> dropout -> dense: logits [B, W, labels]."""

    num_labels: int
    mode: str
    lstm_size: int = 768
    num_layers: int = 2
    dropout_rate: float = 0.1

    @nn.compact
    def __call__(
        self, features_BxWxKxD: Array, word_counts_B: Array, deterministic: bool = True
    ) -> Array:
        x = LayerMix(self.mode, name="mix")(features_BxWxKxD)
        x = nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)
        for index in range(self.num_layers):
            forward, backward = (
                nn.OptimizedLSTMCell(self.lstm_size, name=f"lstm_{index}_{way}")
                for way in ("forward", "backward")
            )
            x = nn.Bidirectional(nn.RNN(forward), nn.RNN(backward))(x, seq_lengths=word_counts_B)
            x = nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)
        return nn.Dense(self.num_labels, name="output")(x).astype(jnp.float32)


def word_arrays(features, max_seq_length: int) -> dict[str, np.ndarray]:
    """`conll.NerFeatures` (windows of sub-tokens) as the tagger's word-level arrays: the windows'
    input_ids/input_mask/segment_ids, word_positions/labels/label_weights [N, W] (W =
    max_seq_length - 2, the most words a window holds) and word_counts [N]."""
    count, width = len(features), max_seq_length - 2
    positions = np.zeros((count, width), np.int32)
    labels = np.zeros((count, width), np.int32)
    weights = np.zeros((count, width), np.float32)
    counts = np.zeros(count, np.int32)
    for row, placed in enumerate(features.words):
        at = np.asarray([position for _, _, position in placed], np.int32)
        counts[row] = len(at)
        positions[row, : len(at)] = at
        labels[row, : len(at)] = features.arrays["labels"][row, at]
        weights[row, : len(at)] = features.arrays["label_weights"][row, at]
    arrays = {key: features.arrays[key] for key in ("input_ids", "input_mask", "segment_ids")}
    arrays.update(
        word_positions=positions, labels=labels, label_weights=weights, word_counts=counts
    )
    return arrays


def token_logits(
    word_logits_NxWxC: np.ndarray, arrays: dict[str, np.ndarray], max_seq_length: int
) -> np.ndarray:
    """Word logits put back at their first sub-tokens, [N, L, C] (what `conll.predicted_tags`
    reads, as it does the fine-tuned tagger's)."""
    count, _, labels = word_logits_NxWxC.shape
    out = np.zeros((count, max_seq_length, labels), np.float32)
    for row in range(count):
        words = int(arrays["word_counts"][row])
        out[row, arrays["word_positions"][row, :words]] = word_logits_NxWxC[row, :words]
    return out
