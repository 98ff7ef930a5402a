"""Small corpora in the real formats, written by the tests: a Wikipedia XML dump (every kind of
page and markup the reader must handle) and Parquet files."""

from __future__ import annotations

import bz2
import os
from xml.sax.saxutils import escape

_SITEINFO = """<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.11/" version="0.11" \
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
      <namespace key="6" case="first-letter">File</namespace>
      <namespace key="10" case="first-letter">Template</namespace>
    </namespaces>
  </siteinfo>
"""


def page(page_id: int, title: str, namespace: int, text: str, redirect: str = "") -> str:
    redirect_tag = f'    <redirect title="{escape(redirect)}" />\n' if redirect else ""
    return f"""  <page>
    <title>{escape(title)}</title>
    <ns>{namespace}</ns>
    <id>{page_id}</id>
{redirect_tag}    <revision>
      <id>{page_id * 100}</id>
      <timestamp>2024-05-01T00:00:00Z</timestamp>
      <contributor><username>Editor</username><id>7</id></contributor>
      <model>wikitext</model>
      <format>text/x-wiki</format>
      <text bytes="{len(text.encode())}" xml:space="preserve">{escape(text)}</text>
      <sha1>0</sha1>
    </revision>
  </page>
"""


ARTICLE = """{{Short description|Town in England}}
{{Infobox settlement
| name = Amberley
| population = 2,300
}}
'''Amberley''' is a market town in [[West Sussex|Sussex]], [[England]].<ref>{{cite web \
|url=https://example.org|title=Census}}</ref> It lies on the [[River Arun]] and had \
2,300 inhabitants in 2011.<ref name="ons"/>
Its church, St. Mary's, dates from the 12th century.

[[File:Amberley church.jpg|thumb|The church of [[St Mary]]]]
The town grew after the canal opened in 1823 &ndash; most residents then worked in the mills. \
Dr. J. R. Lowe wrote its history.<!-- citation needed -->

== History ==
The first charter was granted in 1241 (''see'' [[Charter rolls]]).
* The mill opened in 1750.
* The railway came in 1871.
# A numbered item.
; Term
: Its definition.
{| class="wikitable"
|-
! Year !! Population
|-
| 1801 || 613
|}

== See also ==
* [[Arundel]]

[[Category:Towns in West Sussex]]
[[de:Amberley]]
"""

SECOND = """'''Kerrin''' is a mountain.{{sfn|Moss|1890|p=4}} Its summit is 4,310 m high.

It was first climbed in 1889. [http://example.org/moss The leader] was Capt. Edward Moss.
"""

DISAMBIGUATION = """'''Mercury''' may refer to:
* [[Mercury (planet)]]
* [[Mercury (element)]]
{{disambiguation}}
"""


def wikipedia_dump_xml(repeat: int = 1) -> str:
    """Seven pages (two articles, a redirect, a disambiguation page, three other namespaces),
    `repeat` times over."""
    pages = [
        page(1, "Amberley", 0, ARTICLE),
        page(2, "Amberly", 0, "#REDIRECT [[Amberley]]", redirect="Amberley"),
        page(3, "Mercury", 0, DISAMBIGUATION),
        page(4, "Talk:Amberley", 1, "Is the population right? It seems low."),
        page(5, "File:Amberley church.jpg", 6, "A photograph of the church."),
        page(6, "Kerrin", 0, SECOND),
        page(7, "Template:Infobox", 10, "Template documentation. Not prose."),
    ]
    return _SITEINFO + "".join(pages) * repeat + "</mediawiki>\n"


# Five long articles in enwiki's markup (tests/wikitext/TITLE.wiki), written for the tests in the
# patterns real articles carry: infoboxes, nested templates, references with templates inside,
# tables with cell styles and unbalanced bold and italics, galleries, math, nowiki, definition
# lists, entities, comments, magic words; beside each, the running text it must come out as, a
# paragraph per line (TITLE.txt).
WIKITEXT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "wikitext")


def realistic_articles() -> list[tuple[str, str, list[str]]]:
    """(title, wikitext, expected paragraphs) of each article in ``WIKITEXT_DIR``."""
    articles = []
    for name in sorted(os.listdir(WIKITEXT_DIR)):
        if name.endswith(".wiki"):
            stem = os.path.join(WIKITEXT_DIR, name[: -len(".wiki")])
            with open(stem + ".wiki", encoding="utf-8") as f:
                wikitext = f.read()
            with open(stem + ".txt", encoding="utf-8") as f:
                expected = f.read().splitlines()
            articles.append((name[: -len(".wiki")].replace("_", " "), wikitext, expected))
    return articles


def realistic_dump_xml(siteinfo: bool = True, repeat: int = 1) -> str:
    """The realistic articles as a pages-articles export, each followed by a redirect to it and
    its talk page (``repeat`` times over, titles numbered after the first); without
    ``<siteinfo>`` (optional in the export schema) when ``siteinfo`` is False."""
    pages, page_id = [], 0
    for copy in range(repeat):
        for title, wikitext, _ in realistic_articles():
            title = title if copy == 0 else f"{title} {copy}"
            pages.append(page(page_id + 1, title, 0, wikitext))
            pages.append(page(page_id + 2, f"{title}s", 0, f"#REDIRECT [[{title}]]", title))
            pages.append(page(page_id + 3, f"Talk:{title}", 1, "== Sources ==\nCited? ~~~~"))
            page_id += 3
    header = _SITEINFO if siteinfo else _SITEINFO.partition("  <siteinfo>")[0]
    return header + "".join(pages) + "</mediawiki>\n"


def write_multistream_bz2(path, xml: str) -> None:
    """``xml`` as two concatenated bz2 streams, as enwiki's multistream dumps are."""
    data = xml.encode()
    cut = data.index(b"  <page>", data.index(b"<title>Mercury"))
    with open(path, "wb") as f:
        f.write(bz2.compress(data[:cut]) + bz2.compress(data[cut:]))


def write_stream_per_page_bz2(path, xml: str) -> None:
    """``xml`` laid out as Wikimedia writes a multistream dump: the header in a bz2 stream of
    its own, then whole pages per stream (one here; enwiki: 100), the closing tag in the last."""
    data = xml.encode()
    cuts = [i for i in range(len(data)) if data.startswith(b"  <page>", i)]
    with open(path, "wb") as f:
        for start, end in zip([0, *cuts], [*cuts, len(data)]):
            f.write(bz2.compress(data[start:end]))


def write_cut_anywhere_bz2(path, xml: str, every: int = 300) -> None:
    """``xml`` as parallel compressors (pbzip2) write it: a bz2 stream per ``every`` bytes,
    cut wherever that falls, mid-page."""
    data = xml.encode()
    with open(path, "wb") as f:
        for start in range(0, len(data), every):
            f.write(bz2.compress(data[start : start + every]))


def write_parquet(path, rows, row_group_size=2, **columns):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"text": rows, **columns})
    pq.write_table(table, path, row_group_size=row_group_size)
