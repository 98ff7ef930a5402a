"""`data prepare` on the local path beside Apache Beam's FnApiRunner, with the same number of
processes, on the same text and settings. Prints the table of docs/dataflow.md: runner,
processes, input MB, wall s, CPU s, words per CPU second and each Beam line's ratio to the local
line of its size and processes; then the machine's load average over the runs, for the table's
caption. Every Beam run's records are checked to be the local run's, byte for byte.

    python benchmarks/prepare_beam_bench.py [--sizes 24,240] [--processes 1,2] [--runs 3]
    python benchmarks/prepare_beam_bench.py --sizes 24 --runs 5   # the 24 MB lines alone

Each run is a fresh `bert-jax data prepare` process: the local ones with .venv's Python, the
Beam ones with .venv-beam's (`make test-beam` builds it), one process (`--num-workers 1`;
Beam's FnApiRunner in this process) or several (`--num-workers P`; Beam's
`--direct_num_workers=P --direct_running_mode=multi_processing`). The text is the embedded
corpus's train split (English prose, in the original format: a sentence per line, documents
apart) written over and over until it is SIZE MB, cut in splits and groups of 1 MiB (the work
spread over the processes). Wall time includes each command's start-up
(Beam's import and its worker processes' start) and depends on what else the machine runs; the
CPU seconds of the command and all its processes vary much less, so each line gives both, as the
median of `--runs` runs taken in turns (local, Beam, local, ...), so that a change of load hits
both alike; a Beam line's ratios are the medians of its runs' ratios to the local run just
before. Run it with nothing else on the machine; where that cannot be, say the load
that it printed beside the figures.

Where /proc is there (Linux), every run also says when each of its worker processes was last
busy, and its CPU seconds ("workers busy until 10.2 s, 10.4 s of 10.9 s wall (CPU 5.1, 5.3)"):
the processes of a run should finish together, a worker that ends seconds before the other is
idle while the run waits (sampled every 0.1 s from each process's CPU time).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Runs `bert-jax data prepare` in this child and prints its CPU seconds (its own and those of
# every process it waited for: the local path's pool, Beam's worker processes) as JSON.
_CHILD = """
import json, resource, sys
from bert_jax.cli import main
code = main(sys.argv[1:])
own = resource.getrusage(resource.RUSAGE_SELF)
children = resource.getrusage(resource.RUSAGE_CHILDREN)
cpu = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
print("CPU " + json.dumps({"cpu": cpu, "code": code}))
"""


def write_corpus(path: str, megabytes: float) -> int:
    """The embedded train split over and over until ``megabytes`` MB (10^6 bytes) of text;
    returns its words (whitespace-separated)."""
    sys.path.insert(0, REPO)
    from bert_jax.data.sources import embedded as sources

    texts = ["\n".join(document) + "\n\n" for document in sources.embedded_documents("train")]
    words_each = [len(text.split()) for text in texts]
    target, size, words = int(megabytes * 1e6), 0, 0
    with open(path, "w", encoding="utf-8") as f:
        while size < target:
            for text, count in zip(texts, words_each):
                f.write(text)
                size += len(text.encode("utf-8"))
                words += count
                if size >= target:
                    break
    return words


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_by_process() -> dict[int, tuple[int, float]]:
    """Every process's parent and CPU seconds (user + system), from /proc; {} without it."""
    found = {}
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return found
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        found[int(pid)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK)
    return found


class BusyWatch(threading.Thread):
    """The processes below ``root``: when each was last seen using CPU (seconds after
    ``started``) and its CPU seconds, sampled every ``every`` seconds."""

    def __init__(self, root: int, started: float, every: float = 0.1):
        super().__init__(daemon=True)
        self.root, self.started, self.every = root, started, every
        self.busy: dict[int, list[float]] = {}  # pid -> [last busy, CPU seconds]
        self.parents: set[int] = set()  # processes below the root that started another
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.every):
            now = time.perf_counter() - self.started
            table = _cpu_by_process()
            below, todo = set(), [self.root]
            while todo:
                pid = todo.pop()
                below.add(pid)
                todo.extend(p for p, (parent, _) in table.items() if parent == pid)
            for pid in below - {self.root}:
                self.parents.add(table[pid][0])
                seen = self.busy.setdefault(pid, [now, 0.0])
                if table[pid][1] > seen[1]:
                    seen[:] = [now, table[pid][1]]

    def workers(self, least_cpu: float = 0.5) -> list[tuple[float, float]]:
        """(last busy, CPU seconds) of each process that did work (``least_cpu``), by when it
        was last busy; not those that started others (Beam's workers are forked from the
        process that imported Beam for them: its own CPU seconds are that import)."""
        return sorted(
            (last, cpu)
            for pid, (last, cpu) in self.busy.items()
            if cpu >= least_cpu and pid not in self.parents
        )


