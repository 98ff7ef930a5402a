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

Why this file is long: it is the whole network, read top to bottom against the paper's section 3
and the parameter tree above (config, embeddings, attention, the post-LN layer, encoder, pooler,
heads). Split, a reader would follow one forward pass through several files.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.core import attention as attention_lib
from bert_jax.core.dropout import DROPOUT_IMPLEMENTATIONS, Dropout, hash_key_words
from bert_jax.runtime.errors import UserError

Array = jax.Array
DType = Any

# Names follow Hugging Face's `hidden_act`: "gelu" is the exact erf form; "gelu_new" (alias
# "gelu_tanh") is the tanh approximation that Google's original TF code calls "gelu".
_ACTIVATIONS: dict[str, Callable[[Array], Array]] = {
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
    """Model hyperparameters. Field names follow Hugging Face's `BertConfig` where one exists."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    # Compute dtype of activations and matmuls ("bfloat16" for mixed precision); parameters stay
    # in `param_dtype` (float32 master weights). Softmax and LayerNorm statistics run in float32.
    dtype: str = "float32"
    param_dtype: str = "float32"
    # "xla": explicit einsum attention (supports attention-prob dropout).
    # "dot_product": jax.nn.dot_product_attention with XLA's implementation.
    # "cudnn": jax.nn.dot_product_attention through cuDNN's fused kernel (GPU only).
    # "pallas": our fused kernel (`attention.py`) with hash attention dropout in-kernel, the
    #   einsum path's masks and results; GPU only, elsewhere the einsum path (one log line).
    # "auto": jax.nn.dot_product_attention whenever attention dropout is inactive (evaluation,
    #   or attention_probs_dropout_prob == 0), the explicit form otherwise.
    attention_impl: str = "auto"
    # BertForPreTraining computes the last encoder layer only at the positions its heads read
    # (masked_lm_positions, and the [CLS] positions for NSP): the other positions' final states
    # never reach a loss, so the losses and gradients are the same, for ~6% fewer FLOPs at Base.
    # Its `sequence_output` is then [batch, predictions, hidden]. False: every position.
    sparse_last_layer: bool = True
    # Where dropout masks come from (`dropout.py`): "hash", a keyed counter hash fused into the
    # masked op, no mask array drawn and stored (docs/performance.md has the figures); "prng",
    # Flax's `nn.Dropout` (jax.random.bernoulli with the key's PRNG). Same rates either way.
    dropout_impl: str = "hash"
    # The word-embedding table and the MLM output bias hold `padded_vocab_size` rows: vocab_size
    # rounded up to this multiple. The extra rows start at zero and no id reads them; their MLM
    # logits get the lowest float added (softmax weight and gradient exactly 0), so they stay
    # zero and the model computes what the unpadded one does. What it buys: a table that
    # divides over a `tensor` mesh axis (30522 = 2 x 3 x 5087 divides over 2 devices at most;
    # 30592 = 239 x 128 over up to 128), and an MLM projection whose width suits matmul tiles.
    # Exports cut the padding, `convert --vocab-pad-multiple` and `init_from` add it; parameter
    # counts leave it out.
    vocab_pad_multiple: int = 1
    # Rematerialization of each encoder layer in the backward pass, to trade compute for memory
    # (same results): "none" keeps every activation; "full" keeps only each layer's input and
    # recomputes the layer; "dots" keeps the outputs of the weight matmuls (projections, FFN) and
    # recomputes the rest (attention scores, softmax, GELU, layer norms, dropout).
    remat: str = "none"
    # The pretraining objective (OBJECTIVES). "ltr" makes the encoder causal (Hugging Face's
    # is_decoder): a query attends to its own and earlier positions only, in pretraining and in
    # fine-tuning alike, and the pooler reads the last real token instead of [CLS].
    objective: str = "mlm+nsp"

    def __post_init__(self):
        if self.objective not in OBJECTIVES:
            raise UserError(f"objective={self.objective!r} is not one of {OBJECTIVES}")
        if (
            isinstance(self.vocab_pad_multiple, bool)
            or not isinstance(self.vocab_pad_multiple, int)
            or self.vocab_pad_multiple < 1
        ):
            raise UserError(
                f"vocab_pad_multiple={self.vocab_pad_multiple!r} must be a positive integer "
                "(1: no padding)"
            )
        if self.hidden_size % self.num_attention_heads:
            raise UserError(
                f"hidden_size={self.hidden_size} is not divisible by "
                f"num_attention_heads={self.num_attention_heads}"
            )
        if self.hidden_act not in _ACTIVATIONS:
            raise UserError(
                f"hidden_act={self.hidden_act!r} is not one of {sorted(_ACTIVATIONS)} "
                "(Google's original 'gelu' is the tanh approximation: use 'gelu_new')"
            )
        if self.dropout_impl not in DROPOUT_IMPLEMENTATIONS:
            raise UserError(
                f"dropout_impl={self.dropout_impl!r} is not one of {DROPOUT_IMPLEMENTATIONS}"
            )
        if self.remat not in REMAT_POLICIES:
            raise UserError(f"remat={self.remat!r} is not one of {tuple(REMAT_POLICIES)}")
        if self.attention_impl not in ATTENTION_IMPLEMENTATIONS:
            raise UserError(
                f"attention_impl={self.attention_impl!r} is not one of {ATTENTION_IMPLEMENTATIONS}"
            )

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


def _init(
    config: BertConfig, axes: tuple[str | None, ...], used_rows: int | None = None
) -> Callable:
    """Normal(initializer_range); rows from `used_rows` on (a table's padding) are zero."""
    normal = nn.initializers.normal(config.initializer_range)
    if used_rows is None:
        return nn.with_logical_partitioning(normal, axes)

    def init(key: Array, shape: tuple[int, ...], dtype: Any = jnp.float32) -> Array:
        used = jnp.arange(shape[0])[:, None] < used_rows
        return jnp.where(used, normal(key, shape, dtype), jnp.zeros((), dtype))

    return nn.with_logical_partitioning(init, axes)


def _zeros(axes: tuple[str | None, ...]) -> Callable:
    return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


def _layer_norm(config: BertConfig, name: str) -> nn.LayerNorm:
    return nn.LayerNorm(
        epsilon=config.layer_norm_eps,
        # Two-pass variance, as PyTorch and TF compute it (the fast E[x^2] - E[x]^2 form loses
        # ~1e-5 of precision on real checkpoints).
        use_fast_variance=False,
        dtype=config.dtype,
        param_dtype=config.param_dtype,
        scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",)),
        bias_init=_zeros(("embed",)),
        name=name,
    )


class Dense(nn.Module):
    """Dense layer over one or more trailing input axes into one or more output axes.

    The kernel is created in its final shape ([*in, *out]) with logical axis names, so sharding
    rules and constraints see the real rank (Flax's DenseGeneral initializes a flattened kernel,
    which clashes with logical constraints in scope during `apply`).
    """

    features: tuple[int, ...]
    kernel_axes: tuple[str | None, ...]
    num_input_axes: int
    config: BertConfig

    @nn.compact
    def __call__(self, x: Array) -> Array:
        cfg = self.config
        n_in = self.num_input_axes
        in_shape = x.shape[-n_in:]
        kernel = self.param(
            "kernel", _init(cfg, self.kernel_axes), (*in_shape, *self.features), cfg.param_dtype
        )
        bias_axes = self.kernel_axes[n_in:]
        bias = self.param("bias", _zeros(bias_axes), self.features, cfg.param_dtype)
        x = jnp.asarray(x, cfg.dtype)
        contract = (tuple(range(x.ndim - n_in, x.ndim)), tuple(range(n_in)))
        y = jax.lax.dot_general(x, jnp.asarray(kernel, cfg.dtype), (contract, ((), ())))
        bias = jnp.asarray(bias, cfg.dtype).reshape((1,) * (y.ndim - bias.ndim) + bias.shape)
        return y + bias


def _dense(
    config: BertConfig,
    features: int | tuple[int, ...],
    kernel_axes: tuple[str | None, ...],
    name: str,
    num_input_axes: int = 1,
) -> Dense:
    features = (features,) if isinstance(features, int) else tuple(features)
    return Dense(features, kernel_axes, num_input_axes, config, name=name)


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
        query = _dense(cfg, (heads, head_dim), qkv_axes, "query")(query_input)
        key = _dense(cfg, (heads, head_dim), qkv_axes, "key")(hidden)
        value = _dense(cfg, (heads, head_dim), qkv_axes, "value")(hidden)

        dropout_active = not deterministic and cfg.attention_probs_dropout_prob > 0.0
        impl = cfg.attention_impl
        if impl == "auto":
            impl = "xla" if dropout_active else "dot_product"
        mode = attention_lib.pallas_mode() if impl == "pallas" else None
        if impl == "pallas" and mode is None:
            attention_lib.log_fallback_once(jax.default_backend())
            impl = "xla"
        if impl == "pallas" and dropout_active and cfg.dropout_impl != "hash":
            raise UserError(
                "attention_impl='pallas' computes attention dropout with the hash "
                f"(dropout_impl='hash'), not {cfg.dropout_impl!r}"
            )
        if impl == "pallas":
            rate = cfg.attention_probs_dropout_prob if dropout_active else 0.0
            # Named as the einsum path's Dropout, so it draws the same key: same dropped elements.
            words = hash_key_words(Dropout(rate, name="Dropout_0").key()) if rate else None
            context = attention_lib.flash_attention(
                query,
                key,
                value,
                mask_Bx1xQxK,
                dropout_rate=rate,
                dropout_words=words,
                interpret=mode == "interpret",
            )
        elif impl in ("dot_product", "cudnn"):
            if dropout_active:
                raise UserError(
                    f"attention_impl={cfg.attention_impl!r} cannot apply attention-probability "
                    f"dropout (attention_probs_dropout_prob={cfg.attention_probs_dropout_prob}); "
                    "use 'auto', 'xla' or 'pallas', or set the dropout to 0"
                )
            if impl == "cudnn":
                # cuDNN takes the mask as a bias of the full [batch, 1, q, k] shape.
                mask_Bx1xQxK = jnp.broadcast_to(
                    mask_Bx1xQxK,
                    (mask_Bx1xQxK.shape[0], 1, query.shape[1], key.shape[1]),
                )
            context = jax.nn.dot_product_attention(
                query,
                key,
                value,
                mask=mask_Bx1xQxK,
                implementation="cudnn" if impl == "cudnn" else "xla",
            )
        else:
            logits_BxHxQxK = jnp.einsum("bqhd,bkhd->bhqk", query, key).astype(jnp.float32)
            logits_BxHxQxK = logits_BxHxQxK / jnp.sqrt(jnp.float32(head_dim))
            big_neg = jnp.finfo(jnp.float32).min
            logits_BxHxQxK = jnp.where(mask_Bx1xQxK, logits_BxHxQxK, big_neg)
            probs = jax.nn.softmax(logits_BxHxQxK, axis=-1).astype(cfg.dtype)
            probs = Dropout(cfg.attention_probs_dropout_prob, cfg.dropout_impl)(
                probs, deterministic=deterministic
            )
            context = jnp.einsum("bhqk,bkhd->bqhd", probs, value)
        # A subset of positions is not a `length` axis: it stays whole wherever `length` goes.
        length = "length" if query_hidden is None else None
        context = nn.with_logical_constraint(context, ("batch", length, "heads", "kv"))
        return _dense(cfg, cfg.hidden_size, ("heads", "kv", "embed"), "output", num_input_axes=2)(
            context
        )


class BertLayer(nn.Module):
    """One post-LN Transformer block: attention -> add & norm -> GELU FFN -> add & norm.

    With `query_positions` ([batch, q]) the block is computed only at those positions (their
    queries attend to every key), and returns [batch, q, hidden]; `mask_Bx1xQxK` then has q rows.
    """

    config: BertConfig

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
        hidden = _layer_norm(cfg, "attention_output_LayerNorm")(residual + attended)
        hidden = nn.with_logical_constraint(hidden, ("batch", length, "embed"))

        inner = _dense(cfg, cfg.intermediate_size, ("embed", "mlp"), "intermediate")(hidden)
        inner = _ACTIVATIONS[cfg.hidden_act](inner)
        inner = nn.with_logical_constraint(inner, ("batch", length, "mlp"))
        out = _dense(cfg, cfg.hidden_size, ("mlp", "embed"), "output")(inner)
        out = dropout(out, deterministic=deterministic)
        hidden = _layer_norm(cfg, "output_LayerNorm")(hidden + out)
        return nn.with_logical_constraint(hidden, ("batch", length, "embed"))


def gathered_table(table: Array, rows_axis: str | None) -> Array:
    """An embedding table as used: its `embed` (FSDP) shards gathered, rows still split.

    FSDP all-gathers weights before use anyway; saying so at the lookup also steers XLA's SPMD
    partitioner away from gathering rows out of a feature-sharded table, which (jax 0.10.2, CPU)
    produced wrong gradients for the tied word embeddings with the batch split over
    ('data', 'fsdp') and tensor > 1 (tests/test_partitioning.py pins the case).
    """
    return nn.with_logical_constraint(table, (rows_axis, None))


class Embed(nn.Module):
    """Lookup table [num_embeddings, hidden] with logical axes (rows_axis, 'embed').

    `lookup` is how rows are read, each exact and with its own gradient:
    - "gather": `jnp.take`; the gradient is a scatter-add, fine where few ids repeat (words);
    - "one_hot": a one-hot matmul; the gradient is a matmul, for tables of a few rows that
      every token reads (token types), where a scatter-add's atomic updates would all land
      on the same rows and serialize (on GPUs).
    Called without ids, it returns the first `length` rows as [1, length, hidden] (the default
    positions 0..length-1), whose gradient is a sum over the batch. Rows from `used_rows` on
    (a padded table's tail) start at zero.

    Rows are read in the parameter dtype and cast after, so gradients accumulate in float32: a
    bf16 scatter-add runs as compare-and-swap loops on GPUs, which can take a large share of a
    step's time (docs/performance.md has the figures).
    """

    num_embeddings: int
    rows_axis: str | None
    config: BertConfig
    lookup: str = "gather"
    used_rows: int | None = None

    @nn.compact
    def __call__(self, ids: Array | None = None, length: int | None = None) -> Array:
        cfg = self.config
        if self.lookup not in EMBED_LOOKUPS:
            raise ValueError(f"Embed lookup={self.lookup!r} is not one of {EMBED_LOOKUPS}")
        table = self.param(
            "embedding",
            _init(cfg, (self.rows_axis, "embed"), self.used_rows),
            (self.num_embeddings, cfg.hidden_size),
            cfg.param_dtype,
        )
        table = gathered_table(table, self.rows_axis)
        if ids is None:
            rows = table[None, :length]
        elif self.lookup == "one_hot":
            one_hot = jax.nn.one_hot(ids, self.num_embeddings, dtype=table.dtype)
            rows = jnp.einsum("...n,nd->...d", one_hot, table, precision=jax.lax.Precision.HIGHEST)
        else:
            rows = jnp.take(table, ids, axis=0)
        return jnp.asarray(rows, cfg.dtype)


class BertEmbeddings(nn.Module):
    config: BertConfig

    @nn.compact
    def __call__(
        self,
        input_ids: Array,
        segment_ids: Array,
        position_ids: Array | None,
        deterministic: bool,
    ) -> Array:
        """`position_ids` None: positions 0..length-1 in every row."""
        cfg = self.config

        words = Embed(
            cfg.padded_vocab_size, "vocab", cfg, used_rows=cfg.vocab_size, name="word_embeddings"
        )(input_ids)
        position_table = Embed(cfg.max_position_embeddings, None, cfg, name="position_embeddings")
        if position_ids is None:
            positions = position_table(length=input_ids.shape[-1])
        else:
            positions = position_table(position_ids)
        types = Embed(
            cfg.type_vocab_size, None, cfg, lookup="one_hot", name="token_type_embeddings"
        )(segment_ids)
        hidden = _layer_norm(cfg, "LayerNorm")(words + positions + types)
        hidden = Dropout(cfg.hidden_dropout_prob, cfg.dropout_impl)(hidden, deterministic)
        return nn.with_logical_constraint(hidden, ("batch", "length", "embed"))


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
        all_hidden = [hidden]
        last = self.config.num_hidden_layers - 1
        layer_class = BertLayer
        if self.config.remat != "none":
            # `deterministic` (argument 3, counting the module) is a Python bool: static.
            policy = REMAT_POLICIES[self.config.remat]
            layer_class = nn.remat(BertLayer, policy=policy, static_argnums=(3,))
        for i in range(self.config.num_hidden_layers):
            layer = layer_class(self.config, name=f"layer_{i}")
            if i == last and last_layer_positions is not None:
                hidden = layer(hidden, last_layer_mask, deterministic, last_layer_positions)
            else:
                hidden = layer(hidden, mask_Bx1xQxK, deterministic)
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
            pooled = _dense(cfg, cfg.hidden_size, ("embed", "mlp"), "pooler")(first)
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
        hidden = _dense(cfg, cfg.hidden_size, ("embed", "mlp"), "transform")(hidden_BxPxD)
        hidden = _ACTIVATIONS[cfg.hidden_act](hidden)
        hidden = _layer_norm(cfg, "transform_LayerNorm")(hidden)
        logits = jnp.einsum("bpd,vd->bpv", hidden, jnp.asarray(embedding_VxD, cfg.dtype))
        output_bias = self.param(
            "output_bias", _zeros(("vocab",)), (cfg.padded_vocab_size,), cfg.param_dtype
        )
        bias = output_bias.astype(jnp.float32)
        if cfg.padded_vocab_size != cfg.vocab_size:
            # The padding rows' columns get the lowest float added: exp() of them is 0, so a
            # softmax over all columns is the unpadded one and its gradient there is exactly 0
            # (to the padding rows and bias entries). An added constant has no backward op of
            # its own; a select added a pass over the logits' gradient (seen in XLA:CPU's HLO).
            real = jnp.arange(cfg.padded_vocab_size) < cfg.vocab_size
            bias = bias + jnp.where(real, 0.0, jnp.finfo(jnp.float32).min)
        logits = logits.astype(jnp.float32) + bias[None, None, :]
        return nn.with_logical_constraint(logits, ("batch", None, "vocab"))


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
        nsp_logits = _dense(cfg, 2, ("embed", None), "seq_relationship")(outputs["pooled_output"])
        outputs["nsp_logits"] = nsp_logits.astype(jnp.float32)
        return outputs
