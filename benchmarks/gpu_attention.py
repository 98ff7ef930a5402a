"""Fused attention on a GPU (a check and a benchmark, not a test: CI has no GPU).

    python benchmarks/gpu_attention.py [--seq-lens 128 512] [--batch 32] [--json OUT.json]

For each `model.attention_impl` (`xla`: the explicit einsum form; `dot_product`:
`jax.nn.dot_product_attention` through XLA; `cudnn`: cuDNN's fused flash kernel) it runs a
BERT-Base-sized encoder (2 layers, hidden 768, 12 heads; dropout off, as the fused kernels need)
on padded rows and on packed rows (several instances per row, attention kept within each) and
reports, against the einsum form in float32 at 'highest' matmul precision:
- the relative error ||got - ref|| / ||ref|| of the sequence output and of all parameter
  gradients, in float32 and in bfloat16 (cuDNN's kernel takes bf16/fp16 only);
- the median time of a jitted forward + backward in bfloat16.
The bf16 rows of every implementation should land at the same error (bf16 rounding, ~1e-2 or
less); an implementation that cannot take a case (a shape or mask it does not support) is
reported as such, not hidden.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np


def make_batch(
    rng: np.random.Generator, batch: int, seq_len: int, vocab_size: int, packed: bool
) -> dict:
    """Rows with padding at the end; `packed`: 1-4 instances per row, positions restarting."""
    lengths = rng.integers(seq_len // 4, seq_len + 1, size=batch)
    input_mask = (np.arange(seq_len)[None, :] < lengths[:, None]).astype(np.int32)
    out = {
        "input_ids": rng.integers(5, vocab_size, size=(batch, seq_len)).astype(np.int32),
        "input_mask": input_mask,
        "segment_ids": (np.arange(seq_len)[None, :] >= lengths[:, None] // 2).astype(np.int32),
    }
    if packed:
        segments = np.zeros((batch, seq_len), np.int32)
        positions = np.zeros((batch, seq_len), np.int32)
        for row, length in enumerate(lengths):
            cuts = np.sort(rng.choice(np.arange(8, max(length, 9)), size=rng.integers(0, 4)))
            bounds = [0, *sorted(set(int(c) for c in cuts if c < length)), int(length)]
            for n, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
                segments[row, start:end] = n + 1
                positions[row, start:end] = np.arange(end - start)
        out["packed_segment_ids"] = segments
        out["position_ids"] = positions
    return out


def fwd_bwd(config, params, data, precision: str = "default"):
    """Jitted value-and-grad of a fixed projection of the sequence output; its first result."""
    import jax
    import jax.numpy as jnp

    from bert_jax.core.model import BertModel

    inputs, projection, valid = data
    model = BertModel(config, add_pooler=False)

    def objective(p):
        out = model.apply(p, **inputs, deterministic=True)["sequence_output"]
        out = out.astype(jnp.float32)
        return jnp.sum(out * projection * valid), out

    with jax.default_matmul_precision(precision):
        fn = jax.jit(jax.value_and_grad(objective, has_aux=True))
        (_, out), grads = fn(params)
        jax.block_until_ready(grads)
    return fn, out, grads


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    from bert_jax.core.model import BertConfig, BertModel

    print(f"jax {jax.__version__}; devices {jax.devices()}", flush=True)
    base = BertConfig(
        num_hidden_layers=args.layers, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    )
    rng = np.random.default_rng(0)
    results = []
    for seq_len in args.seq_lens:
        for packed in (False, True):
            batch = make_batch(rng, args.batch, seq_len, base.vocab_size, packed)
            inputs = {k: jnp.asarray(v) for k, v in batch.items()}
            projection = jnp.asarray(rng.standard_normal((seq_len, base.hidden_size)), jnp.float32)
            valid = inputs["input_mask"][..., None].astype(jnp.float32)

            reference_config = base.replace(attention_impl="xla")
            params = nn.meta.unbox(
                BertModel(reference_config, add_pooler=False).init(
                    jax.random.key(0), **inputs, deterministic=True
                )
            )
            data = (inputs, projection, valid)
            _, ref_out, ref_grads = fwd_bwd(reference_config, params, data, "highest")
            ref_flat = jnp.concatenate([g.ravel() for g in jax.tree.leaves(ref_grads)])

            def rel(a, b):
                return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))

            for impl in ("xla", "dot_product", "cudnn"):
                for dtype in ("float32", "bfloat16"):
                    row = {
                        "seq_len": seq_len,
                        "rows": "packed" if packed else "padded",
                        "impl": impl,
                        "dtype": dtype,
                    }
                    try:
                        config = base.replace(attention_impl=impl, dtype=dtype)
                        fn, out, grads = fwd_bwd(config, params, data)
                        flat = jnp.concatenate([g.ravel() for g in jax.tree.leaves(grads)])
                        row["output_rel_err"] = rel(out * valid, ref_out * valid)
                        row["grad_rel_err"] = rel(flat, ref_flat)
                        if dtype == "bfloat16":
                            times = []
                            for _ in range(args.repeats):
                                start = time.perf_counter()
                                jax.block_until_ready(fn(params))
                                times.append(time.perf_counter() - start)
                            row["fwd_bwd_ms"] = 1e3 * statistics.median(times)
                    except Exception as err:  # noqa: BLE001 - reported, not hidden
                        row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
                    results.append(row)
                    print(json.dumps(row), flush=True)

    print()
    print("| seq | rows | impl | dtype | output rel err | grad rel err | fwd+bwd ms |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        if "error" in r:
            print(f"| {r['seq_len']} | {r['rows']} | {r['impl']} | {r['dtype']} | {r['error']} |||")
            continue
        ms = f"{r['fwd_bwd_ms']:.2f}" if "fwd_bwd_ms" in r else ""
        print(
            f"| {r['seq_len']} | {r['rows']} | {r['impl']} | {r['dtype']} | "
            f"{r['output_rel_err']:.1e} | {r['grad_rel_err']:.1e} | {ms} |"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
