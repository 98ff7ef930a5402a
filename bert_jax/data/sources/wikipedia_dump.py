"""Wikipedia XML dumps (``*.xml.bz2``, ``*.xml-p1p41242.bz2``, ``*.xml``) -> a document per article.

Public API:

- ``is_wikipedia_dump(path)``: by name (``.xml``, ``.bz2``), the sources ``sources`` hands here.
- ``iter_articles(path) -> Iterator[(title, text)]``: the articles of a dump, streamed; ``text``
  holds one paragraph per line. It is ``iter_candidates`` (reading: bz2, XML, namespace and
  redirect; cheap) then ``article_text`` (parsing the wikitext: the costly part).
- The stripping alone (``wikitext_to_paragraphs``) and the markup that stripped text must not
  hold (``markup_leftovers``) are wikitext.py's.
- ``multistream_header``, ``chunk_candidates``, ``probe_head``, ``first_stream_header``,
  ``next_stream_start`` and ``iter_streams``: a multistream dump read apart, by byte ranges of
  whole streams (``splits``).
  Wikimedia's ``*-multistream*.xml*.bz2`` files are bz2 streams of 100 whole pages each (the
  first holds the header): cut at stream starts, each range of streams is decompressed and
  parsed under the dump's header, so a dump's reading runs in ``--num-workers`` processes too,
  in input order (``splits``). A dump in one stream, or in streams cut mid-page (pbzip2), is
  read whole in one process.

Pages are streamed with ``mwxml`` (one page in memory at a time; ``.bz2`` decompressed on the
fly, stream after stream, a damaged stream anywhere an error rather than the end of the file as
``bz2.BZ2File`` takes it; local or ``gs://`` through ``bert_jax.runtime.fs``) and kept when they are
articles: namespace 0, not a redirect, not a disambiguation page (a disambiguation template such
as ``{{disambiguation}}``, ``{{dab}}``, ``{{hndis}}``, or a title ending in "(disambiguation)").
Their wikitext is parsed with ``mwparserfromhell`` and only running text stays, as the paper
asks ("text passages only; lists, tables and headers ignored"): templates (infoboxes, citations,
navigation boxes), references, tables, lists (``*``, ``#``, ``;``, ``:`` lines), headings,
comments, magic words, file/image/category/interlanguage links, and tags that hold no prose
(``<math>``, ``<gallery>``, ...) are dropped; a link keeps its text, bold and italics their
words, ``<nowiki>`` its content as literal text, an HTML entity its character (a no-break space,
like any other whitespace, becomes an ordinary space). Bold and italics are resolved line by
line as MediaWiki does, not by the parser, whose marks may run across lines and tables (one left
open in a table cell took the table's end, or a paragraph, with it). Paragraphs stay paragraphs:
wikitext's blank lines and block tags (``<blockquote>``, ``<div>``) separate them, the lines
inside one are joined, and a sentence never runs across two. ``wikitext.markup_leftovers(text)``
finds markup that stripped text should never hold (the tests and
``benchmarks/wikipedia_extractors_bench.py`` count it).

An export without ``<siteinfo>`` (optional in the schema) is read. A dump that is not valid bz2
or not valid XML, or XML that is no MediaWiki export (an RSS feed named ``.xml``), is a
``UserError`` naming the file.
"""

from __future__ import annotations

import bz2
import io
import re
from collections.abc import Iterator
from typing import IO

from bert_jax.data.sources.wikitext import (
    is_disambiguation,
    parse,
    wikitext_to_paragraphs,
)
from bert_jax.runtime import fs
from bert_jax.runtime.errors import UserError, user_path


def is_wikipedia_dump(path: str) -> bool:
    """``.xml`` or any ``.bz2`` (the multistream parts are named ``...xml-p1p41242.bz2``; a bz2
    file that is no dump is refused naming it, rather than read as text)."""
    return path.endswith((".xml", ".bz2"))


class Counts:
    """What a dump held besides articles (``corpus_stats.CorpusStats`` takes them)."""

    def __init__(self) -> None:
        self.pages = 0
        self.skipped_pages = 0


def _pages(path: str, raw: IO[bytes] | None = None) -> Iterator[tuple[int, bool, str, str | None]]:
    """(namespace, is a redirect, title, latest text) of each page (read from ``raw`` if given,
    a file this closes); a damaged file (bz2 or XML) is a UserError naming it."""
    if raw is None:
        with user_path(path, "--input"):
            raw = fs.open(path, "rb")
    stream = io.BufferedReader(_Bz2Streams(raw), 1 << 20) if path.endswith(".bz2") else raw
    try:
        yield from _parse(stream, path)
    finally:
        raw.close()


