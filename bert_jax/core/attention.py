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
- backward (`jax.custom_vjp`): two Pallas kernels, dK/dV (per key block, over the queries) and
  dQ (per query block, over the keys), that recompute each probability tile from the forward
  pass's row max and sum and the same dropout bits, FlashAttention-2 style; nothing of size
  [queries, keys] is stored either way. `backward = "reference"` (or the environment's
  BERT_JAX_ATTENTION_BACKWARD=reference) takes `jax.vjp` of the einsum form instead.

Pallas lowers for GPUs (Triton); elsewhere `pallas_mode()` is None and the model falls back to
the einsum path with one log line. Tests run the kernel on CPU with `interpret=True`.
"""

from __future__ import annotations

import functools
import logging
import os

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
# The backward pass: "pallas" (the dK/dV and dQ kernels) or "reference" (jax.vjp of the einsum
# form, which stores the probabilities), e.g. BERT_JAX_ATTENTION_BACKWARD=reference on a GPU
# where the backward kernels fail tests/pallas_gpu_check.py (benchmarks/gpu.sh does that).
backward = os.environ.get("BERT_JAX_ATTENTION_BACKWARD", "pallas")


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
    (`Dropout.key_words` of the layer; None or rate 0: no dropout).
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


def _tile(q, k, mask, words_ref, row_base, k_index, *, rate, num_keys):
    """One [queries, keys] tile: the masked, scaled logits and (rate > 0) the kept elements."""
    from jax.experimental.pallas import triton as plgpu

    s = plgpu.dot(q, k, trans_b=True).astype(jnp.float32) * (1.0 / float(q.shape[-1]) ** 0.5)
    s = jnp.where(mask != 0, s, jnp.finfo(jnp.float32).min)
    if num_keys % k.shape[0]:  # padded keys weigh nothing, even in a fully masked row
        s = jnp.where((k_index < num_keys)[None, :], s, -jnp.inf)
    keep = None
    if rate > 0.0:
        col = row_base[:, None] + k_index.astype(jnp.uint32)[None, :]
        bits = _hash_bits((words_ref[0], None, words_ref[2]), col, words_ref[1])
        keep = bits >= jnp.uint32(drop_threshold(rate))
    return s, keep


def _row_base(head, q_index, num_queries: int, num_keys: int):
    """Flat index of (head, query, key 0) within a [heads, queries, keys] batch row (dropout.py)."""
    return (head * num_queries + q_index).astype(jnp.uint32) * jnp.uint32(num_keys)


def _forward_kernel(words_ref, q_ref, k_ref, v_ref, mask_ref, o_ref, max_ref, sum_ref, **static):
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    rate, block_k = static["rate"], static["block_k"]
    block_q = q_ref.shape[0]
    q = q_ref[...]
    q_index = pl.program_id(2) * block_q + jnp.arange(block_q, dtype=jnp.int32)
    row_base = _row_base(pl.program_id(1), q_index, static["num_queries"], static["num_keys"])

    def body(step, carry):
        acc, m_prev, l_prev = carry
        keys = pl.ds(step * block_k, block_k)
        k_index = step * block_k + jnp.arange(block_k, dtype=jnp.int32)
        s, keep = _tile(
            q, k_ref[keys, :], mask_ref[:, keys], words_ref, row_base, k_index,
            rate=rate, num_keys=static["num_keys"],
        )  # fmt: skip
        m_next = jnp.maximum(m_prev, jnp.max(s, axis=1))
        correction = jnp.exp(m_prev - m_next)
        p = jnp.exp(s - m_next[:, None])
        l_next = l_prev * correction + jnp.sum(p, axis=1)
        if keep is not None:
            p = jnp.where(keep, p, 0.0)
        v = v_ref[keys, :]
        acc = acc * correction[:, None] + plgpu.dot(p.astype(v.dtype), v).astype(jnp.float32)
        return acc, m_next, l_next

    acc = jnp.zeros((block_q, q.shape[-1]), jnp.float32)
    m = jnp.full((block_q,), -jnp.inf, jnp.float32)
    total = jnp.zeros((block_q,), jnp.float32)
    acc, m, total = jax.lax.fori_loop(0, k_ref.shape[0] // block_k, body, (acc, m, total))
    o_ref[...] = (acc / (total * (1.0 - rate))[:, None]).astype(o_ref.dtype)
    # The backward pass recomputes p = exp(s - max) / sum. (A log-sum-exp would lose a fully
    # masked row: max + log(sum) rounds to max at the mask value's magnitude.)
    max_ref[...] = m
    sum_ref[...] = total


def _grad_tile(q, k, v, do, stats, delta, mask, words_ref, row_base, k_index, **static):
    """Recomputed probabilities p, their dropped and rescaled form, and the logits' gradient."""
    from jax.experimental.pallas import triton as plgpu

    rate = static["rate"]
    s, keep = _tile(
        q, k, mask, words_ref, row_base, k_index, rate=rate, num_keys=static["num_keys"]
    )
    p = jnp.exp(s - stats[0][:, None]) / stats[1][:, None]
    dp = plgpu.dot(do, v, trans_b=True).astype(jnp.float32)
    dropped = p
    if keep is not None:
        dropped = jnp.where(keep, p, 0.0) / (1.0 - rate)
        dp = jnp.where(keep, dp, 0.0) / (1.0 - rate)
    # Softmax backward; the einsum form's where(mask, ...) passes no gradient to masked logits.
    ds = jnp.where(mask != 0, p * (dp - delta[:, None]), 0.0)
    return dropped, ds


