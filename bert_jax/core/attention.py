"""Fused attention that keeps the paper's attention-probability dropout (`attention_impl="pallas"`).

`jax.nn.dot_product_attention` has no dropout. JAX's internal cuDNN entry
(`jax._src.cudnn.fused_attention_stablehlo.dot_product_attention`) takes a `dropout_rate`, but its
seed is a static Python int: the mask would repeat every step unless the step were recompiled,
which is not dropout for training. So this module has its own kernel, in Pallas:

- forward: one program per (batch row, head, block of queries) keeps its queries in registers
  and walks the keys block by block with an online softmax (running max and sum, FlashAttention
  2), so the [batch, heads, queries, keys] probabilities are never stored. The boolean mask
  ([batch or 1, heads or 1, queries or 1, keys]: padding, packed segments, causal, any) is read
  in-kernel. Dropout is applied in-kernel to each probability tile with the same keyed counter
  hash as `dropout.py`'s "hash" dropout, at the same coordinates of the same [batch, heads,
  queries, keys] tensor, from the same key: the fused path drops exactly the elements the
  einsum path (`attention_impl="xla"`) drops, and the two agree up to float summation order.
- backward (`jax.custom_vjp`): recomputed through `reference_attention`, the einsum form with
  the same mask and dropout bits, so the gradients are the einsum path's. It stores the
  probabilities for the backward pass as the einsum path does; a Pallas backward kernel is
  what would remove that (not written yet).

Pallas lowers for GPUs (Triton); elsewhere `pallas_mode()` is None and the model falls back to
the einsum path with one log line. Tests run the kernel on CPU with `interpret=True`.
"""

from __future__ import annotations

import functools
import logging

import jax
import jax.numpy as jnp

from bert_jax.core.dropout import _mix, drop_threshold

Array = jax.Array
log = logging.getLogger("bert_jax")

# Tiles: queries per program and keys per step of the online softmax. Triton wants powers of
# two of at least 16; queries and keys are padded up to a multiple (padded keys never count).
BLOCK_Q = 64
BLOCK_K = 64
_fallback_logged = False
# Tests set this to run the kernel in Pallas' interpreter on CPU (slow; never for training).
force_interpret = False


def pallas_mode() -> str | None:
    """ "compiled" where Pallas lowers (GPU), "interpret" when tests force it, else None."""
    if force_interpret:
        return "interpret"
    return "compiled" if jax.default_backend() == "gpu" else None


def log_fallback_once(backend: str) -> None:
    """One line per process: the requested kernel does not run here, the einsum path does."""
    global _fallback_logged
    if not _fallback_logged:
        _fallback_logged = True
        log.warning(
            "attention_impl='pallas' needs a GPU (Pallas' Triton lowering); backend %r runs the "
            "einsum attention (attention_impl='xla') instead, same results",
            backend,
        )


def _hash_bits(words: Array, col: Array, row_word: Array) -> Array:
    """`dropout.hash_bits` at one element: col, the flat index within the batch row, and
    row_word = mix(row ^ k1), precomputed per row."""
    x = _mix(col ^ words[0])
    x = _mix(x ^ row_word)
    return _mix(x ^ words[2])


def reference_attention(
    query: Array,
    key: Array,
    value: Array,
    mask: Array | None,
    words: Array | None,
    rate: float,
) -> Array:
    """The einsum path of `BertSelfAttention` with hash dropout from `words`
    (`dropout.hash_key_words` of the layer's key; None or rate 0: no dropout).
    query [B, Q, H, D], key and value [B, K, H, D], mask broadcastable to [B, H, Q, K]."""
    logits = jnp.einsum("bqhd,bkhd->bhqk", query, key).astype(jnp.float32)
    logits = logits / jnp.sqrt(jnp.float32(query.shape[-1]))
    if mask is not None:
        logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits, axis=-1).astype(query.dtype)
    if words is not None and rate > 0.0:
        b, h, q, k = probs.shape
        col = (
            jax.lax.broadcasted_iota(jnp.uint32, probs.shape, 1) * jnp.uint32(q * k)
            + jax.lax.broadcasted_iota(jnp.uint32, probs.shape, 2) * jnp.uint32(k)
            + jax.lax.broadcasted_iota(jnp.uint32, probs.shape, 3)
        )
        row_word = _mix(jnp.arange(b, dtype=jnp.uint32) ^ words[1])[:, None, None, None]
        keep = _hash_bits(words, col, row_word) >= jnp.uint32(drop_threshold(rate))
        probs = jax.lax.select(keep, probs / (1.0 - rate), jnp.zeros_like(probs))
    return jnp.einsum("bhqk,bkhd->bqhd", probs, value)