def _decompressed(raw: IO[bytes]) -> Iterator[bytes]:
    """The bz2 streams of ``raw`` one after another (a multistream dump is many), decompressed.
    Unlike ``bz2.BZ2File`` and ``bz2.decompress``, which end the file quietly at the first bytes
    after a stream that are not a valid stream, a damaged stream anywhere is an error."""
    decompressor = bz2.BZ2Decompressor()
    while block := raw.read(1 << 20):
        while block:
            if decompressor.eof:
                decompressor = bz2.BZ2Decompressor()
            yield decompressor.decompress(block)
            block = decompressor.unused_data if decompressor.eof else b""
    if not decompressor.eof:
        raise EOFError("the last bz2 stream is cut short")


class _Bz2Streams(io.RawIOBase):
    """``_decompressed(raw)`` as a file to read."""

    def __init__(self, raw: IO[bytes]):
        self.blocks, self.rest = _decompressed(raw), memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self.rest:
            block = next(self.blocks, None)
            if block is None:
                return 0
            self.rest = memoryview(block)
        size = min(len(buffer), len(self.rest))
        buffer[:size], self.rest = self.rest[:size], self.rest[size:]
        return size


def _parse(stream: IO[bytes], path: str) -> Iterator[tuple[int, bool, str, str | None]]:
    from mwxml.errors import MalformedXML

    try:
        for page in _dump_pages(stream, path):
            text = None
            for revision in page:  # a pages-articles dump holds the latest revision only
                text = revision.text
            yield page.namespace, bool(page.redirect), page.title, text
    except (OSError, EOFError, SyntaxError, MalformedXML) as err:
        raise _unreadable(path, err) from err


def _dump_pages(stream: IO[bytes], path: str) -> Iterator:
    """mwxml's pages of an export, as ``mwxml.Dump.from_file`` gives them, but with
    ``<siteinfo>`` optional (as the export schema has it) and any other root element, an RSS
    feed's, a UserError naming it (mwxml asserts it)."""
    import mwxml
    from mwxml.element_iterator import ElementIterator
    from mwxml.errors import MalformedXML

    root = ElementIterator.from_file(stream)
    if root.tag != "mediawiki":
        raise UserError(
            f"--input {path}: not a MediaWiki XML export (its root element is <{root.tag}>, not "
            "<mediawiki>); every .xml and .bz2 input is read as a Wikipedia dump"
        )
    namespaces = None
    for element in root:
        if element.tag == "page":
            yield mwxml.Page.from_element(element, namespaces)
        elif element.tag == "siteinfo":
            site_info = mwxml.SiteInfo.from_element(element)
            if site_info.namespaces is not None:
                namespaces = {namespace.name: namespace for namespace in site_info.namespaces}
        elif element.tag != "logitem":
            raise MalformedXML(f"unexpected <{element.tag}> in <mediawiki>")


def _unreadable(path: str, err: BaseException) -> UserError:
    """bz2: "Invalid data stream" (OSError) or a stream cut short (EOFError); XML: ElementTree's
    ParseError (a SyntaxError) or mwxml's MalformedXML."""
    reason = " ".join("".join(c if c.isprintable() else " " for c in str(err)).split())
    return UserError(f"--input {path}: not a readable Wikipedia XML dump ({reason})")


def _candidate(page: tuple[int, bool, str, str | None]) -> tuple[str, str] | None:
    """(title, wikitext) of a page that may be an article: namespace 0, not a redirect, not
    empty (cheap: no wikitext is parsed); None otherwise."""
    namespace, redirect, title, text = page
    if namespace != 0 or redirect or not text or text.lstrip()[:9].upper() == "#REDIRECT":
        return None
    return title, text


def iter_candidates(
    path: str, counts: Counts | None = None, raw: IO[bytes] | None = None
) -> Iterator[tuple[str, str]]:
    """``_candidate`` of each page of ``path`` (read from ``raw`` if given), in this process;
    ``article_text`` finishes the job."""
    counts = Counts() if counts is None else counts
    for page in _pages(path, raw):
        counts.pages += 1
        candidate = _candidate(page)
        if candidate is None:
            counts.skipped_pages += 1
            continue
        yield candidate


# --- A multistream dump read apart: ranges of whole bz2 streams, each parsed on its own ---

# Where a bz2 stream starts: "BZh", the block size, the first block's magic (48 bits).
_STREAM_START = re.compile(rb"BZh[1-9]1AY&SY")
CHUNK_BYTES = 1 << 20  # compressed bytes read at a time: about 10 streams of enwiki's 100 pages
_PROBE_BYTES = 8 << 20
_PROBE_STREAMS = 4