def _dkdv_kernel(words_ref, q_ref, k_ref, v_ref, mask_ref, do_ref, max_ref, sum_ref, delta_ref,
                 dk_ref, dv_ref, **static):  # fmt: skip
    """One block of keys: loops over the query blocks, accumulating dK and dV."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    block_q, block_k = static["block_q"], k_ref.shape[0]
    k, v = k_ref[...], v_ref[...]
    head = pl.program_id(1)  # read outside the loop: the interpreter cannot inside it
    k_index = pl.program_id(2) * block_k + jnp.arange(block_k, dtype=jnp.int32)
    scale = 1.0 / float(k.shape[-1]) ** 0.5

    def body(step, carry):
        dk, dv = carry
        rows = pl.ds(step * block_q, block_q)
        q_index = step * block_q + jnp.arange(block_q, dtype=jnp.int32)
        row_base = _row_base(head, q_index, static["num_queries"], static["num_keys"])
        mask = mask_ref[rows, :] if mask_ref.shape[0] > 1 else mask_ref[...]
        q, do = q_ref[rows, :], do_ref[rows, :]
        dropped, ds = _grad_tile(
            q, k, v, do, (max_ref[rows], sum_ref[rows]), delta_ref[rows], mask, words_ref,
            row_base, k_index,
            **static,
        )  # fmt: skip
        dv = dv + plgpu.dot(dropped.astype(do.dtype), do, trans_a=True).astype(jnp.float32)
        dk = dk + plgpu.dot(ds.astype(q.dtype), q, trans_a=True).astype(jnp.float32)
        return dk, dv

    zeros = jnp.zeros(k.shape, jnp.float32)
    dk, dv = jax.lax.fori_loop(0, q_ref.shape[0] // block_q, body, (zeros, zeros))
    dk_ref[...] = (dk * scale).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


def _dq_kernel(
    words_ref, q_ref, k_ref, v_ref, mask_ref, do_ref, max_ref, sum_ref, delta_ref, dq_ref, **static
):
    """One block of queries: loops over the key blocks, accumulating dQ."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    block_q, block_k = q_ref.shape[0], static["block_k"]
    q, do, delta = q_ref[...], do_ref[...], delta_ref[...]
    stats = max_ref[...], sum_ref[...]
    q_index = pl.program_id(2) * block_q + jnp.arange(block_q, dtype=jnp.int32)
    row_base = _row_base(pl.program_id(1), q_index, static["num_queries"], static["num_keys"])

    def body(step, dq):
        keys = pl.ds(step * block_k, block_k)
        k_index = step * block_k + jnp.arange(block_k, dtype=jnp.int32)
        k = k_ref[keys, :]
        _, ds = _grad_tile(
            q, k, v_ref[keys, :], do, stats, delta, mask_ref[:, keys], words_ref, row_base,
            k_index, **static,
        )  # fmt: skip
        return dq + plgpu.dot(ds.astype(k.dtype), k).astype(jnp.float32)

    dq = jax.lax.fori_loop(0, k_ref.shape[0] // block_k, body, jnp.zeros(q.shape, jnp.float32))
    dq_ref[...] = (dq * (1.0 / float(q.shape[-1]) ** 0.5)).astype(dq_ref.dtype)


def _pad(x: Array, axis: int, multiple: int) -> Array:
    extra = -x.shape[axis] % multiple
    if not extra:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths)


