"""`data prepare` throughput, local processes beside Apache Beam's FnApiRunner: words/s,
instances/s and the peak RSS of a worker, with 1 and 2 workers, on the same corpus and settings
(the records are the same: tests/test_data_beam.py). The table goes to docs/dataflow.md.

    python benchmarks/prepare_beam_bench.py [--copies 3] [--runs 1]

Each configuration runs in a fresh process (`bert-jax data prepare`), the local ones with
.venv's Python, the Beam ones with .venv-beam's (`make test-beam` builds it). The corpus is the
embedded corpus's train split written `--copies` times into one text file (the original format),
so the input is cut into several splits and groups. Wall time includes each process's start
(TensorFlow's import, Beam's worker start-up) and depends on what else the machine runs; the
CPU seconds of the command and all its processes (start-up included) do much less, so words per
CPU second is the figure to extrapolate from.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Runs `bert-jax data prepare` in this child and prints its peak RSS figures as JSON.
_CHILD = """
import json, resource, sys
from bert_jax.cli import main
code = main(sys.argv[1:])
own = resource.getrusage(resource.RUSAGE_SELF)
children = resource.getrusage(resource.RUSAGE_CHILDREN)
cpu = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
print("RSS " + json.dumps(
    {"self_kib": own.ru_maxrss, "children_kib": children.ru_maxrss, "cpu": cpu, "code": code}
))
"""


def _corpus(path: str, copies: int) -> int:
    """Writes the corpus; returns its words (whitespace-separated)."""
    from bert_jax.data.sources import documents as sources

    documents = sources.embedded_documents("train")
    words = 0
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(copies):
            for document in documents:
                f.write("\n".join(document) + "\n\n")
                words += sum(len(sentence.split()) for sentence in document)
    return words


def _run(python: str, argv: list[str]) -> tuple[float, dict, str]:
    started = time.perf_counter()
    done = subprocess.run(
        [python, "-c", _CHILD, *argv], capture_output=True, text=True, cwd=REPO, check=False
    )
    wall = time.perf_counter() - started
    rss = next(
        (json.loads(line[4:]) for line in done.stdout.splitlines() if line.startswith("RSS ")),
        None,
    )
    if rss is None or rss["code"] != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stderr[-3000:]}")
    return wall, rss, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copies", type=int, default=3, help="copies of embedded:train")
    parser.add_argument("--runs", type=int, default=1, help="runs of each configuration")
    parser.add_argument("--tokenizer", default=None, help="default: BERT's uncased vocab.txt")
    parser.add_argument("--python-local", default=os.path.join(REPO, ".venv/bin/python"))
    parser.add_argument("--python-beam", default=os.path.join(REPO, ".venv-beam/bin/python"))
    args = parser.parse_args()
    if args.tokenizer is None:
        sys.path.insert(0, REPO)
        from tests.data_fixtures import minilm_vocab_path

        args.tokenizer = minilm_vocab_path()
    work = tempfile.mkdtemp(prefix="prepare-bench-")
    corpus = os.path.join(work, "corpus.txt")
    words = _corpus(corpus, args.copies)
    size = os.path.getsize(corpus)
    common = [
        "data", "prepare", "--input", corpus, "--tokenizer", args.tokenizer,
        "--max-seq-length", "128", "--max-predictions-per-seq", "20", "--dupe-factor", "5",
        "--group-bytes", str(1 << 20), "--split-bytes", str(1 << 20),
    ]  # fmt: skip
    configurations = {
        "local, 1 worker": (args.python_local, ["--num-workers", "1"]),
        "local, 2 workers": (args.python_local, ["--num-workers", "2"]),
        "Beam FnApiRunner, 1 worker": (args.python_beam, ["--runner", "beam"]),
        "Beam FnApiRunner, 2 workers": (
            args.python_beam,
            [
                "--runner",
                "beam",
                "--",
                "--direct_num_workers=2",
                "--direct_running_mode=multi_processing",
            ],
        ),  # fmt: skip
    }
    print(
        f"corpus: {words:,} words, {size / 2**20:.1f} MiB, {args.copies} copies of embedded:train"
    )
    print(
        "| configuration | wall s | words/s | instances/s | CPU s (all processes) | "
        "words per CPU s | peak RSS/worker |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, (python, extra) in configurations.items():
        for run in range(args.runs):
            output = os.path.join(work, f"out-{len(name)}-{run}")
            flags = [*common, "--output", output]
            if "--" in extra:
                cut = extra.index("--")
                argv = [*flags, *extra[:cut], *extra[cut:]]
            else:
                argv = [*flags, *extra]
            wall, rss, _ = _run(python, argv)
            with open(os.path.join(output, "stats-0-of-1.json")) as f:
                stats = json.load(f)
            instances = stats["instances"]["instances"]
            cpu = rss["cpu"]
            workers = 1 if "1 worker" in name else 2
            # One worker: the work runs in the command's own process; two: in its children.
            peak = rss["self_kib"] if workers == 1 else rss["children_kib"]
            print(
                f"| {name} | {wall:.1f} | {words / wall:,.0f} | {instances / wall:,.0f} | "
                f"{cpu:.1f} | {words / cpu:,.0f} | {peak / 1024:.0f} MiB |"
            )
    print(f"(instances per run: {instances:,})")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
