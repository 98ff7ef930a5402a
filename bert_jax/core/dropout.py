"""Dropout whose masks come from a keyed counter hash, computed where they are used.

`jax.random.bernoulli` draws a mask through the key's PRNG: threefry2x32 (20 rounds per pair of
words) or rbg (XLA's RngBitGenerator, which the CPU backend expands into a materialized Philox
stream). In a BERT-Base step at batch 8 x 128 that is ~39M random words per step, and on CPU it
cost 0.8 of 7.2 thread-seconds with rbg (more with threefry). Dropout needs a mask that looks
independent and has the exact rate, not a cryptographic stream, so `impl="hash"` derives three
32-bit words from the layer's key once and hashes each element's coordinates with them:

    x = mix(col ^ k0);  x = mix(x ^ mix(row ^ k1));  bits = mix(x ^ k2)

where `row` is the index along the first (batch) axis, `col` the flat index within a row, and
`mix` the "lowbias32" integer finalizer (xorshift-multiply, a bijection of uint32 with low
avalanche bias; constants from Chris Wellons' hash-prospector). It is ~25 uint32 operations per
element, elementwise, so XLA fuses it into the consumer instead of storing a mask, and the same
element gets the same bit on any mesh, because `iota` is global under SPMD partitioning. An
element is dropped when its word is below round(rate * 2**32): the rate is exact to 2**-32.

The three words of a layer come from the step's dropout key without a PRNG call
(`module_key_words`): Flax's `make_rng` would fold the layer's path into the key (one threefry
hash) and `hash_key_words` draw the words from that (another), two inlined threefry programs per
dropout layer that XLA compiles one by one. Instead the path and draw count, hashed in Python
(SHA-1, as Flax does), become constants that a few `mix` rounds combine with the key's own words:
each layer and draw still gets its own words, every step new ones, and compiling a BERT step
costs about a second less on CPU.

`impl="prng"` is Flax's `nn.Dropout` (same keys, same masks), for runs that want JAX's PRNG.
Both scale the kept values by 1 / (1 - rate).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax.core import scope as flax_scope

from bert_jax.core.prng_impls import DROPOUT_IMPLEMENTATIONS
from bert_jax.runtime.errors import UserError

Array = jax.Array

_WORD = 2**32


def _mix(x: Array) -> Array:
    """lowbias32: a bijective uint32 finalizer (xorshift, odd multiply, twice)."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    return x ^ (x >> 16)


def hash_key_words(key: Array) -> Array:
    """The three uint32 words [k0, k1, k2] that `hash_bits` mixes in, drawn from `key`; fused
    kernels that recompute the masks (`attention.py`) take these words."""
    return jax.random.bits(key, (3,), jnp.uint32)


def module_key_words(module: nn.Module, collection: str) -> Array:
    """The three uint32 words of one draw from `module`'s `collection` rng, as `make_rng` would
    draw it (the module's path and its draw count), without a PRNG call: the path and count
    hashed at trace time, mixed into the words of the key `apply` was given (see the module's
    docstring). Falls back to `hash_key_words(module.make_rng(collection))` where the scope holds
    no key of that collection (Flax then uses "params" or says what is missing). Inside
    `site_constants` (a layer traced once for every layer, `shared_layers.py`) the path's
    constants are that layer's, given as arguments."""
    scope = module.scope
    lazy = scope.rngs.get(collection) if scope is not None else None
    if not isinstance(lazy, flax_scope.LazyRng):
        return hash_key_words(module.make_rng(collection))
    scope.rng_counters[collection] += 1  # as make_rng counts draws
    site = (*lazy.suffix, scope.rng_counters[collection])
    given = _SITE_CONSTANTS.get()
    if given is None:
        return _key_words(lazy.rng, path_constants(site))
    sites_collection, table = given
    if collection != sites_collection or site not in table:
        raise LookupError(
            f"dropout draw {site} ({collection!r}) is not among the shared layer's declared "
            f"sites {sorted(table)} ({sites_collection!r}): declare it in the layer's "
            "DROPOUT_SITES"
        )
    return _key_words(lazy.rng, table[site])


def path_constants(site: tuple[str | int, ...]) -> np.ndarray:
    """Three uint32 constants of a draw `site` (the rng's path, then the draw count), hashed as
    Flax hashes the path it folds into a key (SHA-1 of each part)."""
    digest = hashlib.sha1()
    for part in site:
        digest.update(b"\0")
        if isinstance(part, str):
            digest.update(part.encode("utf-8"))
        else:
            digest.update(int(part).to_bytes(8, "big", signed=True))
    return np.frombuffer(digest.digest()[:12], ">u4").astype(np.uint32).reshape(3)


