"""`BertConfig`: the network's shape and its computation settings (a frozen dataclass), with the
names each closed-set setting may take.

Fields follow Hugging Face's config.json where it has them (`hidden_act`, `vocab_size`, ...); the
rest (dtypes, attention and dropout implementations, remat, vocabulary padding, the objective)
are bert-jax's. The modules that use it are in `model.py` and `layers.py`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax

from bert_jax.core.dtypes import DTYPES
from bert_jax.core.prng_impls import DROPOUT_IMPLEMENTATIONS
from bert_jax.runtime.declarations import problems, setting
from bert_jax.runtime.errors import UserError

Array = jax.Array
DType = Any

# Names follow Hugging Face's `hidden_act`: "gelu" is the exact erf form; "gelu_new" (alias
# "gelu_tanh") is the tanh approximation that Google's original TF code calls "gelu".
ACTIVATIONS: dict[str, Callable[[Array], Array]] = {
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
    "gelu_new": functools.partial(jax.nn.gelu, approximate=True),
    "gelu_tanh": functools.partial(jax.nn.gelu, approximate=True),
    "relu": jax.nn.relu,
}

ATTENTION_IMPLEMENTATIONS = ("auto", "xla", "dot_product", "cudnn", "pallas")
# What pretraining trains (docs/ablations.md): "mlm+nsp" the paper's masked LM + next sentence
# prediction; "mlm" masked LM only (RoBERTa's "no NSP"); "ltr" a left-to-right LM (causal
# attention, every position predicts the next token; the paper's Table 5 "LTR & No NSP").
OBJECTIVES = ("mlm+nsp", "mlm", "ltr")
EMBED_LOOKUPS = ("gather", "one_hot")
# What each encoder layer keeps for the backward pass (BertConfig.remat): jax.checkpoint
# policies; "none" keeps everything (no jax.checkpoint at all).
REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """Model hyperparameters. Field names follow Hugging Face's `BertConfig` where one exists.

    Each field is declared (runtime/declarations.py: default, help, range or choices, checked
    on construction): the pretraining config's `model` section is these declarations
    (training/config_schema.py). `identity=True` marks the architecture beyond the size
    preset's shapes, which a model directory a run starts from fixes
    (config_lib.adopt_model_identity)."""

    vocab_size: int = setting(
        30522, "rows of the word-embedding table (the vocabulary)", low=1, identity=True
    )
    hidden_size: int = setting(768, "width of every layer", low=1)
    num_hidden_layers: int = setting(12, "encoder layers", low=1)
    num_attention_heads: int = setting(12, "attention heads (they divide hidden_size)", low=1)
    intermediate_size: int = setting(3072, "feed-forward width", low=1)
    hidden_act: str = setting(
        "gelu",
        "the feed-forward activation: gelu (exact, erf), gelu_new or gelu_tanh (the tanh "
        "approximation Google's original code calls gelu), relu",
        choices=tuple(ACTIVATIONS),
        identity=True,
    )
    hidden_dropout_prob: float = setting(
        0.1, "dropout after the embeddings and each sub-layer", low=0.0, high=1.0, high_open=True
    )
    attention_probs_dropout_prob: float = setting(
        0.1, "dropout of the attention probabilities", low=0.0, high=1.0, high_open=True
    )
    max_position_embeddings: int = setting(
        512, "positions the model can hold", low=1, identity=True
    )
    type_vocab_size: int = setting(2, "segment ids (token types)", low=1, identity=True)
    initializer_range: float = setting(
        0.02, "standard deviation of the truncated-normal initializer", low=0.0, low_open=True
    )
    layer_norm_eps: float = setting(
        1e-12, "LayerNorm's epsilon", low=0.0, low_open=True, identity=True
    )
    pad_token_id: int = setting(0, "the [PAD] id", low=0)
    # Compute dtype of activations and matmuls ("bfloat16" for mixed precision); parameters stay
    # in `param_dtype` (float32 master weights). Softmax and LayerNorm statistics run in float32.
    dtype: str = setting(
        "float32", "compute dtype of activations and matmuls (bfloat16: mixed)", choices=DTYPES
    )
    param_dtype: str = setting("float32", "dtype of the parameters", choices=DTYPES)
    # "xla": explicit einsum attention (supports attention-prob dropout).
    # "dot_product": jax.nn.dot_product_attention with XLA's implementation.
    # "cudnn": jax.nn.dot_product_attention through cuDNN's fused kernel (GPU only).
    # "pallas": our fused kernel (`attention.py`) with hash attention dropout in-kernel, the
    #   einsum path's masks and results; GPU only, elsewhere the einsum path (one log line).
    # "auto": jax.nn.dot_product_attention whenever attention dropout is inactive (evaluation,
    #   or attention_probs_dropout_prob == 0), the explicit form otherwise.
    attention_impl: str = setting(
        "auto",
        "attention's implementation: auto (fused where no attention dropout is active), xla "
        "(einsums), dot_product, cudnn (GPU), pallas (our fused kernel, GPU)",
        choices=ATTENTION_IMPLEMENTATIONS,
    )
    # BertForPreTraining computes the last encoder layer only at the positions its heads read
    # (masked_lm_positions, and the [CLS] positions for NSP): the other positions' final states
    # never reach a loss, so the losses and gradients are the same, for ~6% fewer FLOPs at Base.
    # Its `sequence_output` is then [batch, predictions, hidden]. False: every position.
    sparse_last_layer: bool = setting(
        True, "pretraining computes the last layer only at the positions its heads read"
    )
    # Where dropout masks come from (`dropout.py`): "hash", a keyed counter hash fused into the
    # masked op, no mask array drawn and stored (docs/performance.md has the figures); "prng",
    # Flax's `nn.Dropout` (jax.random.bernoulli with the key's PRNG). Same rates either way.
    dropout_impl: str = setting(
        "hash",
        "where dropout masks come from: hash (a keyed hash fused into the op) or prng "
        "(Flax's nn.Dropout)",
        choices=DROPOUT_IMPLEMENTATIONS,
    )
    # The word-embedding table and the MLM output bias hold `padded_vocab_size` rows: vocab_size
    # rounded up to this multiple. The extra rows start at zero and no id reads them; their MLM
    # logits get the lowest float added (softmax weight and gradient exactly 0), so they stay
    # zero and the model computes what the unpadded one does. What it buys: a table that
    # divides over a `tensor` mesh axis (30522 = 2 x 3 x 5087 divides over 2 devices at most;
    # 30592 = 239 x 128 over up to 128), and an MLM projection whose width suits matmul tiles.
    # Exports cut the padding, `convert --vocab-pad-multiple` and `init_from` add it; parameter
    # counts leave it out.
    vocab_pad_multiple: int = setting(
        1, "word-embedding rows padded to a multiple of this (1: none)", low=1
    )
    # Rematerialization of each encoder layer in the backward pass, to trade compute for memory
    # (same results): "none" keeps every activation; "full" keeps only each layer's input and
    # recomputes the layer; "dots" keeps the outputs of the weight matmuls (projections, FFN) and
    # recomputes the rest (attention scores, softmax, GELU, layer norms, dropout).
    remat: str = setting(
        "none",
        "per-layer rematerialization in the backward pass: none, full (keep each layer's "
        "input) or dots (keep the weight matmuls' outputs)",
        choices=tuple(REMAT_POLICIES),
    )
    # The pretraining objective (OBJECTIVES). "ltr" makes the encoder causal (Hugging Face's
    # is_decoder): a query attends to its own and earlier positions only, in pretraining and in
    # fine-tuning alike, and the pooler reads the last real token instead of [CLS].
    objective: str = setting(
        "mlm+nsp",
        "what the model was pretrained for: mlm+nsp, mlm or ltr (causal attention)",
        choices=OBJECTIVES,
    )

    def __post_init__(self):
        # The declared choices and ranges (hidden_act's help says which gelu is Google's).
        found = problems(self, name_of=lambda name: name)
        if isinstance(self.vocab_pad_multiple, bool) or not isinstance(
            self.vocab_pad_multiple, int
        ):
            found.append(
                f"vocab_pad_multiple={self.vocab_pad_multiple!r} must be a positive integer "
                "(1: no padding)"
            )
        if self.num_attention_heads >= 1 and self.hidden_size % self.num_attention_heads:
            found.append(
                f"hidden_size={self.hidden_size} is not divisible by "
                f"num_attention_heads={self.num_attention_heads}"
            )
        if found:
            raise UserError("BertConfig: " + "; ".join(found))

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the word-embedding table: vocab_size rounded up to vocab_pad_multiple."""
        return -(-self.vocab_size // self.vocab_pad_multiple) * self.vocab_pad_multiple

    @property
    def is_decoder(self) -> bool:
        """Causal self-attention (the left-to-right objective)."""
        return self.objective == "ltr"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def replace(self, **changes: Any) -> BertConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> BertConfig:
        """Builds a config from a dict (e.g. a Hugging Face config.json), ignoring unknown keys."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})
