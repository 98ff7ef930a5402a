"""Sentence splitters compared on three gold sets: boundary precision, recall, F1, and speed.

The gold sets (``benchmarks/data``; one sentence per line, a blank line between paragraphs, an
optional header of ``#`` lines naming the source):

- ``sentence_gold.txt`` ("own"): English prose written for this project in the two registers of
  BERT's corpus: encyclopedic (abbreviations, initials, decimals, dates, units, citations such
  as "(Smith et al. 2019)", a sentence ending in an abbreviation) and fiction (dialogue, quotes
  ending in ? or !, ellipses, one-word sentences); every boundary was checked by hand.
- ``golden_rules_en.txt``: the English "Golden Rules" of the Pragmatic Segmenter (48 cases: lists,
  abbreviations, e-mail and web addresses, ellipses, quotations), as pysbd's source distribution
  ships them (``pysbd-0.3.3.tar.gz``: ``benchmarks/english_golden_rules.py``, MIT). pysbd is a
  port of the Pragmatic Segmenter and was written to pass them.
- ``syntok_ospl.txt``: syntok's own segmentation test, one paragraph of 107 sentences
  (biomedical abstracts, enumerations, abbreviations, brackets), as syntok's source
  distribution ships it (``syntok-1.4.2.tar.gz``: ``syntok/segmenter_test.py``, ``OSPL``, MIT).
  syntok was written to pass it.

Neither public set is downloaded when the benchmark runs: both were converted once into the files
above by ``--write-public-sets`` from the source distributions that ``pip download --no-deps
--no-binary :all: pysbd==0.3.3 syntok==1.4.2`` fetches (their Python is parsed, never run).

Each paragraph is given to a splitter as one line; a boundary is the position, in non-space
characters, where one sentence ends and the next starts inside a paragraph (the paragraph's own
end is not counted: every splitter gets it right). Speed: sentences of the own sample split per
second on one core (the sample repeated ``--repeat`` times, the median of ``--trials`` runs).

    .venv/bin/python benchmarks/sentence_split_eval.py [--json OUT]
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import statistics
import sys
import tarfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bert_jax.data import sentences  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
GOLD = os.path.join(DATA, "sentence_gold.txt")
GOLD_SETS = {
    "own": GOLD,
    "golden rules": os.path.join(DATA, "golden_rules_en.txt"),
    "syntok OSPL": os.path.join(DATA, "syntok_ospl.txt"),
}


def read_gold(path: str = GOLD) -> list[list[str]]:
    """Paragraphs, each a list of its sentences (a header of ``#`` lines is skipped)."""
    with open(path, encoding="utf-8") as f:
        blocks = f.read().strip().split("\n\n")
    if blocks and all(line.startswith("#") for line in blocks[0].splitlines()):
        blocks = blocks[1:]
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
        "paragraphs": len(paragraphs),
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


# --- The public sets, converted once from the packages' source distributions -------------------


def _assigned(source: str, name: str):
    """The literal value assigned to `name` at the top of a Python file (parsed, not run)."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise ValueError(f"no {name} = ... in the file")


def _member(tarball: str, suffix: str) -> str:
    with tarfile.open(tarball) as archive:
        (member,) = [m for m in archive.getmembers() if m.name.endswith(suffix)]
        return archive.extractfile(member).read().decode("utf-8")


def _write_set(path: str, header: list[str], paragraphs: list[list[str]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(f"# {line}" for line in header) + "\n\n")
        f.write("\n\n".join("\n".join(p) for p in paragraphs) + "\n")


def write_public_sets(pysbd_sdist: str, syntok_sdist: str, directory: str = DATA) -> None:
    rules = _assigned(_member(pysbd_sdist, "benchmarks/english_golden_rules.py"), "GOLDEN_EN_RULES")
    for text, expected in rules:  # a paragraph is its sentences joined by one space
        assert " ".join(text.split()) == " ".join(" ".join(expected).split()), text
    _write_set(
        GOLD_SETS["golden rules"],
        [
            "The English Golden Rules of the Pragmatic Segmenter (Kevin S. Dias, MIT), as",
            f"{os.path.basename(pysbd_sdist)} ships them: benchmarks/english_golden_rules.py",
            "(GOLDEN_EN_RULES; pysbd, Nipun Sadvilkar, MIT). One paragraph per rule.",
        ],
        [list(expected) for _, expected in rules],
    )
    ospl = _assigned(_member(syntok_sdist, "syntok/segmenter_test.py"), "OSPL")
    _write_set(
        GOLD_SETS["syntok OSPL"],
        [
            f"syntok's segmentation test, as {os.path.basename(syntok_sdist)} ships it:",
            "syntok/segmenter_test.py (OSPL; Florian Leitner, MIT). The test joins its lines",
            "with spaces into one text: one paragraph.",
        ],
        [ospl.split("\n")],
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--splitters", nargs="+", default=list(sentences.SPLITTERS))
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--json", help="write the scores (and each splitter's errors) here")
    parser.add_argument("--show-errors", nargs=2, metavar=("SPLITTER", "SET"))
    parser.add_argument(
        "--write-public-sets",
        nargs=2,
        metavar=("PYSBD_SDIST", "SYNTOK_SDIST"),
        help="convert the public sets from pysbd-0.3.3.tar.gz and syntok-1.4.2.tar.gz, then stop",
    )
    args = parser.parse_args(argv)
    if args.write_public_sets:
        write_public_sets(*args.write_public_sets)
        return 0
    gold = {name: read_gold(path) for name, path in GOLD_SETS.items()}
    results = {}
    for name in args.splitters:
        split = sentences.splitter(name)
        results[name] = {
            "identity": sentences.splitter_identity(name),
            "sets": {set_name: score(split, paragraphs) for set_name, paragraphs in gold.items()},
            "sentences_per_s": speed(split, gold["own"], args.repeat, args.trials),
        }
    for set_name, paragraphs in gold.items():
        scored = results[args.splitters[0]]["sets"][set_name]
        print(
            f"{set_name}: {sum(map(len, paragraphs))} sentences, {scored['boundaries']} "
            f"boundaries inside {len(paragraphs)} paragraphs"
        )
    print(f"speed: on the own sample, median of {args.trials} (CPU time, one core)\n")
    print(f"| splitter | {' | '.join(f'F1 {s}' for s in gold)} | sentences/s |")
    print(f"|---|{'---|' * len(gold)}---|")
    for r in results.values():
        f1s = " | ".join(f"{r['sets'][s]['f1']:.3f}" for s in gold)
        print(f"| {r['identity']} | {f1s} | {r['sentences_per_s']:,.0f} |")
    if args.show_errors:
        name, set_name = args.show_errors
        for error in results[name]["sets"][set_name]["errors"]:
            print("\nGOLD :", " || ".join(error["gold"]))
            print("SPLIT:", " || ".join(error["split"]))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