def _kernel(
    words_ref,
    q_ref,
    k_ref,
    v_ref,
    mask_ref,
    o_ref,
    *,
    rate: float,
    num_queries: int,
    num_keys: int,
    block_k: int,
):
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    head, q_block = pl.program_id(1), pl.program_id(2)
    block_q = q_ref.shape[0]
    q = q_ref[...]
    scale = 1.0 / float(q.shape[-1]) ** 0.5
    # Flat index of (head, query) in a [heads, queries, keys] batch row, as in dropout.py.
    q_index = q_block * block_q + jnp.arange(block_q, dtype=jnp.int32)
    row_base = (head * num_queries + q_index).astype(jnp.uint32) * jnp.uint32(num_keys)
    threshold = jnp.uint32(drop_threshold(rate))
    big_neg = jnp.finfo(jnp.float32).min

    def body(step, carry):
        acc, m_prev, l_prev = carry
        start = step * block_k
        keys = pl.ds(start, block_k)
        k = k_ref[keys, :]
        v = v_ref[keys, :]
        s = plgpu.dot(q, k, trans_b=True).astype(jnp.float32) * scale
        s = jnp.where(mask_ref[:, keys] != 0, s, big_neg)
        k_index = start + jnp.arange(block_k, dtype=jnp.int32)
        if num_keys % block_k:  # padded keys weigh nothing, not even in a fully masked row
            s = jnp.where((k_index < num_keys)[None, :], s, -jnp.inf)
        m_next = jnp.maximum(m_prev, jnp.max(s, axis=1))
        correction = jnp.exp(m_prev - m_next)
        p = jnp.exp(s - m_next[:, None])
        l_next = l_prev * correction + jnp.sum(p, axis=1)
        if rate > 0.0:
            col = row_base[:, None] + k_index.astype(jnp.uint32)[None, :]
            bits = _hash_bits((words_ref[0], None, words_ref[2]), col, words_ref[1])
            p = jnp.where(bits >= threshold, p, 0.0)
        acc = acc * correction[:, None] + plgpu.dot(p.astype(v.dtype), v).astype(jnp.float32)
        return acc, m_next, l_next

    acc = jnp.zeros((block_q, q.shape[-1]), jnp.float32)
    m = jnp.full((block_q,), -jnp.inf, jnp.float32)
    total = jnp.zeros((block_q,), jnp.float32)
    steps = k_ref.shape[0] // block_k
    acc, m, total = jax.lax.fori_loop(0, steps, body, (acc, m, total))
    out = acc / (total * (1.0 - rate))[:, None]
    o_ref[...] = out.astype(o_ref.dtype)


def _pad(x: Array, axis: int, multiple: int) -> Array:
    extra = -x.shape[axis] % multiple
    if not extra:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths)


