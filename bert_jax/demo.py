"""`make demo`: a short real training run of BERT-Tiny on text that ships with Python.

Until the pretraining pipeline lands, this builds masked-LM batches directly: a word-level
vocabulary
from the Python reference documentation (`pydoc_data.topics`), sentence pairs with 50% random next
sentences, 15% of tokens masked, and a few hundred optimizer steps of the sharded train step. It
prints the loss and masked-LM accuracy as they fall, next to the most-frequent-token baseline.
"""

from __future__ import annotations

import argparse
import collections
import re
import time

import jax
import numpy as np

from bert_jax import losses, optim, partitioning
from bert_jax.model import BertConfig
from bert_jax.train import ShardedTrainer

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _sentences() -> list[list[str]]:
    from pydoc_data import topics

    text = " ".join(topics.topics.values())
    sentences = re.split(r"(?<=[.!?])\s+", text)
    words = [re.findall(r"[a-z]+|[0-9]+|[^\sa-z0-9]", s.lower()) for s in sentences]
    return [w for w in words if 4 <= len(w) <= 30]


def _batch(rng, sentences, vocab, batch_size, seq_len, max_predictions):
    pad, unk, cls, sep, mask = range(5)
    ids = lambda words: [vocab.get(w, unk) for w in words]  # noqa: E731
    out = {
        "input_ids": np.zeros((batch_size, seq_len), np.int32),
        "input_mask": np.zeros((batch_size, seq_len), np.int32),
        "segment_ids": np.zeros((batch_size, seq_len), np.int32),
        "masked_lm_positions": np.zeros((batch_size, max_predictions), np.int32),
        "masked_lm_ids": np.zeros((batch_size, max_predictions), np.int32),
        "masked_lm_weights": np.zeros((batch_size, max_predictions), np.float32),
        "next_sentence_labels": np.zeros((batch_size,), np.int32),
    }
    for row in range(batch_size):
        i = int(rng.integers(len(sentences) - 1))
        random_next = rng.random() < 0.5
        b = sentences[int(rng.integers(len(sentences)))] if random_next else sentences[i + 1]
        a_ids, b_ids = ids(sentences[i])[: seq_len // 2 - 2], ids(b)[: seq_len // 2 - 1]
        tokens = [cls, *a_ids, sep, *b_ids, sep]
        segments = [0] * (len(a_ids) + 2) + [1] * (len(b_ids) + 1)
        candidates = [p for p, t in enumerate(tokens) if t not in (cls, sep)]
        count = min(max_predictions, max(1, round(0.15 * len(candidates))))
        chosen = sorted(rng.choice(candidates, size=count, replace=False))
        for slot, pos in enumerate(chosen):
            out["masked_lm_positions"][row, slot] = pos
            out["masked_lm_ids"][row, slot] = tokens[pos]
            out["masked_lm_weights"][row, slot] = 1.0
            draw = rng.random()
            if draw < 0.8:
                tokens[pos] = mask
            elif draw < 0.9:
                tokens[pos] = int(rng.integers(len(SPECIALS), len(vocab)))
        out["input_ids"][row, : len(tokens)] = tokens
        out["input_mask"][row, : len(tokens)] = 1
        out["segment_ids"][row, : len(tokens)] = segments
        out["next_sentence_labels"][row] = int(random_next)
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workdir", default="demo_workdir")
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args(argv)

    sentences = _sentences()
    counts = collections.Counter(w for s in sentences for w in s)
    vocab = {w: i for i, w in enumerate(SPECIALS)}
    for word, _ in counts.most_common(4096 - len(SPECIALS)):
        vocab[word] = len(vocab)
    held_out, train_sentences = sentences[:500], sentences[500:]
    print(f"corpus: {len(sentences)} sentences from pydoc_data.topics, vocabulary {len(vocab)}")

    config = BertConfig(
        vocab_size=4096,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=512,
        max_position_embeddings=128,
    )
    schedule = optim.warmup_linear_decay(1e-3, warmup_steps=30, total_steps=args.steps)
    mesh = partitioning.make_mesh((-1, 1, 1))
    trainer = ShardedTrainer(config, optim.bert_adamw(schedule), mesh, schedule=schedule)
    state = trainer.init(jax.random.key(0))
    rng = np.random.default_rng(0)
    start = time.time()
    for step in range(args.steps):
        batch = trainer.global_batch(_batch(rng, train_sentences, vocab, 32, 64, 10))
        state, metrics = trainer.train_step(state, batch, jax.random.key(1))
        if step % 50 == 0 or step == args.steps - 1:
            summary = losses.summarize(jax.device_get(metrics))
            print(
                f"step {step:4d}  loss {summary['loss']:.3f}  mlm_acc {summary['mlm_accuracy']:.3f}"
                f"  nsp_acc {summary['nsp_accuracy']:.3f}  ({time.time() - start:.0f}s)"
            )
    eval_rng = np.random.default_rng(1)
    sums = collections.Counter()
    for _ in range(10):
        batch = _batch(eval_rng, held_out, vocab, 32, 64, 10)
        out = jax.device_get(trainer.eval_step(state.params, trainer.global_batch(batch)))
        sums.update({k: float(v) for k, v in out.items()})
        ids, weights = batch["masked_lm_ids"], batch["masked_lm_weights"]
        top = max(range(len(SPECIALS), len(vocab)), key=lambda i: counts[list(vocab)[i]])
        sums["baseline_correct"] += float(((ids == top) * weights).sum())
    summary = losses.summarize(sums)
    baseline = sums["baseline_correct"] / sums["mlm_weight"]
    print(
        f"held-out MLM accuracy {summary['mlm_accuracy']:.3f} vs most-frequent-token baseline "
        f"{baseline:.3f}; NSP accuracy {summary['nsp_accuracy']:.3f}"
    )


if __name__ == "__main__":
    main()
