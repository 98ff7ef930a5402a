"""An encoder's identical layers traced once: `apply_shared` runs a layer module on one layer's
params through a `jax.jit` function that every layer of the same shape and settings calls.

Tracing a step is Python work on one core before XLA starts, and a Linen encoder traces each
layer again (about 0.16 s a layer for MiniLM's; 12 or 24 for BERT-Base or Large). Called as a
jitted function, a layer is traced (and lowered) once and every other layer reuses that trace,
in the forward, its linearization and its transpose alike; XLA inlines the calls, so the
compiled program is the one the layers would have made one by one.

Each layer still draws its own dropout masks, exactly those of the unshared layer: the hash
words of a draw come from the key and the draw's path (`dropout.module_key_words`), and the
path's part is hashed outside the trace for every site the layer declares (`dropout_sites`:
relative path -> number of draws) and given as an argument (`dropout.site_constants`). A draw
at a site not declared is an error at trace time, not a different mask.

The unshared module path stays where sharing cannot give the same result: at `init` (the
params are made there), under a mutable collection, and for active dropout drawn from JAX's
PRNG (`dropout_impl="prng"` folds the path into the key inside the trace).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from flax.core import scope as flax_scope

from bert_jax.core import dropout

Array = jax.Array

DROPOUT = "dropout"


def can_share(parent: nn.Module, name: str, *, dropout_active: bool, dropout_impl: str) -> bool:
    """Whether `parent`'s child layer `name` may run shared (see the module docstring); the
    module path otherwise, which also says what is wrong where params or keys are missing."""
    if parent.is_initializing() or parent.scope.mutable:
        return False
    if name not in parent.variables.get("params", {}):
        return False
    if not dropout_active:
        return True
    lazy = parent.scope.rngs.get(DROPOUT)
    return dropout_impl == "hash" and isinstance(lazy, flax_scope.LazyRng)


def apply_shared(
    parent: nn.Module,
    layer: nn.Module,
    name: str,
    *args: Any,
    deterministic: bool,
    dropout_sites: Mapping[tuple[str, ...], int],
    remat_policy: Any = None,
    remat: bool = False,
    **kwargs: Any,
) -> Any:
    """`layer` (unbound, hashable: its fields are its settings) applied as `parent`'s child
    `name`: `layer.apply` on that child's params, `*args`, `deterministic` and `**kwargs`
    (arrays or None), under jax.checkpoint with `remat_policy` when `remat`. Call where
    `can_share` says so."""
    params = parent.variables["params"][name]
    key, constants, sites = None, None, ()
    lazy = parent.scope.rngs.get(DROPOUT)
    if not deterministic and isinstance(lazy, flax_scope.LazyRng):
        sites = tuple(
            (*path, draw)
            for path, draws in sorted(dropout_sites.items())
            for draw in range(1, draws + 1)
        )
        prefix = (*lazy.suffix, name)
        key = lazy.rng
        constants = np.stack([dropout.path_constants((*prefix, *site)) for site in sites])
    return _apply(
        params,
        args,
        kwargs,
        key,
        constants,
        layer=layer,
        deterministic=deterministic,
        sites=sites,
        rules=_hashable(nn.get_logical_axis_rules()),
        remat=remat,
        remat_policy=remat_policy,
    )


@functools.partial(
    jax.jit, static_argnames=("layer", "deterministic", "sites", "rules", "remat", "remat_policy")
)
def _apply(
    params, args, kwargs, key, constants, *, layer, deterministic, sites, rules, remat, remat_policy
):
    """The shared trace: jit caches it by the arguments' shapes and the static settings (the
    logical axis rules among them, which Flax keeps outside JAX's trace context)."""

    def run(params, args, kwargs, key, constants):
        table = {} if constants is None else {site: constants[i] for i, site in enumerate(sites)}
        rngs = {} if key is None else {DROPOUT: key}
        with nn.logical_axis_rules(rules), dropout.site_constants(DROPOUT, table):
            return layer.apply(
                {"params": params}, *args, deterministic=deterministic, rngs=rngs, **kwargs
            )

    if remat:
        run = jax.checkpoint(run, policy=remat_policy)
    return run(params, args, kwargs, key, constants)


def _hashable(rules: Any) -> tuple:
    """The logical axis rules as nested tuples (a jit static argument)."""
    return tuple((name, tuple(axes) if isinstance(axes, list) else axes) for name, axes in rules)
