"""The benchmark's host batches: synthetic full rows, or the embedded corpus (optionally packed).

No TensorFlow is imported: instances are made in memory by `data.instances`, one pass.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bert_jax.bench.spec import BenchSpec, resolve_tokenizer
from bert_jax.data import objectives
from bert_jax.data.pipeline import packing as packing_lib
from bert_jax.runtime.errors import UserError


@dataclasses.dataclass
class BenchData:
    """Host batches for our side and, unpacked, for the peer; with what they hold."""

    batches: list[dict[str, np.ndarray]]
    peer_batches: list[dict[str, np.ndarray]]
    description: str
    packing_stats: packing_lib.PackingStats | None = None


def synthetic_data(spec: BenchSpec, count: int = 4) -> BenchData:
    """Full-length random rows (`tf_data.synthetic_batch`; no TensorFlow is imported)."""
    from bert_jax.data.pipeline.tf_data import synthetic_batch

    batches = [
        synthetic_batch(
            spec.batch_size,
            spec.seq_len,
            spec.max_predictions,
            spec.model.vocab_size,
            seed=spec.seed + i,
        )
        for i in range(count)
    ]
    return BenchData(batches, batches, f"synthetic full rows ({count} distinct batches)")


def embedded_data(spec: BenchSpec) -> BenchData:
    """Instances from the embedded corpus at `seq_len` (the original pairing and masking, one
    pass), in batches of `batch_size` rows: one instance per row, or packed."""
    from bert_jax.data.instances import sentence_pairs as instances_lib
    from bert_jax.data.masking.settings import MaskingConfig
    from bert_jax.data.sources import embedded as sources

    tokenizer = resolve_tokenizer(spec.tokenizer, spec.model.vocab_size)
    documents = instances_lib.tokenize_documents(sources.embedded_documents("train"), tokenizer)
    masking = MaskingConfig.from_tokenizer(
        tokenizer, objectives.MASKED_LM_PROB, spec.max_predictions
    )
    instances = instances_lib.create_instances(
        documents,
        masking,
        spec.seq_len,
        short_seq_prob=objectives.SHORT_SEQ_PROB,
        dupe_factor=1,
        seed=spec.seed,
    )
    rows = instances_lib.instances_to_arrays(instances, spec.seq_len, spec.max_predictions)
    lengths = packing_lib.instance_lengths(rows)
    fill = lengths.mean() / spec.seq_len
    what = (
        f"embedded corpus, {len(instances)} instances, {tokenizer!r}, mean length "
        f"{lengths.mean():.0f} of {spec.seq_len} ({fill:.0%} of positions real unpacked)"
    )

    def split(arrays: dict[str, np.ndarray], size: int) -> list[dict[str, np.ndarray]]:
        count = len(arrays["input_ids"]) // size
        if count < 1:
            raise UserError(
                f"the embedded corpus gives {len(arrays['input_ids'])} instances at seq_len "
                f"{spec.seq_len}, fewer than one batch of {size}"
            )
        return [{k: v[i * size : (i + 1) * size] for k, v in arrays.items()} for i in range(count)]

    unpacked = split(rows, spec.batch_size)
    if not spec.packing:
        return BenchData(unpacked, unpacked, what)
    config = packing_lib.PackingConfig(
        max_seq_length=spec.seq_len,
        max_predictions_per_row=spec.max_predictions,
        max_instances_per_row=spec.max_instances_per_row,
    )
    factor = spec.packing_factor or packing_lib.choose_factor(rows, spec.batch_size, config)
    config = dataclasses.replace(config, factor=factor)
    stats = packing_lib.PackingStats()
    packed = []
    for group in split(rows, config.instances_per_batch(spec.batch_size)):
        batch, group_stats = packing_lib.pack_batch(group, spec.batch_size, config)
        stats.add(group_stats)
        packed.append(batch)
    what += f"; packed at factor {factor:g}: {stats.summary()}"
    return BenchData(packed, unpacked, what, stats)


def make_data(spec: BenchSpec) -> BenchData:
    return synthetic_data(spec) if spec.data == "synthetic" else embedded_data(spec)


def batch_counts(batch: dict[str, np.ndarray]) -> tuple[int, int, int]:
    """(real tokens, padded tokens, instances) of one host batch."""
    mask = np.asarray(batch["input_mask"])
    if "next_sentence_weights" in batch:
        instances = int(np.asarray(batch["next_sentence_weights"]).sum())
    else:
        instances = int((mask.sum(axis=1) > 0).sum())
    return int(mask.sum()), int(mask.size), instances
