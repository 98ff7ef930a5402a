"""The network's building blocks under logical axis names: initializers, LayerNorm, `Dense` over
several axes, `Embed` tables and `BertEmbeddings` (word + position + token type, LayerNorm,
dropout).

Every family's encoder builds on them (BERT's `model.py`, ModernBERT's `modernbert.py`): a
config here is any of the families' configs, read for `initializer_range`, `dtype`,
`param_dtype` and `hidden_size` (and a truncation, `initializer_cutoff_factor`, where a family
declares one)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.core.bert_config import EMBED_LOOKUPS, BertConfig
from bert_jax.core.dropout import Dropout

Array = jax.Array


def initializer(
    config: Any,
    axes: tuple[str | None, ...],
    used_rows: int | None = None,
    std: float | None = None,
) -> Callable:
    """Normal(std, default initializer_range), cut at +-cutoff x std where the config declares
    an `initializer_cutoff_factor` (ModernBERT's, as its PyTorch `trunc_normal_` draws); rows
    from `used_rows` on (a table's padding) are zero."""
    std = config.initializer_range if std is None else std
    cutoff = getattr(config, "initializer_cutoff_factor", None)
    if cutoff is None:
        normal = nn.initializers.normal(std)
    else:  # jax scales the truncated standard normal by stddev: PyTorch's trunc_normal_(a, b)
        normal = nn.initializers.truncated_normal(std, lower=-cutoff, upper=cutoff)
    if used_rows is None:
        return nn.with_logical_partitioning(normal, axes)

    def init(key: Array, shape: tuple[int, ...], dtype: Any = jnp.float32) -> Array:
        used = jnp.arange(shape[0])[:, None] < used_rows
        return jnp.where(used, normal(key, shape, dtype), jnp.zeros((), dtype))

    return nn.with_logical_partitioning(init, axes)


def zeros(axes: tuple[str | None, ...]) -> Callable:
    return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


def layer_norm(
    config: Any, name: str, *, epsilon: float | None = None, use_bias: bool = True
) -> nn.LayerNorm:
    """LayerNorm over `embed` (epsilon: default the config's `layer_norm_eps`)."""
    return nn.LayerNorm(
        epsilon=config.layer_norm_eps if epsilon is None else epsilon,
        use_bias=use_bias,
        # Two-pass variance, as PyTorch and TF compute it (the fast E[x^2] - E[x]^2 form loses
        # ~1e-5 of precision on real checkpoints).
        use_fast_variance=False,
        dtype=config.dtype,
        param_dtype=config.param_dtype,
        scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",)),
        bias_init=zeros(("embed",)),
        name=name,
    )


class Dense(nn.Module):
    """Dense layer over one or more trailing input axes into one or more output axes.

    The kernel is created in its final shape ([*in, *out]) with logical axis names, so sharding
    rules and constraints see the real rank (Flax's DenseGeneral initializes a flattened kernel,
    which clashes with logical constraints in scope during `apply`). `use_bias` False: no bias
    parameter; `init_std`: the kernel's initializer std when not the config's.
    """

    features: tuple[int, ...]
    kernel_axes: tuple[str | None, ...]
    num_input_axes: int
    config: Any
    use_bias: bool = True
    init_std: float | None = None

    @nn.compact
    def __call__(self, x: Array) -> Array:
        cfg = self.config
        n_in = self.num_input_axes
        in_shape = x.shape[-n_in:]
        kernel = self.param(
            "kernel",
            initializer(cfg, self.kernel_axes, std=self.init_std),
            (*in_shape, *self.features),
            cfg.param_dtype,
        )
        x = jnp.asarray(x, cfg.dtype)
        contract = (tuple(range(x.ndim - n_in, x.ndim)), tuple(range(n_in)))
        y = jax.lax.dot_general(x, jnp.asarray(kernel, cfg.dtype), (contract, ((), ())))
        if not self.use_bias:
            return y
        bias_axes = self.kernel_axes[n_in:]
        bias = self.param("bias", zeros(bias_axes), self.features, cfg.param_dtype)
        bias = jnp.asarray(bias, cfg.dtype).reshape((1,) * (y.ndim - bias.ndim) + bias.shape)
        return y + bias


def dense(
    config: Any,
    features: int | tuple[int, ...],
    kernel_axes: tuple[str | None, ...],
    name: str,
    num_input_axes: int = 1,
    *,
    use_bias: bool = True,
    init_std: float | None = None,
) -> Dense:
    features = (features,) if isinstance(features, int) else tuple(features)
    return Dense(features, kernel_axes, num_input_axes, config, use_bias, init_std, name=name)


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
    config: Any
    lookup: str = "gather"
    used_rows: int | None = None

    @nn.compact
    def __call__(self, ids: Array | None = None, length: int | None = None) -> Array:
        cfg = self.config
        if self.lookup not in EMBED_LOOKUPS:
            raise ValueError(f"Embed lookup={self.lookup!r} is not one of {EMBED_LOOKUPS}")
        table = self.param(
            "embedding",
            initializer(cfg, (self.rows_axis, "embed"), self.used_rows),
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
        hidden = layer_norm(cfg, "LayerNorm")(words + positions + types)
        hidden = Dropout(cfg.hidden_dropout_prob, cfg.dropout_impl)(hidden, deterministic)
        return nn.with_logical_constraint(hidden, ("batch", "length", "embed"))
