"""The real corpora's formats: Wikipedia XML dumps (bz2, multistream) and Parquet files, streamed
into documents of sentences; damaged files are one line naming them."""

from __future__ import annotations

import bz2
import json
import re

import pytest

from bert_jax import cli
from bert_jax.data.sources import documents, parquet, splits
from bert_jax.data.sources import wikipedia_dump as wikipedia
from bert_jax.data.sources.documents import read_documents
from bert_jax.runtime.errors import UserError
from tests.corpus_fixtures import (
    wikipedia_dump_xml,
    write_cut_anywhere_bz2,
    write_multistream_bz2,
    write_parquet,
    write_stream_per_page_bz2,
)
from tests.data_fixtures import minilm_vocab_path

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


@pytest.fixture(scope="module")
def dump_files(tmp_path_factory):
    """The same dump as .xml and as a two-stream .xml.bz2 (as enwiki's multistream files)."""
    root = tmp_path_factory.mktemp("wiki")
    plain = root / "enwiki-20240501-pages-articles.xml"
    plain.write_text(wikipedia_dump_xml(), encoding="utf-8")
    packed = root / "enwiki-20240501-pages-articles-multistream1.xml.bz2"
    write_multistream_bz2(packed, wikipedia_dump_xml())
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


def test_parquet_rows_are_documents(tmp_path, monkeypatch):
    path = tmp_path / "books-00000-of-00002.parquet"
    rows = [
        "Chapter one. It was a dark night.\nThe wind blew.",
        None,  # a null text: counted, skipped
        "   ",
        '"Who is there?" she asked. Nobody answered.',
        "Last row. Second sentence.",
    ]
    write_parquet(path, rows, id=list(range(5)), body=[f"Body {i}. More." for i in range(5)])
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
    broken_xml.write_text(wikipedia_dump_xml()[:-300], encoding="utf-8")
    assert str(broken_xml) in _prepare_error(capsys, tmp_path, broken_xml)

    good = tmp_path / "good.parquet"
    write_parquet(good, ["One doc. Two sentences."] * 4)
    damaged = tmp_path / "damaged.parquet"
    data = good.read_bytes()
    damaged.write_bytes(data[:8] + b"\xff" * (len(data) - 16) + data[-8:])
    assert f"{damaged}: not a readable Parquet file" in _prepare_error(capsys, tmp_path, damaged)
    not_parquet = tmp_path / "notes.parquet"
    not_parquet.write_text("plain text, not Parquet\n", encoding="utf-8")
    assert str(not_parquet) in _prepare_error(capsys, tmp_path, not_parquet)


def test_prepare_reads_dumps_and_parquet_and_records_the_splitter(tmp_path, dump_files):
    from bert_jax.data import sentences
    from bert_jax.data.preparation.local_runner import prepare_records
    from bert_jax.data.preparation.settings import PrepareSettings

    _, packed = dump_files
    books = tmp_path / "books.parquet"
    write_parquet(books, [f"Book {i} begins. It ends {i}." for i in range(6)])
    settings = PrepareSettings(dupe_factor=1, num_groups=2, splitter="regex")
    result = prepare_records([packed, books], minilm_vocab_path(), tmp_path / "out", settings)
    assert result.corpus_stats.documents == 8 and result.instance_stats.instances > 0
    recorded = json.loads((tmp_path / "out" / "prepare_config.json").read_text())
    assert recorded["splitter"] == "regex"
    assert sentences.splitter_identity("syntok").startswith("syntok ")


def test_prose_split_in_worker_processes_gives_the_same_documents(tmp_path, dump_files):
    _, packed = dump_files
    books = tmp_path / "books.parquet"
    write_parquet(books, [f"Book {i} begins. It ends {i}." if i % 7 else "" for i in range(90)])
    serial, serial_stats = read_documents([packed, books])
    parallel, parallel_stats = read_documents([packed, books], num_workers=2)
    assert parallel == serial and len(serial) == 2 + 77
    assert parallel_stats.as_dict() == serial_stats.as_dict()


def test_a_multistream_dump_is_read_in_chunks_of_whole_streams(tmp_path, dump_files, monkeypatch):
    """Workers read a multistream dump's splits (runs of whole streams) apart: the same documents,
    in the same order, as one process reading it whole; a dump in one stream, or in streams cut
    mid-page, is read whole."""
    xml = wikipedia_dump_xml(repeat=12)
    per_page, cut_anywhere = tmp_path / "per-page.xml.bz2", tmp_path / "pbzip2.xml.bz2"
    write_stream_per_page_bz2(per_page, xml)
    write_cut_anywhere_bz2(cut_anywhere, xml)
    header = wikipedia.multistream_header(str(per_page))
    assert header.startswith(b"<mediawiki") and header.rstrip().endswith(b"</siteinfo>")
    assert wikipedia.multistream_header(str(dump_files[1])) is not None  # two streams
    assert wikipedia.multistream_header(str(cut_anywhere)) is None
    assert wikipedia.multistream_header(str(dump_files[0])) is None  # .xml
    single = tmp_path / "single.xml.bz2"
    single.write_bytes(bz2.compress(xml.encode()))
    assert wikipedia.multistream_header(str(single)) is None

    data = per_page.read_bytes()
    chunks = [data[s.start : s.stop] for s in splits.cut_splits([per_page], target_bytes=400)]
    assert len(chunks) > 10 and b"".join(chunks) == data
    assert all(chunk.startswith(b"BZh9") for chunk in chunks)
    pages = [p for c in chunks for p in wikipedia.chunk_candidates(str(per_page), header, c)]
    assert (
        len(pages) == 7 * 12
        and [p[0] for p in pages if p] == ["Amberley", "Mercury", "Kerrin"] * 12
    )

    serial = read_documents([single])
    assert serial[0] == EXPECTED * 12 and serial[1].skipped_pages == 5 * 12
    monkeypatch.setattr(documents, "WORKER_SPLIT_BYTES", 400)  # many splits, two workers
    for dump in (per_page, cut_anywhere):
        parallel = read_documents([dump], num_workers=2)
        assert parallel[0] == serial[0]
        assert parallel[1].as_dict() == {**serial[1].as_dict(), "files": 1}


