"""bert-jax's wikitext stripping beside a public extractor (wikiextractor), on dumps in the real
format: words per article, markup left over, prose kept, speed.

Two dumps, written here (nothing is downloaded):
1. ``realistic``: the five long articles of ``tests/wikitext`` (enwiki's markup, written for the
   tests in the patterns real articles carry: infoboxes, nested templates, references with
   templates inside, tables with cell styles and unbalanced bold and italics, galleries, math,
   nowiki, definition lists, entities, comments, magic words), each with a redirect and a talk
   page, ``--repeat`` times over; beside each article, the running text it must come out as, so
   "prose kept" is the share of those words that an extractor's output holds;
2. ``synthetic``: ``wikipedia_bench.write_dump``'s enwiki-like pages (real English sentences in
   an infobox, citations, links, sections, lists, tables, files, categories).

Per article: the word ratio (bert-jax's words / wikiextractor's) and the markup each leaves
(``wikitext.markup_leftovers``: ``{|``, ``|-``, ``{{``, ``[[``, ``<ref``, ``''``, ``&nbsp;``,
``==``, ...). wikiextractor runs as its users run it, ``python -m wikiextractor.WikiExtractor
DUMP --json --html-safe ""`` (one process, no template definitions, text not HTML-escaped),
from an environment of its own: ``make bench-wikipedia`` makes ``.venv-wikiextractor`` and runs
this file with ``--wikiextractor .venv-wikiextractor/bin/python``. Speed: bert-jax's CPU time to
read and strip the dump (``wikipedia.iter_articles``, one process), wikiextractor's wall clock
(one process, its start included).

    .venv/bin/python benchmarks/wikipedia_extractors_bench.py --wikiextractor PYTHON [--json OUT]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bert_jax.data.sources import wikipedia_dump as wikipedia  # noqa: E402
from bert_jax.data.sources import wikitext  # noqa: E402
from tests.corpus_fixtures import realistic_articles, realistic_dump_xml  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wikipedia_bench  # noqa: E402


def bert_jax_texts(path: str, trials: int) -> tuple[dict[str, str], float]:
    """{title: text} of the dump's articles, and the median CPU seconds to read and strip it."""
    times, texts = [], {}
    for _ in range(trials):
        started = time.process_time()
        texts = dict(wikipedia.iter_articles(path))
        times.append(time.process_time() - started)
    return texts, statistics.median(times)


def wikiextractor_texts(python: str, path: str, trials: int) -> tuple[dict[str, str], float]:
    """{title: text} as wikiextractor writes them (its title line is not part of the text), and
    the median wall seconds it takes."""
    command = [python, "-m", "wikiextractor.WikiExtractor", path, "--json", "-o", "-"]
    command += ["--processes", "1", "-q", "--html-safe", ""]  # plain text: JSON needs no escapes
    times, out = [], ""
    for _ in range(trials):
        started = time.perf_counter()
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        times.append(time.perf_counter() - started)
    texts = {}
    for line in out.splitlines():
        record = json.loads(line)
        texts[record["title"]] = record["text"]
    return texts, statistics.median(times)


def prose_kept(expected: list[str], text: str) -> float:
    """The share of the expected running text's words (as a multiset of runs of letters and
    digits: wikiextractor writes italics in quotes) that ``text`` holds."""
    want = collections.Counter(re.findall(r"\w+", " ".join(expected)))
    have = collections.Counter(re.findall(r"\w+", text))
    return sum((want & have).values()) / sum(want.values())


def compare(ours: dict[str, str], theirs: dict[str, str]) -> dict:
    """Per-article word ratio and leftovers of both, for the articles both extracted."""
    rows = {}
    for title, text in ours.items():
        if title not in theirs:
            continue
        words, peer_words = len(text.split()), len(theirs[title].split())
        rows[title] = {
            "words": words,
            "peer_words": peer_words,
            "word_ratio": words / max(peer_words, 1),
            "leftovers": len(wikitext.markup_leftovers(text)),
            "peer_leftovers": len(wikitext.markup_leftovers(theirs[title])),
            "leftover_examples": sorted(set(wikitext.markup_leftovers(text)))[:8],
            "peer_leftover_examples": sorted(set(wikitext.markup_leftovers(theirs[title])))[:8],
        }
    return rows