# (collection, {site: constants}) while a shared layer is traced (`site_constants`).
_SITE_CONSTANTS: contextvars.ContextVar[tuple[str, dict] | None] = contextvars.ContextVar(
    "dropout_site_constants", default=None
)


@contextlib.contextmanager
def site_constants(collection: str, table: dict[tuple, Array]) -> Iterator[None]:
    """Within: `module_key_words` of `collection` takes each site's constants from `table`
    (site relative to the traced layer -> its [3] uint32 constants, an argument of the trace)
    instead of hashing the path, so one trace serves every layer with each layer's own masks."""
    token = _SITE_CONSTANTS.set((collection, table))
    try:
        yield
    finally:
        _SITE_CONSTANTS.reset(token)


@jax.jit
def _key_words(key: Array, c: Array) -> Array:
    """`module_key_words`' mixing of the key's words with the path's constants `c`. Jitted: a
    step's dropout layers share one traced program instead of each tracing its own ops."""
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    data = key.reshape(-1).astype(jnp.uint32)
    # Three lanes at once, each its own constant: every word depends on every word of the key.
    words = _mix(data[0] ^ c)
    for i in range(1, data.shape[0]):
        words = _mix(words ^ data[i] ^ jnp.roll(c, i))
    return words


@functools.partial(jax.jit, static_argnums=1)
def hash_bits(words: Array, shape: tuple[int, ...]) -> Array:
    """uint32 words of `shape`, a hash of each element's (row, column-in-row) coordinates keyed
    by the three `words` (`module_key_words`, or `hash_key_words` of a key). Jitted, the shape
    static: a step's dropout layers of one shape trace it once."""
    shape = tuple(int(d) for d in shape)
    if not shape:
        return hash_bits(words, (1,)).reshape(())
    row_size = 1
    for d in shape[1:]:
        row_size *= d
    if row_size >= _WORD or shape[0] >= _WORD:
        raise UserError(
            f"hash dropout counts elements in uint32: shape {shape} has {row_size} elements per "
            f"row of axis 0 (at most {_WORD - 1}); use dropout_impl='prng' for this shape"
        )
    k0, k1, k2 = words[0], words[1], words[2]
    col = jnp.zeros(shape, jnp.uint32)
    stride = 1
    for axis in range(len(shape) - 1, 0, -1):
        col = col + jax.lax.broadcasted_iota(jnp.uint32, shape, axis) * jnp.uint32(stride)
        stride *= shape[axis]
    # One word per row, broadcast over it.
    row = jax.lax.broadcasted_iota(jnp.uint32, (shape[0],) + (1,) * (len(shape) - 1), 0)
    x = _mix(col ^ k0)
    x = _mix(x ^ _mix(row ^ k1))
    return _mix(x ^ k2)


def drop_threshold(rate: float) -> int:
    """The uint32 threshold below which an element is dropped: P(drop) = threshold / 2**32."""
    return min(round(rate * _WORD), _WORD - 1)


class Dropout(nn.Module):
    """Inverted dropout: zeroes each element with probability `rate`, scales the rest by
    1 / (1 - rate). `impl`: "hash" (keyed counter hash, see the module docstring) or "prng"
    (`jax.random.bernoulli`, exactly Flax's `nn.Dropout`)."""

    rate: float
    impl: str = "hash"
    rng_collection: str = "dropout"

    @nn.compact
    def __call__(self, inputs: Array, deterministic: bool) -> Array:
        if not 0.0 <= self.rate <= 1.0:
            raise UserError(f"dropout rate {self.rate} is not in [0, 1]")
        if self.impl not in DROPOUT_IMPLEMENTATIONS:
            raise UserError(f"dropout impl {self.impl!r} is not one of {DROPOUT_IMPLEMENTATIONS}")
        if deterministic or self.rate == 0.0:
            return inputs
        if self.rate == 1.0:
            return jnp.zeros_like(inputs)
        keep_prob = 1.0 - self.rate
        if self.impl == "hash":
            bits = hash_bits(self.key_words(), inputs.shape)
            keep = bits >= jnp.uint32(drop_threshold(self.rate))
        else:
            keep = jax.random.bernoulli(self.make_rng(self.rng_collection), keep_prob, inputs.shape)
        return jax.lax.select(keep, inputs / keep_prob, jnp.zeros_like(inputs))

    def key_words(self) -> Array:
        """The hash words `__call__` would draw (`module_key_words`): a fused kernel that applies
        this dropout itself (`attention.py`) takes them from a `Dropout` named as the one it
        replaces, so both paths drop the same elements."""
        return module_key_words(self, self.rng_collection)
