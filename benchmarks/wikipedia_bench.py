"""Wikipedia dump reader speed, per core: pages/s through each stage, on a synthetic dump.

The dump is written here (nothing is downloaded): ``--pages`` pages in the MediaWiki export
format, bz2-compressed, shaped like enwiki's pages-articles: 45% redirects, 5% other namespaces,
articles of ~650 words of prose on average (enwiki: ~4.5B words in 6.9M articles today; the
paper's 2,500M words came from fewer, shorter ones) made of real English sentences (the embedded
corpus's: Python's documentation), wrapped in the markup real articles carry: an
infobox, citation templates inside ``<ref>`` tags (about one per two sentences), links, bold and
italics, sections with headings, a bulleted "See also" list, a table in one article of four, a
file with its caption, categories. Random but seeded: the same dump each run.

Stages timed (CPU seconds of this one process, median of ``--trials``):
1. ``read``: bz2 + XML (mwxml), the pages' raw text;
2. ``strip``: + mwparserfromhell, the articles' running text (``wikipedia.iter_articles``);
3. ``split``: + sentence splitting with each ``--splitters`` (``sources.read_documents``);
then the whole read in ``--workers`` processes (wall clock: a multistream dump's splits of
streams are read, stripped and split by the workers).

    .venv/bin/python benchmarks/wikipedia_bench.py [--pages 2000] [--json OUT]
"""

from __future__ import annotations

import argparse
import bz2
import json
import os
import random
import statistics
import sys
import tempfile
import time
from xml.sax.saxutils import escape

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bert_jax.data.sources import documents as sources  # noqa: E402
from bert_jax.data.sources import wikipedia_dump as wikipedia
from bert_jax.data.sources.embedded import embedded_documents  # noqa: E402

_HEADER = """<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.11/" version="0.11" \
xml:lang="en">
  <siteinfo>
    <sitename>Wikipedia</sitename>
    <dbname>enwiki</dbname>
    <base>https://en.wikipedia.org/wiki/Main_Page</base>
    <generator>MediaWiki 1.42</generator>
    <case>first-letter</case>
    <namespaces>
      <namespace key="0" case="first-letter" />
      <namespace key="1" case="first-letter">Talk</namespace>
      <namespace key="4" case="first-letter">Wikipedia</namespace>
      <namespace key="10" case="first-letter">Template</namespace>
      <namespace key="14" case="first-letter">Category</namespace>
    </namespaces>
  </siteinfo>
"""

_SYLLABLES = "ka ri to mo an el or is un de la ven tra ber gol sin ham pol ter nus ca bri".split()
_FUNCTION_WORDS = (
    "the of and in to a was is for on as by with from that at his it an were which are this "
    "also be has or had its first after one their new who two been but they other more".split()
)


class _Writer:
    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.sentences = [
            s for d in embedded_documents("all") for s in d if s[-1:] in ".?!" and len(s) > 40
        ]
        self.vocabulary = sorted(
            {
                "".join(self.rng.choice(_SYLLABLES) for _ in range(self.rng.randint(1, 4)))
                for _ in range(20_000)
            }
        )

    def word(self) -> str:
        if self.rng.random() < 0.45:
            return self.rng.choice(_FUNCTION_WORDS)
        # Zipf-like: low indices far more often.
        return self.vocabulary[int(len(self.vocabulary) * self.rng.random() ** 3)]

    def name(self) -> str:
        return " ".join(self.word().capitalize() for _ in range(self.rng.randint(1, 3)))

    def sentence(self) -> str:
        """A real English sentence (the embedded corpus's) with wiki links and italics."""
        words = []
        for word in self.rng.choice(self.sentences).split():
            r = self.rng.random()
            if r < 0.06 and word.isalpha():
                target = self.name()
                words.append(f"[[{target}|{word}]]" if self.rng.random() < 0.3 else f"[[{word}]]")
            elif r < 0.07 and word.isalpha():
                words.append(f"''{word}''")
            else:
                words.append(word)
        text = " ".join(words)
        if self.rng.random() < 0.5:
            text += (
                "<ref>{{cite web |url=https://example.org/"
                f"{self.rng.randint(1, 10**6)} |title={self.name()} |date={self.rng.randint(1, 28)}"
                f" May {self.rng.randint(1990, 2024)} |access-date=2024-01-01}}}}</ref>"
            )
        return text

    def paragraph(self) -> str:
        return " ".join(self.sentence() for _ in range(self.rng.randint(3, 9)))

    def article(self, title: str) -> str:
        lead = self.paragraph()
        parts = [
            "{{Short description|" + self.name() + "}}",
            "{{Infobox settlement\n"
            + "".join(f"| {self.word()} = {self.name()}\n" for _ in range(15))
            + "}}",
            f"'''{title}''' " + lead[0].lower() + lead[1:],
        ]
        if self.rng.random() < 0.5:
            parts.append(f"[[File:{self.name()}.jpg|thumb|{self.sentence()}]]")
        for _ in range(self.rng.randint(0, 4)):
            parts.append(f"== {self.name()} ==")
            parts.extend(self.paragraph() for _ in range(self.rng.randint(1, 4)))
        if self.rng.random() < 0.25:
            rows = "".join(
                f"|-\n| {self.word()} || {self.rng.randint(1, 10**5)}\n" for _ in range(6)
            )
            parts.append('{| class="wikitable"\n! Name !! Value\n' + rows + "|}")
        parts.append("== See also ==\n" + "".join(f"* [[{self.name()}]]\n" for _ in range(4)))
        parts.append("== References ==\n{{Reflist}}")
        parts.append("".join(f"[[Category:{self.name()}]]\n" for _ in range(3)))
        return "\n\n".join(parts)