def multistream_header(path: str, head: bytes | None = None) -> bytes | None:
    """The XML before the first page (``<mediawiki>`` and ``<siteinfo>``) when ``path`` is a
    multistream dump whose streams hold whole pages, as Wikimedia writes them (checked on its
    first streams), so that chunks of streams can be read apart; None otherwise (one stream, or
    streams cut anywhere, as pbzip2 cuts them): the file is read as one stream. ``head``: the
    file's first bytes if the caller read them (``probe_head``), else its first 8 MiB are read."""
    if not path.endswith(".bz2"):
        return None
    if head is None:
        with user_path(path, "--input"):
            head = fs.read_bytes(path, 0, _PROBE_BYTES)
    starts = [m.start() for m in _STREAM_START.finditer(head)][: _PROBE_STREAMS + 1]
    if len(starts) < 2 or starts[0] != 0:
        return None
    try:
        texts = [bz2.decompress(head[a:b]) for a, b in zip(starts, starts[1:])]
    except (OSError, EOFError, ValueError):
        return None
    if b"</siteinfo>" not in texts[0]:
        return None
    header, _, first = texts[0].partition(b"</siteinfo>")
    for text in [first, *texts[1:]]:
        text = text.strip()
        if text and not (text.startswith(b"<page>") and text.endswith(b"</page>")):
            return None
    return header + b"</siteinfo>\n"


def probe_head(stream: IO[bytes], block: int = 1 << 10) -> bytes:
    """The first bytes of a file open as ``stream`` that ``multistream_header`` needs: up to the
    stream start after those it checks (or 8 MiB, or the end), read in blocks that double."""
    head = b""
    while len(head) < _PROBE_BYTES:
        data = stream.read(min(block, _PROBE_BYTES - len(head)))
        if not data:
            break
        head, block = head + data, 2 * block
        if len(_STREAM_START.findall(head)) > _PROBE_STREAMS + 1:
            break
    return head


def first_stream_header(path: str, stream: IO[bytes], block: int = 1 << 10) -> bytes:
    """``multistream_header``'s header read from the dump's first bz2 stream alone (``stream``
    at byte 0, read in blocks that double until that stream ends): what a reader of a later
    range of streams parses its pages under."""
    decompressor, xml = bz2.BZ2Decompressor(), b""
    try:
        while not decompressor.eof and (data := stream.read(block)):
            xml, block = xml + decompressor.decompress(data), 2 * block
    except (OSError, EOFError) as err:
        raise _unreadable(path, err) from err
    if b"</siteinfo>" not in xml:
        raise _unreadable(path, ValueError("no <siteinfo> in its first bz2 stream"))
    return xml.partition(b"</siteinfo>")[0] + b"</siteinfo>\n"


def next_stream_start(data: bytes, position: int = 0) -> int:
    """Where the first bz2 stream that starts at or after ``position`` in ``data`` starts;
    -1 if none does."""
    match = _STREAM_START.search(data, position)
    return -1 if match is None else match.start()


def iter_streams(
    stream: IO[bytes], start: int, block: int = CHUNK_BYTES
) -> Iterator[tuple[int, bytes]]:
    """(byte offset in the file, compressed bytes) of each bz2 stream read from ``stream``, which
    is at byte ``start`` of the file, a stream start; joined they are what ``stream`` holds."""
    buffer, offset = b"", start
    while data := stream.read(block):
        searched = max(1, len(buffer) - 9)  # a start may straddle the blocks
        buffer += data
        starts = [m.start() for m in _STREAM_START.finditer(buffer, searched)]
        for begin, end in zip([0, *starts], starts):
            yield offset + begin, buffer[begin:end]
        if starts:
            offset, buffer = offset + starts[-1], buffer[starts[-1] :]
    if buffer:
        yield offset, buffer


def chunk_candidates(path: str, header: bytes, chunk: bytes) -> list[tuple[str, str] | None]:
    """``_candidate`` of each page in ``chunk`` (whole streams of ``path``, parsed under the
    dump's ``header``), in order; None for each page that is no article."""
    try:
        xml = b"".join(_decompressed(io.BytesIO(chunk)))
    except (OSError, EOFError) as err:
        raise _unreadable(path, err) from err
    if b"</siteinfo>" in xml:  # the first chunk: its header is `header`
        xml = xml.partition(b"</siteinfo>")[2]
    xml = xml.rpartition(b"</mediawiki>")[0] if b"</mediawiki>" in xml else xml
    document = io.BytesIO(header + xml + b"</mediawiki>\n")
    return [_candidate(page) for page in _parse(document, path)]


def article_text(title: str, wikitext: str) -> str | None:
    """The running text of an article, one paragraph per line; None for a disambiguation page."""
    wikicode = parse(wikitext)
    if is_disambiguation(title, wikicode):
        return None
    return "\n".join(wikitext_to_paragraphs(wikicode))


def iter_articles(path: str, counts: Counts | None = None) -> Iterator[tuple[str, str]]:
    """(title, text with one paragraph per line) of every article page of the dump at ``path``."""
    counts = Counts() if counts is None else counts
    for title, wikitext in iter_candidates(path, counts):
        text = article_text(title, wikitext)
        if text is None:
            counts.skipped_pages += 1
            continue
        yield title, text