def _call(kernel, args, grid, in_specs, out_specs, out_shape, interpret, head_dim, name):
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    params = {}
    if not interpret:
        warps = 4 if head_dim <= 64 else 8
        params["compiler_params"] = plgpu.CompilerParams(num_warps=warps, num_stages=2)
    specs = dict(in_specs=in_specs, out_specs=out_specs, out_shape=out_shape)
    return pl.pallas_call(kernel, grid=grid, interpret=interpret, name=name, **specs, **params)(
        *args
    )


def _layout(query, key, mask, words, block_q, block_k):
    """Block sizes, padded shapes, the int8 mask and the per-row hash words, shared by the
    forward and backward calls."""
    from jax.experimental import pallas as pl

    batch, num_queries, heads, head_dim = query.shape
    num_keys = key.shape[1]
    block_q = min(block_q, max(16, pl.next_power_of_2(num_queries)))
    block_k = min(block_k, max(16, pl.next_power_of_2(num_keys)))
    # Broadcast axes of the mask stay size 1 (block index 0); it travels as int8.
    mask = _pad(mask.astype(jnp.int8), 3, block_k)
    if mask.shape[2] > 1:
        mask = _pad(mask, 2, block_q)
    # Per batch row: k0, mix(row ^ k1) (the row's part of the hash, computed once), k2, 0.
    rows = _mix(jnp.arange(batch, dtype=jnp.uint32) ^ words[1])
    row_words = jnp.stack(
        [jnp.full((batch,), words[0]), rows, jnp.full((batch,), words[2]), rows * 0], axis=1
    )
    padded_q = num_queries + -num_queries % block_q
    padded_k = num_keys + -num_keys % block_k
    static = dict(num_queries=num_queries, num_keys=num_keys, block_q=block_q, block_k=block_k)
    return mask, row_words, (batch, heads, head_dim, padded_q, padded_k), static


def _specs(mask, dims, static, by_keys: bool):
    """BlockSpecs for a grid over (row, head, block of queries or, by_keys, of keys)."""
    from jax.experimental import pallas as pl

    _, _, head_dim, padded_q, padded_k = dims
    bq, bk = static["block_q"], static["block_k"]
    mb, mh, mq, _ = mask.shape

    def mask_index(b, h, i):
        q_block = 0 if by_keys or mq == 1 else i
        return (b if mb > 1 else 0, h if mh > 1 else 0, q_block, i if by_keys else 0)

    mask_block = (padded_q if mq > 1 else 1, bk) if by_keys else (bq if mq > 1 else 1, padded_k)

    def rows(n, blocked):  # [B, n, H, D] operands, whole or one block
        if blocked:
            return pl.BlockSpec((None, n, None, head_dim), lambda b, h, i: (b, i, h, 0))
        return pl.BlockSpec((None, n, None, head_dim), lambda b, h, i: (b, 0, h, 0))

    def stats(n, blocked):  # [B, H, Q] operands (log-sum-exp, delta)
        return pl.BlockSpec((None, None, n), lambda b, h, i: (b, h, i if blocked else 0))

    q_spec = rows(padded_q, False) if by_keys else rows(bq, True)
    kv_spec = rows(bk, True) if by_keys else rows(padded_k, False)
    stat_spec = stats(padded_q, False) if by_keys else stats(bq, True)
    return {
        "words": pl.BlockSpec((None, 4), lambda b, h, i: (b, 0)),
        "q": q_spec,
        "kv": kv_spec,
        "mask": pl.BlockSpec((None, None, *mask_block), mask_index),
        "stat": stat_spec,
    }


