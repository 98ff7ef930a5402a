"""Sentence splitters compared on a hand-labelled sample: boundary precision, recall, F1, speed.

The sample, ``benchmarks/data/sentence_gold.txt``, is English prose written for this benchmark in
the two registers of BERT's corpus: encyclopedic (abbreviations, initials, decimals, dates, units,
citations such as "(Smith et al. 2019)", a sentence ending in an abbreviation) and fiction
(dialogue, quotes ending in ? or !, ellipses, one-word sentences). One sentence per line, a blank
line between paragraphs; every boundary was checked by hand.

Each paragraph is given to a splitter as one line; a boundary is the position, in non-space
characters, where one sentence ends and the next starts inside a paragraph (the paragraph's own
end is not counted: every splitter gets it right). Speed: sentences of the sample split per
second on one core (the sample repeated ``--repeat`` times, the median of ``--trials`` runs).

    .venv/bin/python benchmarks/sentence_split_eval.py [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bert_jax.data import sentences  # noqa: E402

GOLD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "sentence_gold.txt")


def read_gold(path: str = GOLD) -> list[list[str]]:
    """Paragraphs, each a list of its sentences."""
    with open(path, encoding="utf-8") as f:
        blocks = f.read().strip().split("\n\n")
    return [[line.strip() for line in block.splitlines() if line.strip()] for block in blocks]


def boundaries(parts: list[str]) -> set[int]:
    """Inner sentence ends, counted in non-space characters from the paragraph's start."""
    ends, count = set(), 0
    for part in parts[:-1]:
        count += sum(not c.isspace() for c in part)
        ends.add(count)
    return ends


def score(split, paragraphs: list[list[str]]) -> dict:
    true_positive = predicted = gold = 0
    errors = []
    for paragraph in paragraphs:
        expected = boundaries(paragraph)
        got_parts = split(" ".join(paragraph))
        got = boundaries(got_parts)
        true_positive += len(expected & got)
        predicted += len(got)
        gold += len(expected)
        if expected != got and len(errors) < 200:
            errors.append({"gold": paragraph, "split": got_parts})
    precision = true_positive / predicted if predicted else 0.0
    recall = true_positive / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "boundaries": gold,
        "predicted": predicted,
        "correct": true_positive,
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "errors": errors,
    }


def speed(split, paragraphs: list[list[str]], repeat: int, trials: int) -> float:
    texts = [" ".join(p) for p in paragraphs] * repeat
    count = sum(len(p) for p in paragraphs) * repeat
    split(texts[0])  # imports and one-time set-up are not timed
    rates = []
    for _ in range(trials):
        started = time.process_time()
        for text in texts:
            split(text)
        rates.append(count / (time.process_time() - started))
    return statistics.median(rates)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--splitters", nargs="+", default=list(sentences.SPLITTERS))
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--json", help="write the scores (and each splitter's errors) here")
    parser.add_argument("--show-errors", metavar="SPLITTER")
    args = parser.parse_args(argv)
    paragraphs = read_gold()
    results = {}
    for name in args.splitters:
        split = sentences.splitter(name)
        result = score(split, paragraphs)
        result["sentences_per_s"] = speed(split, paragraphs, args.repeat, args.trials)
        result["identity"] = sentences.splitter_identity(name)
        results[name] = result
    print(
        f"{sum(map(len, paragraphs))} sentences, {results[args.splitters[0]]['boundaries']} "
        f"boundaries inside {len(paragraphs)} paragraphs; speed: median of {args.trials} "
        "(CPU time, one core)\n"
    )
    print("| splitter | F1 | precision | recall | sentences/s |")
    print("|---|---|---|---|---|")
    for r in sorted(results.values(), key=lambda r: -r["f1"]):
        print(
            f"| {r['identity']} | {r['f1']:.3f} | {r['precision']:.3f} | {r['recall']:.3f} | "
            f"{r['sentences_per_s']:,.0f} |"
        )
    if args.show_errors:
        for error in results[args.show_errors]["errors"]:
            print("\nGOLD :", " || ".join(error["gold"]))
            print("SPLIT:", " || ".join(error["split"]))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