def _forward(query, key, value, mask, words, rate, block_q, block_k, interpret):
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    batch, num_queries, heads, head_dim = query.shape
    num_keys = key.shape[1]
    block_q = min(block_q, max(16, pl.next_power_of_2(num_queries)))
    block_k = min(block_k, max(16, pl.next_power_of_2(num_keys)))
    query_p = _pad(query, 1, block_q)
    key_p, value_p = _pad(key, 1, block_k), _pad(value, 1, block_k)
    # Broadcast axes stay size 1 (read as block index 0); the mask travels as int8.
    mask = mask.astype(jnp.int8)
    mb, mh, mq, _ = mask.shape
    mask = _pad(mask, 3, block_k)
    mask_block_q = block_q if mq > 1 else 1
    if mq > 1:
        mask = _pad(mask, 2, block_q)
    # Per batch row: k0, mix(row ^ k1), k2 (the row's part of the hash, computed once), pad.
    rows = _mix(jnp.arange(batch, dtype=jnp.uint32) ^ words[1])
    row_words = jnp.stack(
        [jnp.broadcast_to(words[0], (batch,)), rows, jnp.broadcast_to(words[2], (batch,))]
        + [jnp.zeros((batch,), jnp.uint32)],
        axis=1,
    )
    grid = (batch, heads, query_p.shape[1] // block_q)
    kernel = functools.partial(
        _kernel, rate=rate, num_queries=num_queries, num_keys=num_keys, block_k=block_k
    )
    kv_spec = pl.BlockSpec((None, key_p.shape[1], None, head_dim), lambda b, h, i: (b, 0, h, 0))
    params = {}
    if not interpret:
        params["compiler_params"] = plgpu.CompilerParams(
            num_warps=4 if head_dim <= 64 else 8, num_stages=2
        )
    out = pl.pallas_call(
        kernel,
        grid=grid,
        in_specs=[
            pl.BlockSpec((None, 4), lambda b, h, i: (b, 0)),
            pl.BlockSpec((None, block_q, None, head_dim), lambda b, h, i: (b, i, h, 0)),
            kv_spec,
            kv_spec,
            pl.BlockSpec(
                (None, None, mask_block_q, mask.shape[3]),
                lambda b, h, i: (
                    b if mb > 1 else 0,
                    h if mh > 1 else 0,
                    i if mq > 1 else 0,
                    0,
                ),
            ),
        ],
        out_specs=pl.BlockSpec((None, block_q, None, head_dim), lambda b, h, i: (b, i, h, 0)),
        out_shape=jax.ShapeDtypeStruct(query_p.shape, query.dtype),
        interpret=interpret,
        name="bert_flash_attention",
        **params,
    )(row_words, query_p, key_p, value_p, mask)
    return out[:, :num_queries]


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8))
def _flash(query, key, value, mask, words, rate, block_q, block_k, interpret):
    return _forward(query, key, value, mask, words, rate, block_q, block_k, interpret)


def _flash_fwd(query, key, value, mask, words, rate, block_q, block_k, interpret):
    out = _forward(query, key, value, mask, words, rate, block_q, block_k, interpret)
    return out, (query, key, value, mask, words)


def _flash_bwd(rate, block_q, block_k, interpret, residuals, d_out):
    query, key, value, mask, words = residuals
    _, vjp = jax.vjp(
        lambda q, k, v: reference_attention(q, k, v, mask, words, rate), query, key, value
    )
    return (*vjp(d_out), None, None)


_flash.defvjp(_flash_fwd, _flash_bwd)


def flash_attention(
    query: Array,
    key: Array,
    value: Array,
    mask: Array | None = None,
    *,
    dropout_rate: float = 0.0,
    dropout_words: Array | None = None,
    block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K,
    interpret: bool = False,
) -> Array:
    """Softmax attention, fused, with hash dropout on the probabilities.

    query [B, Q, H, D]; key, value [B, K, H, D]; mask boolean, [B or 1, H or 1, Q or 1, K]
    (True: attend); dropout_words: `dropout.hash_key_words(key)` of the layer's dropout key,
    required when dropout_rate > 0. Returns [B, Q, H, D] in query's dtype, equal to
    `reference_attention` up to float summation order."""
    if not 0.0 <= dropout_rate < 1.0:
        raise ValueError(f"dropout_rate {dropout_rate} is not in [0, 1)")
    if dropout_rate > 0.0 and dropout_words is None:
        raise ValueError("dropout_rate > 0 needs dropout_words")
    if mask is None:
        mask = jnp.ones((1, 1, 1, key.shape[1]), bool)
    if mask.ndim != 4 or mask.shape[3] != key.shape[1]:
        raise ValueError(f"mask {mask.shape} is not [B|1, H|1, Q|1, {key.shape[1]}]")
    words = jnp.zeros((3,), jnp.uint32) if dropout_words is None else dropout_words
    return _flash(query, key, value, mask, words, float(dropout_rate), block_q, block_k, interpret)