def _forward(query, key, value, mask, words, rate, block_q, block_k, interpret):
    mask, row_words, dims, static = _layout(query, key, mask, words, block_q, block_k)
    batch, heads, head_dim, padded_q, padded_k = dims
    specs = _specs(mask, dims, static, by_keys=False)
    query_p = _pad(query, 1, static["block_q"])
    key_p, value_p = _pad(key, 1, static["block_k"]), _pad(value, 1, static["block_k"])
    out, row_max, row_sum = _call(
        functools.partial(_forward_kernel, rate=rate, **static),
        (row_words, query_p, key_p, value_p, mask),
        (batch, heads, padded_q // static["block_q"]),
        [specs["words"], specs["q"], specs["kv"], specs["kv"], specs["mask"]],
        [specs["q"], specs["stat"], specs["stat"]],
        [jax.ShapeDtypeStruct(query_p.shape, query.dtype)]
        + [jax.ShapeDtypeStruct((batch, heads, padded_q), jnp.float32)] * 2,
        interpret,
        head_dim,
        "bert_flash_attention",
    )
    return out, (row_max, row_sum)


def _backward(
    query, key, value, mask, words, out_p, stats, d_out, rate, block_q, block_k, interpret
):
    mask, row_words, dims, static = _layout(query, key, mask, words, block_q, block_k)
    batch, heads, head_dim, padded_q, padded_k = dims
    query_p, d_out_p = _pad(query, 1, static["block_q"]), _pad(d_out, 1, static["block_q"])
    key_p, value_p = _pad(key, 1, static["block_k"]), _pad(value, 1, static["block_k"])
    # delta = rowsum(dO * O) = rowsum(dP * P), dropout or not: the softmax gradient's shift.
    delta = jnp.einsum("bqhd,bqhd->bhq", d_out_p.astype(jnp.float32), out_p.astype(jnp.float32))
    args = (row_words, query_p, key_p, value_p, mask, d_out_p, *stats, delta)
    by_keys = _specs(mask, dims, static, by_keys=True)
    in_specs = [by_keys[n] for n in ("words", "q", "kv", "kv", "mask", "q", "stat", "stat", "stat")]
    d_key, d_value = _call(
        functools.partial(_dkdv_kernel, rate=rate, **static),
        args,
        (batch, heads, padded_k // static["block_k"]),
        in_specs,
        [by_keys["kv"], by_keys["kv"]],
        [jax.ShapeDtypeStruct(key_p.shape, key.dtype)] * 2,
        interpret,
        head_dim,
        "bert_flash_attention_dkdv",
    )
    by_queries = _specs(mask, dims, static, by_keys=False)
    in_specs = [
        by_queries[n] for n in ("words", "q", "kv", "kv", "mask", "q", "stat", "stat", "stat")
    ]
    d_query = _call(
        functools.partial(_dq_kernel, rate=rate, **static),
        args,
        (batch, heads, padded_q // static["block_q"]),
        in_specs,
        by_queries["q"],
        jax.ShapeDtypeStruct(query_p.shape, query.dtype),
        interpret,
        head_dim,
        "bert_flash_attention_dq",
    )
    num_queries, num_keys = query.shape[1], key.shape[1]
    return d_query[:, :num_queries], d_key[:, :num_keys], d_value[:, :num_keys]


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8))
def _flash(query, key, value, mask, words, rate, block_q, block_k, interpret):
    out, _ = _forward(query, key, value, mask, words, rate, block_q, block_k, interpret)
    return out[:, : query.shape[1]]


def _flash_fwd(query, key, value, mask, words, rate, block_q, block_k, interpret):
    out, stats = _forward(query, key, value, mask, words, rate, block_q, block_k, interpret)
    return out[:, : query.shape[1]], (query, key, value, mask, words, out, stats)


def _flash_bwd(rate, block_q, block_k, interpret, residuals, d_out):
    query, key, value, mask, words, out, stats = residuals
    if backward == "reference":
        _, vjp = jax.vjp(
            lambda q, k, v: reference_attention(q, k, v, mask, words, rate), query, key, value
        )
        grads = vjp(d_out)
    else:
        grads = _backward(
            query, key, value, mask, words, out, stats, d_out, rate, block_q, block_k, interpret
        )
    return (*grads, None, None)


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
    (True: attend); dropout_words: the layer's three hash words (`Dropout.key_words`),
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