def summary(rows: dict) -> dict:
    values = list(rows.values())

    def per_article(key):
        return sum(r[key] for r in values) / len(values)

    return {
        "articles": len(values),
        "median_word_ratio": statistics.median(r["word_ratio"] for r in values),
        "leftovers_per_article": per_article("leftovers"),
        "peer_leftovers_per_article": per_article("peer_leftovers"),
        "articles_with_leftovers": sum(r["leftovers"] > 0 for r in values),
        "peer_articles_with_leftovers": sum(r["peer_leftovers"] > 0 for r in values),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--wikiextractor", required=True, help="a Python with wikiextractor")
    parser.add_argument("--repeat", type=int, default=40, help="copies of the realistic articles")
    parser.add_argument("--pages", type=int, default=2000, help="pages of the synthetic dump")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    version = subprocess.run(
        [
            args.wikiextractor,
            "-c",
            "import importlib.metadata as m; print(m.version('wikiextractor'))",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    results: dict = {"wikiextractor": version}
    with tempfile.TemporaryDirectory() as tmp:
        realistic = os.path.join(tmp, "realistic-pages-articles.xml")
        with open(realistic, "w", encoding="utf-8") as f:
            f.write(realistic_dump_xml(repeat=args.repeat))
        synthetic_bz2 = os.path.join(tmp, "synthetic-pages-articles.xml.bz2")
        wikipedia_bench.write_dump(synthetic_bz2, args.pages)
        synthetic = synthetic_bz2[: -len(".bz2")]  # wikiextractor reads .bz2 too; same input
        with open(synthetic_bz2, "rb") as packed, open(synthetic, "wb") as f:
            f.write(b"".join(wikipedia._decompressed(packed)))
        for name, path in (("realistic", realistic), ("synthetic", synthetic)):
            ours, our_s = bert_jax_texts(path, args.trials)
            theirs, their_s = wikiextractor_texts(args.wikiextractor, path, args.trials)
            rows = compare(ours, theirs)
            results[name] = {
                "summary": summary(rows),
                "bert_jax_s": our_s,
                "wikiextractor_s": their_s,
                "bert_jax_words": sum(len(t.split()) for t in ours.values()),
                "wikiextractor_words": sum(len(t.split()) for t in theirs.values()),
                "pages": sum(1 for _ in wikipedia._pages(path)),
            }
            if name == "realistic":
                for title, _, expected in realistic_articles():
                    rows[title]["prose_kept"] = prose_kept(expected, ours[title])
                    rows[title]["peer_prose_kept"] = prose_kept(expected, theirs[title])
                results[name]["articles"] = {t: rows[t] for t, _, _ in realistic_articles()}
    print(
        f"wikiextractor {version}; bert-jax CPU s and wikiextractor wall s, median of {args.trials}"
    )
    print("\nper article (realistic dump; prose kept: share of the expected running text's words)")
    print(
        "| article | words: bert-jax / wikiextractor (ratio) | leftovers: bert-jax / "
        "wikiextractor | prose kept: bert-jax / wikiextractor |"
    )
    print("|---|---|---|---|")
    for title, row in results["realistic"]["articles"].items():
        print(
            f"| {title} | {row['words']} / {row['peer_words']} ({row['word_ratio']:.2f}) | "
            f"{row['leftovers']} / {row['peer_leftovers']} | "
            f"{row['prose_kept']:.3f} / {row['peer_prose_kept']:.3f} |"
        )
    print(
        "\n| dump | articles | median word ratio | leftovers per article: bert-jax / "
        "wikiextractor | articles with any | pages/s: bert-jax / wikiextractor |"
    )
    print("|---|---|---|---|---|---|")
    for name in ("realistic", "synthetic"):
        r, s = results[name], results[name]["summary"]
        print(
            f"| {name} | {s['articles']} | {s['median_word_ratio']:.3f} | "
            f"{s['leftovers_per_article']:.2f} / {s['peer_leftovers_per_article']:.2f} | "
            f"{s['articles_with_leftovers']} / {s['peer_articles_with_leftovers']} | "
            f"{r['pages'] / r['bert_jax_s']:,.0f} / {r['pages'] / r['wikiextractor_s']:,.0f} |"
        )
    examples = {
        title: row["peer_leftover_examples"]
        for title, row in results["realistic"]["articles"].items()
        if row["peer_leftover_examples"]
    }
    print(f"\nwikiextractor's leftovers, by article (realistic): {examples}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1, ensure_ascii=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
