"""`ModernBertConfig`: ModernBERT's shape and computation settings (a frozen dataclass of declared
settings), and the published sizes as values of it.

ModernBERT (Warner et al., 2024) is a pre-LayerNorm encoder without biases (as configured), with a
GeGLU feed-forward, rotary positions (one base for global layers, another for sliding-window
ones), global attention every `global_attn_every_n_layers` layers and a sliding window
(`local_attention`) elsewhere, a norm after the embeddings and after the last layer, and an MLM
head (dense, activation, norm, tied decoder with a bias). Field names are those of transformers'
`ModernBertConfig` where it has them (config.json speaks them); the computation settings (dtypes,
attention and dropout implementations, remat, vocabulary padding) are BertConfig's own
declarations, shared. The modules are `modernbert.py`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from bert_jax.core.bert_config import ACTIVATIONS, BertConfig
from bert_jax.runtime.declarations import problems, setting
from bert_jax.runtime.errors import UserError

POOLINGS = ("cls", "mean")
# Which attention each layer runs, under transformers' names for config.json's `layer_types`.
GLOBAL, SLIDING = "full_attention", "sliding_attention"

# The published models (answerdotai/ModernBERT-base and -large): base is the declared defaults.
SIZES: dict[str, dict[str, Any]] = {
    "base": {},
    "large": {
        "num_hidden_layers": 28,
        "hidden_size": 1024,
        "num_attention_heads": 16,
        "intermediate_size": 2624,
    },
}


# The computation settings (dtypes, implementations, remat, vocabulary padding): bert-jax's,
# not the model's shape; transformers' config.json holds none of them.
COMPUTATION = ("dtype", "param_dtype", "attention_impl", "dropout_impl", "vocab_pad_multiple")
COMPUTATION += ("remat",)


def _shared(name: str) -> Any:
    """BertConfig's declaration of a computation setting, declared once for both families."""
    assert name in COMPUTATION, name
    field = BertConfig.__dataclass_fields__[name]
    return dataclasses.field(default=field.default, metadata=field.metadata)


def _rate(default: float, help: str) -> Any:
    return setting(default, help, low=0.0, high=1.0, high_open=True)


