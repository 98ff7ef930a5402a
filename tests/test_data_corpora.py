"""The real corpora's formats: Wikipedia XML dumps (bz2, multistream) and Parquet files, streamed
into documents of sentences; damaged files are one line naming them."""

from __future__ import annotations

import bz2
import json
from xml.sax.saxutils import escape

import pytest

from bert_jax import cli
from bert_jax.data import parquet, wikipedia
from bert_jax.data.sources import read_documents
from bert_jax.errors import UserError
from tests.data_fixtures import minilm_vocab_path

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


def _page(page_id: int, title: str, namespace: int, text: str, redirect: str = "") -> str:
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

EXPECTED = [
    [
        "Amberley is a market town in Sussex, England.",
        "It lies on the River Arun and had 2,300 inhabitants in 2011.",
        "Its church, St. Mary's, dates from the 12th century.",
        "The town grew after the canal opened in 1823 \u2013 most residents then worked in the "
        "mills.",
        "Dr. J. R. Lowe wrote its history.",
        "The first charter was granted in 1241 (see Charter rolls).",
    ],
    [
        "Kerrin is a mountain.",
        "Its summit is 4,310 m high.",
        "It was first climbed in 1889.",
        "The leader was Capt. Edward Moss.",
    ],
]


def _dump_xml() -> str:
    pages = [
        _page(1, "Amberley", 0, ARTICLE),
        _page(2, "Amberly", 0, "#REDIRECT [[Amberley]]", redirect="Amberley"),
        _page(3, "Mercury", 0, DISAMBIGUATION),
        _page(4, "Talk:Amberley", 1, "Is the population right? It seems low."),
        _page(5, "File:Amberley church.jpg", 6, "A photograph of the church."),
        _page(6, "Kerrin", 0, SECOND),
        _page(7, "Template:Infobox", 10, "Template documentation. Not prose."),
    ]
    return _SITEINFO + "".join(pages) + "</mediawiki>\n"


@pytest.fixture(scope="module")
def dump_files(tmp_path_factory):
    """The same dump as .xml and as a two-stream .xml.bz2 (as enwiki's multistream files)."""
    root = tmp_path_factory.mktemp("wiki")
    xml = _dump_xml().encode()
    plain = root / "enwiki-20240501-pages-articles.xml"
    plain.write_bytes(xml)
    cut = xml.index(b"  <page>", xml.index(b"<title>Mercury"))  # one stream per page range
    packed = root / "enwiki-20240501-pages-articles-multistream1.xml.bz2"
    packed.write_bytes(bz2.compress(xml[:cut]) + bz2.compress(xml[cut:]))
    return plain, packed


def test_a_wikipedia_dump_gives_the_articles_running_text(dump_files):
    plain, packed = dump_files
    documents, stats = read_documents([packed])
    assert documents == EXPECTED
    assert stats.skipped_pages == 5 and stats.documents == 2 and stats.files == 1
    assert read_documents([plain])[0] == EXPECTED
    # Paragraphs stay paragraphs: no sentence runs across a blank line of the wikitext.
    titles_and_texts = list(wikipedia.iter_articles(str(packed)))
    assert [title for title, _ in titles_and_texts] == ["Amberley", "Kerrin"]
    assert titles_and_texts[1][1].split("\n") == [
        "Kerrin is a mountain. Its summit is 4,310 m high.",
        "It was first climbed in 1889. The leader was Capt. Edward Moss.",
    ]


def _write_parquet(path, rows, row_group_size=2, **columns):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"text": rows, **columns})
    pq.write_table(table, path, row_group_size=row_group_size)


