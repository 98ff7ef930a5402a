"""The compiled Pallas attention kernel against the einsum path, on a GPU (a child of
tests/test_attention.py, and the first thing benchmarks/gpu.sh runs).

    python -m tests.pallas_gpu_check [--quick]

Prints one line per case: the max abs difference of the output and of the gradients, dropout off
and on, float32 and bfloat16, at BERT's shapes (head dim 64, seq 128 and 512, padding, packed
segments, a causal mask, the last layer's gathered queries). Exits 1 when a case is off by more
than its tolerance, 2 when no GPU is visible. `--quick` (benchmarks/gpu.sh): bfloat16 only, padded
seq 128 and packed seq 512 with gathered queries.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.core import attention
from bert_jax.core.dropout import hash_key_words
from bert_jax.core.model import attention_mask

# Max abs difference allowed (outputs are O(1)): float32 matmuls may run as TF32 on both sides.
TOLERANCE = {jnp.float32: 2e-2, jnp.bfloat16: 6e-2}


def cases(rng):
    for seq_len, queries in ((128, None), (512, None), (512, 81)):
        batch, heads = 4, 4
        lengths = rng.integers(seq_len // 2, seq_len + 1, size=batch)
        input_mask = jnp.asarray(np.arange(seq_len)[None, :] < lengths[:, None])
        segments = jnp.asarray(np.cumsum(rng.random((batch, seq_len)) < 0.01, axis=1), jnp.int32)
        positions = None
        if queries:
            positions = jnp.asarray(
                np.sort(rng.integers(0, seq_len, size=(batch, queries)), axis=1), jnp.int32
            )
        masks = {
            "padding": attention_mask(input_mask),
            "packed": attention_mask(input_mask, segments, positions),
        }
        if not queries:
            causal = jnp.asarray(np.tril(np.ones((seq_len, seq_len), bool)))[None, None]
            masks["causal"] = jnp.logical_and(causal, masks["padding"])
        num_queries = queries or seq_len
        for name, mask in masks.items():
            yield f"s{seq_len} q{num_queries} {name}", (batch, num_queries, seq_len, heads), mask


def _reference(q, k, v, mask, dropout_rate, dropout_words):
    return attention.reference_attention(q, k, v, mask, dropout_words, dropout_rate)


def _step(fn, mask, words, weights, rate):
    """Jitted loss and gradients through `fn` (the kernel or the einsum form)."""

    def loss(q, k, v):
        out = fn(q, k, v, mask, dropout_rate=rate, dropout_words=words)
        return jnp.sum(out.astype(jnp.float32) * weights), out

    return jax.jit(jax.value_and_grad(loss, (0, 1, 2), has_aux=True))


def main(argv: list[str] | None = None) -> int:
    quick = "--quick" in (sys.argv[1:] if argv is None else argv)
    if jax.default_backend() != "gpu":
        print(f"no GPU (backend {jax.default_backend()})")
        return 2
    rng = np.random.default_rng(0)
    words = hash_key_words(jax.random.key(42))
    failed = 0
    for name, (batch, queries, keys, heads), mask in cases(rng):
        if quick and name not in ("s128 q128 padding", "s512 q81 packed"):
            continue
        for dtype in (jnp.bfloat16,) if quick else (jnp.float32, jnp.bfloat16):
            q, k, v = (
                jnp.asarray(rng.normal(size=(batch, n, heads, 64)), dtype)
                for n in (queries, keys, keys)
            )
            weights = jnp.asarray(rng.normal(size=q.shape), jnp.float32)
            for rate in (0.0, 0.1):
                fused = _step(attention.flash_attention, mask, words, weights, rate)
                ref = _step(_reference, mask, words, weights, rate)
                (_, out_f), grads_f = fused(q, k, v)
                (_, out_r), grads_r = ref(q, k, v)
                out_err = float(jnp.max(jnp.abs(out_f.astype(jnp.float32) - out_r)))
                grad_err = max(
                    float(jnp.max(jnp.abs(a.astype(jnp.float32) - b)))
                    / (1 + float(jnp.max(jnp.abs(b))))
                    for a, b in zip(grads_f, grads_r, strict=True)
                )
                ok = out_err <= TOLERANCE[dtype] and grad_err <= TOLERANCE[dtype]
                failed += not ok
                print(
                    f"{'ok ' if ok else 'BAD'} {name:24s} {jnp.dtype(dtype).name:8s} "
                    f"dropout {rate}: out max abs diff {out_err:.2e}, grad (relative to max) "
                    f"{grad_err:.2e}",
                    flush=True,
                )
    verdict = "FAILED" if failed else "all cases equal the einsum path"
    print(f"pallas attention on GPU ({attention.backward} backward): {verdict}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