def test_a_damaged_stream_anywhere_is_one_line_naming_the_file(tmp_path):
    """Inside a stream or at its start (where bz2.BZ2File would end the file quietly, the pages
    after it lost), read whole or in chunks by workers."""
    dump = tmp_path / "enwiki-damaged.xml.bz2"
    write_stream_per_page_bz2(dump, wikipedia_dump_xml(repeat=12))
    good = dump.read_bytes()
    starts = [m.start() for m in re.finditer(rb"BZh91AY&SY", good)]
    inside, header = (len(good) * 3) // 4, starts[60]  # past the streams checked first
    for damaged in (inside + 20, header):
        dump.write_bytes(good[:damaged] + b"\x00" * 4 + good[damaged + 4 :])
        for workers in (1, 2):
            with pytest.raises(UserError, match=f"--input {dump}: not a readable Wikipedia XML"):
                read_documents([dump], num_workers=workers)


def test_wikitext_edge_cases():
    import mwparserfromhell

    text = (
        "The film [[Ali: Fear Eats the Soul]] (''{{lang|de|Angst essen Seele auf}}'') won; see "
        "[[wikt:prize|prize]] and [[:Category:Films|films]]. Its area is <math>x^2</math> km.\n"
        "[[de:Angst essen Seele auf]]\n<gallery>\nA.jpg|Caption.\n</gallery>\n"
        "Second&nbsp;paragraph.<br />Same paragraph."
    )
    assert wikipedia.wikitext_to_paragraphs(text) == [
        "The film Ali: Fear Eats the Soul won; see prize and films. Its area is km.",
        "Second paragraph. Same paragraph.",  # &nbsp; is a space like any other
    ]
    not_disambiguation = mwparserfromhell.parse("{{Index}} {{Disambiguation needed}} Text.")
    assert not wikipedia.is_disambiguation("Index", not_disambiguation)
    for page in ("{{School disambiguation}}", "{{hndis|Smith, John}}", "{{Dab}}"):
        assert wikipedia.is_disambiguation("X", mwparserfromhell.parse(page)), page
    assert wikipedia.is_disambiguation("Mercury (disambiguation)", mwparserfromhell.parse("x"))


def test_an_xml_file_that_is_no_mediawiki_export_is_one_line_naming_it(tmp_path, capsys):
    """An RSS feed (any .xml is read as a dump): mwxml's bare AssertionError was a traceback."""
    feed = tmp_path / "feed.xml"
    feed.write_text(
        '<?xml version="1.0" encoding="UTF-8"?>\n<rss version="2.0"><channel><title>News</title>'
        "<item><title>One</title><description>First story. It is short.</description></item>"
        "</channel></rss>\n",
        encoding="utf-8",
    )
    err = _prepare_error(capsys, tmp_path, feed)
    assert f"--input {feed}: not a MediaWiki XML export" in err and "<rss>" in err, err
    for workers in (1, 2):
        with pytest.raises(UserError, match="root element is <rss>"):
            read_documents([feed], num_workers=workers)


def test_parquet_text_as_dictionary_string_view_or_large_string(tmp_path):
    """What pandas writes for a `category` column (dictionary<int, string>), string_view and
    large_string are text like string; nulls in them stay bad records."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = ["One doc. Two sentences.", None, "Third doc. Ends here."]
    expected = [["One doc.", "Two sentences."], ["Third doc.", "Ends here."]]
    columns = {
        "dictionary": pa.array(rows).dictionary_encode(),
        "dictionary_large": pa.array(rows, pa.large_string()).dictionary_encode(),
        "string_view": pa.array(rows, pa.string_view()),
        "large_string": pa.array(rows, pa.large_string()),
    }
    for name, column in columns.items():
        path = tmp_path / f"{name}.parquet"
        pq.write_table(pa.table({"text": column}), path)
        documents, stats = read_documents([path], splitter_name="regex")
        assert documents == expected and stats.bad_records == 1, name


def test_a_parquet_column_that_is_not_text_is_one_line_naming_it_and_its_type(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    for name, column in {
        "ints": pa.array([1, 2, 3]),
        "binary": pa.array([b"One doc. Two.", b"x", b"y"]),
        "dict_ints": pa.array([1, 2, 1]).dictionary_encode(),
    }.items():
        path = tmp_path / f"{name}.parquet"
        pq.write_table(pa.table({"body": column}), path)
        stored = pq.read_schema(path).field("body").type  # a dictionary of ints reads as ints
        named = re.escape(f"--input {path}: column 'body' holds {stored}, not text")
        with pytest.raises(UserError, match=named):
            read_documents([path], text_field="body")
    numbers = tmp_path / "numbers.parquet"
    pq.write_table(pa.table({"text": pa.array([1, 2, 3])}), numbers)
    err = _prepare_error(capsys, tmp_path, numbers)
    assert f"{numbers}: column 'text' holds int64, not text" in err and "--text-field" in err, err