def _page(page_id: int, title: str, namespace: int, text: str, redirect: str = "") -> str:
    redirect_tag = f'    <redirect title="{escape(redirect)}" />\n' if redirect else ""
    return (
        f"  <page>\n    <title>{escape(title)}</title>\n    <ns>{namespace}</ns>\n"
        f"    <id>{page_id}</id>\n{redirect_tag}    <revision>\n      <id>{page_id}</id>\n"
        "      <timestamp>2024-05-01T00:00:00Z</timestamp>\n"
        "      <contributor><username>Editor</username><id>7</id></contributor>\n"
        "      <model>wikitext</model>\n      <format>text/x-wiki</format>\n"
        f'      <text bytes="{len(text.encode())}" xml:space="preserve">{escape(text)}</text>\n'
        "      <sha1>0</sha1>\n    </revision>\n  </page>\n"
    )


def write_dump(path: str, pages: int, seed: int = 0) -> dict:
    """A synthetic enwiki-like dump at ``path``, laid out as Wikimedia's multistream files are:
    the header in a bz2 stream of its own, then a stream per 100 pages; returns what it holds."""
    writer = _Writer(seed)
    counts = {"pages": pages, "articles": 0, "wikitext_bytes": 0}
    streams = [_HEADER]
    for page_id in range(1, pages + 1):
        if page_id % 100 == 1:
            streams.append("")
        r = writer.rng.random()
        title = writer.name()
        if r < 0.45:
            target = writer.name()
            streams[-1] += _page(page_id, title, 0, f"#REDIRECT [[{target}]]", redirect=target)
        elif r < 0.50:
            streams[-1] += _page(page_id, "Talk:" + title, 1, writer.paragraph())
        else:
            text = writer.article(title)
            counts["articles"] += 1
            counts["wikitext_bytes"] += len(text.encode())
            streams[-1] += _page(page_id, title, 0, text)
    streams[-1] += "</mediawiki>\n"
    with open(path, "wb") as f:
        for stream in streams:
            f.write(bz2.compress(stream.encode("utf-8")))
    return counts


def _timed(fn, trials: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(trials):
        started = time.process_time()
        result = fn()
        times.append(time.process_time() - started)
    return statistics.median(times), result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pages", type=int, default=2000)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--splitters", nargs="+", default=["syntok", "blingfire", "regex"])
    parser.add_argument("--dump", help="keep the dump here (default: a temporary file)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument(
        "--workers",
        nargs="+",
        type=int,
        default=[1, 2],
        help="--num-workers to time the whole read (wall clock) with",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = args.dump or os.path.join(tmp, "enwiki-synthetic-pages-articles.xml.bz2")
        held = write_dump(path, args.pages)
        held["bz2_bytes"] = os.path.getsize(path)

        def read():
            return sum(1 for _ in wikipedia._pages(path))

        def strip():
            words = 0
            for _, text in wikipedia.iter_articles(path):
                words += len(text.split())
            return words

        results = {"dump": held}
        results["read_s"], _ = _timed(read, args.trials)
        results["strip_s"], words = _timed(strip, args.trials)
        results["words"] = words
        for name in args.splitters:
            seconds, (documents, stats) = _timed(
                lambda name=name: sources.read_documents([path], splitter_name=name), args.trials
            )
            results[f"split_{name}_s"] = seconds
            results[f"sentences_{name}"] = stats.sentences
        for workers in args.workers:  # wall clock: the work is in the worker processes
            walls = []
            for _ in range(args.trials):
                started = time.perf_counter()
                sources.read_documents([path], num_workers=workers)
                walls.append(time.perf_counter() - started)
            results[f"wall_{workers}_workers_s"] = statistics.median(walls)
    pages, articles = held["pages"], held["articles"]
    print(
        f"{pages} pages, {articles} articles, {words / articles:.0f} words/article, "
        f"{held['wikitext_bytes'] / articles / 1e3:.1f} KB wikitext/article, "
        f"{held['bz2_bytes'] / 1e6:.1f} MB bz2; CPU s, median of {args.trials}, one core:"
    )
    print("| stage | s | pages/s | articles/s | words/s |")
    print("|---|---|---|---|---|")
    rows = [("read (bz2 + XML)", results["read_s"]), ("+ strip wikitext", results["strip_s"])]
    rows += [(f"+ split ({name})", results[f"split_{name}_s"]) for name in args.splitters]
    for label, seconds in rows:
        print(
            f"| {label} | {seconds:.2f} | {pages / seconds:,.0f} | {articles / seconds:,.0f} | "
            f"{words / seconds:,.0f} |"
        )
    print(
        f"\nthe whole read (syntok), wall clock, median of {args.trials}, {os.cpu_count()} cores:"
    )
    print("| --num-workers | s | pages/s | speed-up |")
    print("|---|---|---|---|")
    first = results[f"wall_{args.workers[0]}_workers_s"]
    for workers in args.workers:
        seconds = results[f"wall_{workers}_workers_s"]
        print(f"| {workers} | {seconds:.2f} | {pages / seconds:,.0f} | {first / seconds:.2f} |")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