def run_once(python: str, argv: list[str]) -> tuple[float, float, list[tuple[float, float]]]:
    """One command: its wall and CPU seconds, and its worker processes' (last busy, CPU
    seconds) (the machine's load average, before it, is kept in ``LOADS``)."""
    LOADS.append(os.getloadavg()[0])
    started = time.perf_counter()
    child = subprocess.Popen(
        [python, "-c", _CHILD, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    watch = BusyWatch(child.pid, started)
    watch.start()
    stdout, stderr = child.communicate()
    wall = time.perf_counter() - started
    watch.done.set()
    watch.join()
    found = [json.loads(line[4:]) for line in stdout.splitlines() if line.startswith("CPU ")]
    if not found or found[0]["code"] != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{stderr[-3000:]}")
    return wall, found[0]["cpu"], watch.workers()


def busy_words(wall: float, workers: list[tuple[float, float]]) -> str:
    """ "workers busy until 10.2 s, 10.4 s of 10.9 s wall (CPU 5.1, 5.3)"."""
    if not workers:
        return f"{wall:.1f} s wall, no worker process of its own (or no /proc to see one)"
    until = ", ".join(f"{last:.1f} s" for last, _ in workers)
    cpu = ", ".join(f"{cpu:.1f}" for _, cpu in workers)
    return f"workers busy until {until} of {wall:.1f} s wall (CPU {cpu})"


LOADS: list[float] = []


def records_digest(output: str) -> dict[str, str]:
    """What must be the same whichever runner wrote ``output``: every shard and its counts (the
    held-out records' too), by name, as SHA-256."""
    digests = {}
    for root, _, names in os.walk(output):
        for name in names:
            if name.startswith("part-"):
                path = os.path.join(root, name)
                with open(path, "rb") as f:
                    digests[os.path.relpath(path, output)] = hashlib.file_digest(
                        f, "sha256"
                    ).hexdigest()
    return digests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="24,240", help="input sizes in MB, comma-separated")
    parser.add_argument("--processes", default="1,2", help="process counts, comma-separated")
    parser.add_argument("--runs", type=int, default=3, help="runs of each line (the median)")
    parser.add_argument(
        "--group-bytes", type=int, default=1 << 20, help="data prepare's; small: work to spread"
    )
    parser.add_argument("--split-bytes", type=int, default=1 << 20, help="data prepare's")
    parser.add_argument("--tokenizer", default=None, help="default: BERT's uncased vocab.txt")
    parser.add_argument("--python-local", default=os.path.join(REPO, ".venv/bin/python"))
    parser.add_argument("--python-beam", default=os.path.join(REPO, ".venv-beam/bin/python"))
    parser.add_argument("--workdir", default=None, help="for the corpora and outputs (a temp dir)")
    args = parser.parse_args()
    if args.tokenizer is None:
        sys.path.insert(0, REPO)
        from tests.data_fixtures import minilm_vocab_path

        args.tokenizer = minilm_vocab_path()
    work = tempfile.mkdtemp(prefix="prepare-bench-", dir=args.workdir)
    sizes = [float(s) for s in args.sizes.split(",")]
    processes = [int(p) for p in args.processes.split(",")]
    print(
        "| runner | processes | input MB | wall s | CPU s | words per CPU s | "
        "Beam / local, wall | Beam / local, CPU |"
    )
    print("|---|---|---|---|---|---|---|---|")
    busy: list[str] = []  # each run's worker processes, in words
    try:
        for megabytes in sizes:
            corpus = os.path.join(work, f"corpus-{megabytes:g}MB.txt")
            words = write_corpus(corpus, megabytes)
            common = [
                "data", "prepare", "--input", corpus, "--tokenizer", args.tokenizer,
                "--max-seq-length", "128", "--max-predictions-per-seq", "20",
                "--dupe-factor", "5", "--group-bytes", str(args.group_bytes),
                "--split-bytes", str(args.split_bytes),
            ]  # fmt: skip
            for count in processes:
                lines = {
                    "local": (args.python_local, ["--num-workers", str(count)]),
                    "Beam FnApiRunner": (
                        args.python_beam,
                        ["--runner", "beam", "--", f"--direct_num_workers={count}"]
                        + (["--direct_running_mode=multi_processing"] if count > 1 else []),
                    ),
                }
                measured: dict[str, list[tuple[float, float]]] = {name: [] for name in lines}
                for _ in range(args.runs):
                    digests = {}
                    for name, (python, extra) in lines.items():
                        output = os.path.join(work, "out")
                        shutil.rmtree(output, ignore_errors=True)
                        argv = [*common, "--output", output, *extra]
                        wall, cpu, workers = run_once(python, argv)
                        measured[name].append((wall, cpu))
                        busy.append(
                            f"{name}, {count} process(es), {megabytes:g} MB: "
                            f"{busy_words(wall, workers)}"
                        )
                        digests[name] = records_digest(output)
                    if len({json.dumps(d, sort_keys=True) for d in digests.values()}) != 1:
                        raise SystemExit(
                            f"{megabytes:g} MB, {count} process(es): the records differ"
                        )
                medians = {
                    name: (
                        statistics.median(w for w, _ in runs),
                        statistics.median(c for _, c in runs),
                    )
                    for name, runs in measured.items()
                }
                for name, (wall, cpu) in medians.items():
                    pairs = list(zip(measured["local"], measured[name]))
                    ratios = " | ".join(
                        f"{statistics.median(b[k] / a[k] for a, b in pairs):.2f}" for k in (0, 1)
                    )
                    print(
                        f"| {name} | {count} | {megabytes:g} | {wall:.1f} | {cpu:.1f} | "
                        f"{words / cpu:,.0f} | {ratios} |",
                        flush=True,
                    )
        print(
            f"\nLoad average (1 min) before each run: {min(LOADS):.1f} to {max(LOADS):.1f}, median "
            f"{statistics.median(LOADS):.1f}, on {os.cpu_count()} cores."
        )
        print("\nEach run's worker processes (when last busy, CPU seconds):")
        for line in busy:
            print(f"  {line}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
