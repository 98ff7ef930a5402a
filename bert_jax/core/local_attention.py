"""Sliding-window attention computed in blocks: each block of queries meets only the keys its
window can reach, so a layer's work grows with length x window instead of length squared.

The rows are cut into blocks of `window` queries (the last one padded). Block n holds queries
[n*C, (n+1)*C) and meets keys [n*C - h, (n+1)*C + h), h = window // 2: the last h keys of the
block before, its own C and the first h of the block after, taken from a padded copy of the keys
by reshape, slice and concatenate (no per-element gathers). That is C + 2h = 2C keys per query
instead of the row's length. Each (block, query, key) is then masked exactly as `sliding_window`
masks the full [q, k] matrix: the key is a real token (`input_mask`), of the query's instance
(`packed_segment_ids`) and |q - k| <= h in row positions. The blocks go through `attend` as a
batch of B x N short rows, so every attention implementation (einsums, XLA or cuDNN fused, the
Pallas kernel) and both dropout implementations work on them unchanged.

Equal to the masked full matrix to float32 rounding at every position, padding included: a
query that sees no key at all (a padding position farther than h from every real token of its
instance) takes, as there, the average of the whole row's values (its scores are all equally
masked), not of its band's. One difference: dropout draws its mask over the blocked
[B*N, H, C, 2C] probabilities, so with `hash` the element coordinates are not those of the full
[B, H, L, L] matrix and the dropped set differs from the full path's (still exact-rate and the
same on any mesh); with `prng` it is another draw. The full path stays `attend` under
`modernbert.sliding_window`'s mask, which tests compare against with dropout off.

`use_bands(length, window)` is the one rule for when the blocks are used; `modernbert.py` asks
it once per model call.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from bert_jax.core.attend import attend

Array = jax.Array

# Bands pay once a row holds four windows: each query then meets 2 x window keys instead of
# >= 4 x window, and the blocking's copies (keys twice over, the padded tail) are small beside
# the scores saved. Shorter rows keep the masked full matrix, one fused einsum.
MIN_WINDOWS_PER_ROW = 4


def use_bands(length: int, window: int) -> bool:
    """Whether sliding-window layers of rows of `length` compute in blocks (`attend_in_bands`)
    rather than as a mask over full attention (`modernbert.sliding_window`)."""
    return length >= MIN_WINDOWS_PER_ROW * window


@struct.dataclass
class BandMask:
    """The blocked sliding-window mask: `keep` [B, N, 1, C, C + 2h], True where query c of block
    n may attend to key j of its band (row position n*C - h + j); `window` static."""

    keep_BxNx1xCxW: Array
    window: int = struct.field(pytree_node=False)


def _block_size(window: int) -> int:
    return window


def _halo(window: int) -> int:
    return window // 2


def _bands(x_BxL: Array, block: int, halo: int) -> Array:
    """[B, N, C + 2*halo, ...]: for each block of C row positions, the positions from halo
    before it to halo after it (zeros beyond the row), by pad, reshape, slice, concatenate."""
    length = x_BxL.shape[1]
    num_blocks = -(-length // block)
    widths = [(0, 0)] * x_BxL.ndim
    widths[1] = (block, num_blocks * block - length + block)
    padded = jnp.pad(x_BxL, widths)
    blocks = padded.reshape(x_BxL.shape[0], num_blocks + 2, block, *x_BxL.shape[2:])
    before = blocks[:, :num_blocks, block - halo :]
    after = blocks[:, 2:, :halo]
    return jnp.concatenate([before, blocks[:, 1 : num_blocks + 1], after], axis=2)


def _query_blocks(x_BxL: Array, block: int) -> Array:
    """[B, N, C, ...]: the row cut into blocks of C positions, the last padded with zeros."""
    length = x_BxL.shape[1]
    num_blocks = -(-length // block)
    widths = [(0, 0)] * x_BxL.ndim
    widths[1] = (0, num_blocks * block - length)
    padded = jnp.pad(x_BxL, widths)
    return padded.reshape(x_BxL.shape[0], num_blocks, block, *x_BxL.shape[2:])


def band_mask(input_mask: Array, packed_segment_ids: Array | None, window: int) -> BandMask:
    """The sliding-window mask of rows [B, L] in blocks: real keys, of the query's instance when
    rows are packed, at most window // 2 row positions away (`modernbert.sliding_window`'s
    definition)."""
    length = input_mask.shape[1]
    block, halo = _block_size(window), _halo(window)
    num_blocks = -(-length // block)
    # Row positions of each block's queries and band keys: static, so the |q - k| test folds.
    queries = np.arange(num_blocks)[:, None] * block + np.arange(block)[None, :]
    keys = np.arange(num_blocks)[:, None] * block - halo + np.arange(block + 2 * halo)[None, :]
    near = np.abs(queries[:, :, None] - keys[:, None, :]) <= halo
    # Keys beyond the row pad as 0: hidden like padding.
    keep = _bands(input_mask.astype(bool), block, halo)[:, :, None, :]
    keep = jnp.logical_and(keep, jnp.asarray(near)[None])
    if packed_segment_ids is not None:
        query_ids = _query_blocks(packed_segment_ids, block)
        key_ids = _bands(packed_segment_ids, block, halo)
        keep = jnp.logical_and(keep, query_ids[:, :, :, None] == key_ids[:, :, None, :])
    keep = keep[:, :, None]
    keep = nn.with_logical_constraint(keep, ("batch", "length", None, None, None))
    return BandMask(keep, window=window)


def attend_in_bands(
    query_BxLxHxK: Array,
    key_BxLxHxK: Array,
    value_BxLxHxK: Array,
    band: BandMask,
    **attend_settings,
) -> Array:
    """Sliding-window attention [B, L, H, K] over `band`'s blocks: `attend` (with the same
    settings: implementation, dropout, dtype) on B x N rows of C queries and C + 2h keys."""
    batch, length, heads, head_dim = query_BxLxHxK.shape
    block, halo = _block_size(band.window), _halo(band.window)
    axes = ("batch", "length", None, "heads", "kv")
    query = nn.with_logical_constraint(_query_blocks(query_BxLxHxK, block), axes)
    key = nn.with_logical_constraint(_bands(key_BxLxHxK, block, halo), axes)
    value = nn.with_logical_constraint(_bands(value_BxLxHxK, block, halo), axes)
    num_blocks, width = key.shape[1], key.shape[2]
    rows = batch * num_blocks
    context = attend(
        query.reshape(rows, block, heads, head_dim),
        key.reshape(rows, width, heads, head_dim),
        value.reshape(rows, width, heads, head_dim),
        band.keep_BxNx1xCxW.reshape(rows, 1, block, width),
        **attend_settings,
    )
    context = context.reshape(batch, num_blocks, block, heads, head_dim)
    # A query that sees nothing: the full matrix's softmax over equally masked scores, the row's
    # mean value (padding positions that, e.g., SQuAD's loss reads).
    row_mean = jnp.mean(value_BxLxHxK.astype(jnp.float32), axis=1).astype(context.dtype)
    sees = jnp.any(band.keep_BxNx1xCxW[:, :, 0], axis=-1)[:, :, :, None, None]
    context = jnp.where(sees, context, row_mean[:, None, None, :, :])
    context = nn.with_logical_constraint(context, axes)
    return context.reshape(batch, num_blocks * block, heads, head_dim)[:, :length]