@dataclasses.dataclass(frozen=True)
class ModernBertConfig:
    """ModernBERT's hyperparameters; the defaults are ModernBERT-base. Each field is declared
    (runtime/declarations.py: default, help, range or choices)."""

    vocab_size: int = setting(50368, "rows of the token-embedding table (the vocabulary)", low=1)
    hidden_size: int = setting(768, "width of every layer", low=1)
    intermediate_size: int = setting(
        1152, "GeGLU width: Wi makes twice this, an input and its gate", low=1
    )
    num_hidden_layers: int = setting(22, "encoder layers", low=1)
    num_attention_heads: int = setting(
        12, "attention heads (they divide hidden_size into an even head size)", low=1
    )
    hidden_activation: str = setting(
        "gelu",
        "the GeGLU's activation: gelu (exact, erf), gelu_new or gelu_tanh (tanh), relu",
        choices=tuple(ACTIVATIONS),
    )
    max_position_embeddings: int = setting(
        8192, "the longest input (rotary positions: no table holds them)", low=1
    )
    initializer_range: float = setting(
        0.02, "standard deviation of the initial weights", low=0.0, low_open=True
    )
    initializer_cutoff_factor: float = setting(
        2.0, "initial weights are cut at this many standard deviations", low=0.0, low_open=True
    )
    norm_eps: float = setting(1e-5, "LayerNorm's epsilon", low=0.0, low_open=True)
    norm_bias: bool = setting(False, "the LayerNorms have a bias")
    pad_token_id: int = setting(50283, "the [PAD] id", low=0)
    bos_token_id: int = setting(50281, "the beginning-of-sequence id ([CLS])", low=0)
    eos_token_id: int = setting(50282, "the end-of-sequence id ([SEP])", low=0)
    cls_token_id: int = setting(50281, "the [CLS] id", low=0)
    sep_token_id: int = setting(50282, "the [SEP] id", low=0)
    attention_bias: bool = setting(False, "the attention projections (Wqkv, Wo) have biases")
    attention_dropout: float = _rate(
        0.0, "dropout of the attention probabilities and of the attention output"
    )
    global_attn_every_n_layers: int = setting(
        3,
        "layer i attends globally when i is a multiple of this, within the sliding window "
        "otherwise (1: every layer global)",
        low=1,
    )
    global_rope_theta: float = setting(
        160000.0, "rotary base of the global layers", low=0.0, low_open=True
    )
    local_rope_theta: float = setting(
        10000.0, "rotary base of the sliding-window layers", low=0.0, low_open=True
    )
    local_attention: int = setting(
        128, "the sliding window: a token sees those local_attention // 2 positions away or less",
        low=2,
    )  # fmt: skip
    embedding_dropout: float = _rate(0.0, "dropout after the embeddings' norm")
    mlp_bias: bool = setting(False, "the GeGLU's projections (Wi, Wo) have biases")
    mlp_dropout: float = _rate(0.0, "dropout of the GeGLU's gated activations")
    decoder_bias: bool = setting(True, "the MLM decoder (tied to the embeddings) adds a bias")
    classifier_pooling: str = setting(
        "cls",
        "what a sequence head reads: cls (the first token's state) or mean (of the real tokens)",
        choices=POOLINGS,
    )
    classifier_dropout: float = _rate(0.0, "dropout before a task head's classifier")
    classifier_bias: bool = setting(
        False, "the heads' dense layers (the MLM head's too) have biases"
    )
    classifier_activation: str = setting(
        "gelu", "the heads' activation (the MLM head's too)", choices=tuple(ACTIVATIONS)
    )
    dtype: str = _shared("dtype")
    param_dtype: str = _shared("param_dtype")
    attention_impl: str = _shared("attention_impl")
    dropout_impl: str = _shared("dropout_impl")
    vocab_pad_multiple: int = _shared("vocab_pad_multiple")
    remat: str = _shared("remat")

    def __post_init__(self):
        found = problems(self, name_of=lambda name: name)
        if self.hidden_size % self.num_attention_heads:
            found.append(
                f"hidden_size={self.hidden_size} is not divisible by "
                f"num_attention_heads={self.num_attention_heads}"
            )
        elif self.head_dim % 2:
            found.append(
                f"hidden_size / num_attention_heads = {self.head_dim} is odd: rotary positions "
                "turn pairs of dimensions"
            )
        if found:
            raise UserError("ModernBertConfig: " + "; ".join(found))

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the token-embedding table: vocab_size rounded up to vocab_pad_multiple."""
        return -(-self.vocab_size // self.vocab_pad_multiple) * self.vocab_pad_multiple

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def objective(self) -> str:
        """What pretraining trains (the trainer reads it): masked LM alone."""
        return "mlm"

    @property
    def is_decoder(self) -> bool:
        return False

    @property
    def layer_types(self) -> tuple[str, ...]:
        """Each layer's attention, GLOBAL or SLIDING (transformers' `layer_types`)."""
        every = self.global_attn_every_n_layers
        return tuple(GLOBAL if i % every == 0 else SLIDING for i in range(self.num_hidden_layers))

    @property
    def out_init_std(self) -> float:
        """The initial std of the layers that write into the residual stream (attention's and
        the GeGLU's Wo, the MLM head's dense): initializer_range / sqrt(2 x layers)."""
        return self.initializer_range / (2.0 * self.num_hidden_layers) ** 0.5

    def replace(self, **changes: Any) -> ModernBertConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ModernBertConfig:
        """A config from a dict (a model directory's config.json), ignoring unknown keys."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})

    @classmethod
    def size(cls, name: str, **changes: Any) -> ModernBertConfig:
        """A published size (SIZES: base, large), with `changes`."""
        if name not in SIZES:
            raise UserError(f"ModernBERT size {name!r} is not one of {', '.join(SIZES)}")
        return cls(**{**SIZES[name], **changes})