def test_parquet_rows_are_documents(tmp_path, monkeypatch):
    path = tmp_path / "books-00000-of-00002.parquet"
    rows = [
        "Chapter one. It was a dark night.\nThe wind blew.",
        None,  # a null text: counted, skipped
        "   ",
        '"Who is there?" she asked. Nobody answered.',
        "Last row. Second sentence.",
    ]
    _write_parquet(path, rows, id=list(range(5)), body=[f"Body {i}. More." for i in range(5)])
    monkeypatch.setattr(parquet, "BATCH_ROWS", 2)  # several batches per file, as at scale
    documents, stats = read_documents([path])
    assert documents == [
        ["Chapter one.", "It was a dark night.", "The wind blew."],
        ['"Who is there?" she asked.', "Nobody answered."],
        ["Last row.", "Second sentence."],
    ]
    assert stats.bad_records == 1 and stats.empty_documents == 1
    assert f"{path}: row 2: bad records" in stats.problems
    with pytest.raises(UserError, match=r"row 2: no string in column 'text'"):
        read_documents([path], strict=True)
    assert read_documents([path], text_field="body")[0][0] == ["Body 0.", "More."]
    with pytest.raises(UserError, match=r"no column 'content' \(columns: text, id, body\)"):
        read_documents([path], text_field="content")


def _prepare_error(capsys, tmp_path, source) -> str:
    argv = ["data", "prepare", "--input", str(source), "--tokenizer", minilm_vocab_path()]
    assert cli.main([*argv, "--output", str(tmp_path / f"out-{source.name}")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bert-jax data prepare: error: "), err
    return err


def test_damaged_dumps_and_parquet_files_are_one_line_naming_the_file(tmp_path, capsys, dump_files):
    _, packed = dump_files
    truncated = tmp_path / "enwiki-cut.xml.bz2"
    truncated.write_bytes(packed.read_bytes()[:-200])
    assert f"{truncated}: not a readable Wikipedia XML dump" in _prepare_error(
        capsys, tmp_path, truncated
    )
    garbage = tmp_path / "enwiki-garbage.xml.bz2"
    garbage.write_bytes(b"BZh91AY&SY" + bytes(range(256)) * 4)
    assert str(garbage) in _prepare_error(capsys, tmp_path, garbage)
    broken_xml = tmp_path / "enwiki-broken.xml"
    broken_xml.write_text(_dump_xml()[:-300], encoding="utf-8")
    assert str(broken_xml) in _prepare_error(capsys, tmp_path, broken_xml)

    good = tmp_path / "good.parquet"
    _write_parquet(good, ["One doc. Two sentences."] * 4)
    damaged = tmp_path / "damaged.parquet"
    data = good.read_bytes()
    damaged.write_bytes(data[:8] + b"\xff" * (len(data) - 16) + data[-8:])
    assert f"{damaged}: not a readable Parquet file" in _prepare_error(capsys, tmp_path, damaged)
    not_parquet = tmp_path / "notes.parquet"
    not_parquet.write_text("plain text, not Parquet\n", encoding="utf-8")
    assert str(not_parquet) in _prepare_error(capsys, tmp_path, not_parquet)


def test_prepare_reads_dumps_and_parquet_and_records_the_splitter(tmp_path, dump_files):
    from bert_jax.data import sentences
    from bert_jax.data.prepare import PrepareSettings, prepare_records

    _, packed = dump_files
    books = tmp_path / "books.parquet"
    _write_parquet(books, [f"Book {i} begins. It ends {i}." for i in range(6)])
    settings = PrepareSettings(dupe_factor=1, documents_per_shard=4, splitter="regex")
    result = prepare_records([packed, books], minilm_vocab_path(), tmp_path / "out", settings)
    assert result.corpus_stats.documents == 8 and result.instance_stats.instances > 0
    recorded = json.loads((tmp_path / "out" / "prepare_config.json").read_text())
    assert recorded["splitter"] == "regex"
    assert sentences.splitter_identity("syntok").startswith("syntok ")


def test_prose_split_in_worker_processes_gives_the_same_documents(tmp_path, dump_files):
    _, packed = dump_files
    books = tmp_path / "books.parquet"
    _write_parquet(books, [f"Book {i} begins. It ends {i}." if i % 7 else "" for i in range(90)])
    serial, serial_stats = read_documents([packed, books])
    parallel, parallel_stats = read_documents([packed, books], num_workers=2)
    assert parallel == serial and len(serial) == 2 + 77
    assert parallel_stats.as_dict() == serial_stats.as_dict()
