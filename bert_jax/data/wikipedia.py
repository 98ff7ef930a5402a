"""Wikipedia XML dumps (``*.xml.bz2``, ``*.xml-p1p41242.bz2``, ``*.xml``) -> a document per article.

Public API:

- ``is_wikipedia_dump(path)``: by name (``.xml``, ``.bz2``), the sources ``sources`` hands here.
- ``iter_articles(path) -> Iterator[(title, text)]``: the articles of a dump, streamed; ``text``
  holds one paragraph per line. It is ``iter_candidates`` (reading: bz2, XML, namespace and
  redirect; cheap) then ``article_text`` (parsing the wikitext: the costly part, which
  ``sources`` runs in worker processes).
- ``wikitext_to_paragraphs(wikitext) -> list[str]``: the stripping alone (``parse`` first);
  ``markup_leftovers(text)``: the markup that stripped text must not hold.
- ``multistream_header``, ``iter_chunks``, ``chunk_candidates``: a multistream dump read apart.
  Wikimedia's ``*-multistream*.xml*.bz2`` files are bz2 streams of 100 whole pages each (the
  first holds the header): cut at stream starts into chunks of about ``CHUNK_BYTES``, each chunk
  is decompressed and parsed by a worker under the dump's header, so a dump's reading runs in
  ``--num-workers`` processes too, in input order (``sources``). A dump in one stream, or in
  streams cut mid-page (pbzip2), is read whole in one process.

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
inside one are joined, and a sentence never runs across two. ``markup_leftovers(text)`` finds
markup that stripped text should never hold (the tests and
``benchmarks/wikipedia_extractors_bench.py`` count it).

An export without ``<siteinfo>`` (optional in the schema) is read. A dump that is not valid bz2
or not valid XML, or XML that is no MediaWiki export (an RSS feed named ``.xml``), is a
``UserError`` naming the file.
"""

from __future__ import annotations

import bz2
import html
import io
import re
from collections.abc import Iterator
from typing import IO

from bert_jax.runtime import fs
from bert_jax.runtime.errors import UserError, user_path

# Tags whose content is not running text.
_DROPPED_TAGS = frozenset(
    "ref references gallery math chem ce score timeline graph mapframe maplink syntaxhighlight "
    "source pre code templatedata templatestyles imagemap inputbox hiero categorytree "
    "table tr td th caption ul ol dl li dt dd noinclude includeonly onlyinclude".split()
)
# Wiki markup that starts a list line (`*`, `#`, `;`, `:`): the whole line is dropped.
_LIST_MARKUP = frozenset("*#;:")
_LINE_BREAK_TAGS = frozenset(("br", "hr"))
# Tags that are blocks of their own: their text is a paragraph.
_BLOCK_TAGS = frozenset(("blockquote", "div", "p", "center", "poem"))
_DROPPED_LINK_NAMESPACES = frozenset(("file", "image", "media", "category"))
# An interlanguage link `[[de:Titel]]` (shown in the sidebar, not the text): a lower-case
# language code, where an article's title is capitalised (`[[Ali: Fear Eats the Soul]]`).
_INTERLANGUAGE = re.compile(r"^[a-z]{2,3}(-[a-z]+)*:")
# Besides these, any template whose name ends in " disambiguation" ({{school disambiguation}}).
_DISAMBIGUATION_TEMPLATES = frozenset(
    ("disambiguation", "disambig", "dab", "disamb", "dis", "hndis", "geodis", "numberdis")
)
_BEHAVIOUR_SWITCH = re.compile(r"__[A-Z]+__")
# What dropped templates leave in brackets: "({{IPAc-en|...}}; {{lang|de|Wien}}; 1840-1926)".
_PUNCTUATION_AFTER_BRACKET = re.compile(r"\(\s*(?:[,;:]\s*)+")
_PUNCTUATION_BEFORE_BRACKET = re.compile(r"(?:\s*[,;:])+\s*\)")
_EMPTY_BRACKETS = re.compile(r"\(\s*\)")
_SPACE_BEFORE_PUNCTUATION = re.compile(r"\s+([,.;:!?])")
# Marks a list line while the text is assembled; such lines are removed afterwards.
_LIST_LINE = "\x00"
# Marks a block tag's edges (a paragraph's) while the text is assembled.
_BLOCK = "\x01"
# A run of two or more apostrophes in the text, kept as "\x02" run "\x03" until its line is
# complete (so that runs on either side of a dropped node do not join); XML 1.0 holds neither
# character, so no dump does.
_QUOTE_RUN = re.compile(r"''+")
_QUOTE_MARK = re.compile("\x02('+)\x03")
# A <ref> that the parser left as text (unclosed, or inside what it gave up on), with its content.
_STRAY_REF = re.compile(r"<ref\b[^<>]*?(?:/>|>.*?</ref\s*>)|</?ref\b[^<>]*>", re.S | re.I)
# Markup that stripped text never holds (``markup_leftovers``). Tags by name (MediaWiki's own
# and the HTML it allows): prose may hold "<path>" or "a == b", which MediaWiki shows as text.
_MARKUP_TAGS = "|".join(
    sorted(
        _DROPPED_TAGS
        | _BLOCK_TAGS
        | _LINE_BREAK_TAGS
        | frozenset(
            "nowiki span small big sup sub font b i u s strike del ins abbr cite q tt var kbd "
            "section indicator".split()
        )
    )
)
_LEFTOVER = re.compile(
    "|".join(
        (
            r"\{\||\|\}|\|-|\|\+",  # tables
            r"\{\{|\}\}|\[\[|\]\]",  # templates, links
            r"\[(?:https?:)?//",  # external links
            r"''",  # bold, italics
            rf"</?(?i:{_MARKUP_TAGS})\b[^<>]*>|<!--",  # tags (ref, math, br, ...), comments
            r"&(?:[a-zA-Z][a-zA-Z0-9]*|#[0-9]+|#[xX][0-9a-fA-F]+);",  # entities
            r"(?P<heading>={2,6}) ?[A-Z0-9'\"][^=\n]{0,80}? ?(?P=heading)(?!=)",  # headings
            r"__[A-Z]+__",  # magic words
            r"\b(?:Category|File|Image):",  # category and file links
            r"\b(?:style|class|colspan|rowspan|align|width|scope)\s*=",  # table attributes
        )
    )
)


def is_wikipedia_dump(path: str) -> bool:
    """``.xml`` or any ``.bz2`` (the multistream parts are named ``...xml-p1p41242.bz2``; a bz2
    file that is no dump is refused naming it, rather than read as text)."""
    return path.endswith((".xml", ".bz2"))


def _template_name(template) -> str:
    return " ".join(str(template.name).replace("_", " ").split()).lower()


def is_disambiguation(title: str, wikicode) -> bool:
    if title.rstrip().endswith("(disambiguation)"):
        return True
    for template in wikicode.filter_templates(recursive=False):
        name = _template_name(template)
        if name in _DISAMBIGUATION_TEMPLATES or name.endswith(" disambiguation"):
            return True
    return False


def _link_is_dropped(title: str) -> bool:
    title = title.strip()
    if title.startswith(":"):  # `[[:Category:X|...]]` is an ordinary link to the page
        return False
    prefix, colon, _ = title.partition(":")
    if colon and prefix.strip().lower() in _DROPPED_LINK_NAMESPACES:
        return True
    return bool(_INTERLANGUAGE.match(title))


def _mark_quotes(match: re.Match) -> str:
    return "\x02" + match.group() + "\x03"


def _append_text(nodes, out: list[str]) -> None:
    """The running text of ``nodes`` (a Wikicode's), appended to ``out`` piece by piece."""
    import mwparserfromhell.nodes as n

    for node in nodes:
        if isinstance(node, n.Text):
            value = node.value
            out.append(_QUOTE_RUN.sub(_mark_quotes, value) if "''" in value else value)
        elif isinstance(node, n.Wikilink):
            if _link_is_dropped(str(node.title)):
                continue
            if node.text is not None:
                _append_text(node.text.nodes, out)
            else:  # the title as shown: its entities decoded, without a #section
                title: list[str] = []
                _append_text(node.title.nodes, title)
                out.append("".join(title).lstrip(":").split("#")[0])
        elif isinstance(node, n.ExternalLink):
            if node.title is not None:
                _append_text(node.title.nodes, out)
        elif isinstance(node, n.HTMLEntity):
            out.append(node.normalize())
        elif isinstance(node, n.Tag):
            tag = str(node.tag).strip().lower()
            if node.wiki_markup in _LIST_MARKUP:
                out.append(_LIST_LINE)
            elif tag in _LINE_BREAK_TAGS:
                out.append("\n" if tag == "hr" else " ")
            elif tag == "nowiki":  # literal text, its entities decoded as the page shows them
                if node.contents is not None:
                    out.append(html.unescape(str(node.contents)))
            elif tag in _DROPPED_TAGS or node.contents is None:
                continue
            elif tag in _BLOCK_TAGS:
                out.append(_BLOCK)
                _append_text(node.contents.nodes, out)
                out.append(_BLOCK)
            else:
                _append_text(node.contents.nodes, out)
        # Templates, headings, comments, arguments: nothing of them is running text.


def _resolve_quotes(line: str) -> str:
    """``line`` without its bold and italics marks, read as MediaWiki's ``doQuotes`` reads them,
    a line at a time: four apostrophes are an apostrophe and bold, more than five the extra
    ones and bold italics; with an odd count of both bold and italics on the line, one bold is
    an apostrophe and italics (an italic title's possessive): the first after a one-letter
    word, else the first after a longer one, else the first after a space. A mark left open
    ends with its line; no word is lost."""
    parts = _QUOTE_MARK.split(line)  # text, run, text, run, ..., text
    italics = bold = 0
    for i in range(1, len(parts), 2):
        run = len(parts[i])
        if run == 4:
            parts[i - 1] += "'"
            run = 3
        elif run > 5:
            parts[i - 1] += "'" * (run - 5)
            run = 5
        parts[i] = run
        italics += run in (2, 5)
        bold += run in (3, 5)
    if italics % 2 and bold % 2:
        single_letter = multi_letter = after_space = None
        for i in range(1, len(parts), 2):
            if parts[i] != 3:
                continue
            before = parts[i - 1]
            if before[-1:] == " ":
                after_space = after_space or i
            elif before[-2:-1] == " ":
                single_letter = i
                break
            else:
                multi_letter = multi_letter or i
        chosen = single_letter or multi_letter or after_space
        if chosen:
            parts[chosen - 1] += "'"
    return "".join(parts[0::2])


def _is_table_row(line: str) -> bool:
    return line.lstrip().startswith(("|", "!"))


def _without_unparsed_tables(lines: list[str]) -> list[str]:
    """``lines`` without the tables that the parser left as text (it gives up on some malformed
    ones): from a ``{|`` line to its ``|}``; a table never closed ends with its last row (a
    ``|`` or ``!`` line) and the lines that continue that row."""
    closing: dict[int, int] = {}  # a `{|` line -> its `|}` line
    opened: list[int] = []
    for i, line in enumerate(lines):
        row = line.lstrip()
        if row.startswith("{|"):
            opened.append(i)
        elif row.startswith("|}") and opened:
            closing[opened.pop()] = i
    kept: list[str] = []
    i = 0
    while i < len(lines):
        if not lines[i].lstrip().startswith("{|"):
            kept.append(lines[i])
            i += 1
            continue
        if i in closing:
            end = closing[i] + 1
        else:
            end = i + 1
            while end < len(lines):
                if lines[end].strip():
                    end += 1
                    continue
                following = end
                while following < len(lines) and not lines[following].strip():
                    following += 1
                if following == len(lines) or not _is_table_row(lines[following]):
                    break
                end = following
        kept.append("")
        i = end
    return kept


def parse(wikitext: str):
    """``wikitext`` parsed by mwparserfromhell with bold and italics left as text:
    ``wikitext_to_paragraphs`` reads them line by line, as MediaWiki does."""
    import mwparserfromhell

    return mwparserfromhell.parse(wikitext, skip_style_tags=True)


def wikitext_to_paragraphs(wikicode) -> list[str]:
    """Paragraphs of running text (``wikicode``: a string or ``parse``'s ``Wikicode``)."""
    if isinstance(wikicode, str):
        wikicode = parse(wikicode)
    pieces: list[str] = []
    _append_text(wikicode.nodes, pieces)
    text = "".join(pieces)
    if "<ref" in text or "</ref" in text:
        text = _STRAY_REF.sub("", text)
    lines = text.split("\n")
    if "{|" in text:
        lines = _without_unparsed_tables(lines)
    paragraphs: list[str] = []
    current: list[str] = []
    for line in lines:
        stripped = line.strip()
        if _LIST_LINE in stripped or (  # a list line (the parser may see a `;` line's `:` later)
            len(stripped) > 1 and stripped[0] == stripped[-1] == "="  # a heading left as text
        ):
            line = _BLOCK  # a list item ends the paragraph before it, as in the rendered page
        elif "\x02" in line:
            line = _resolve_quotes(line)
        for k, segment in enumerate(line.split(_BLOCK)):
            segment = _BEHAVIOUR_SWITCH.sub("", segment).strip()
            if segment and not k:
                current.append(segment)
                continue
            if current:  # a blank line or a block's edge: the paragraph ends
                paragraphs.append(" ".join(current))
            current = [segment] if segment else []
    if current:
        paragraphs.append(" ".join(current))
    cleaned = []
    for paragraph in paragraphs:
        if "(" in paragraph:
            paragraph = _PUNCTUATION_AFTER_BRACKET.sub("(", paragraph)
            paragraph = _PUNCTUATION_BEFORE_BRACKET.sub(")", paragraph)
            paragraph = _EMPTY_BRACKETS.sub("", paragraph)
        paragraph = _SPACE_BEFORE_PUNCTUATION.sub(r"\1", " ".join(paragraph.split()))
        if any(c.isalpha() for c in paragraph):
            cleaned.append(paragraph)
    return cleaned


def markup_leftovers(text: str) -> list[str]:
    """The pieces of wiki markup in ``text``, which stripped text never holds: table, template
    and link brackets, bold and italics marks, tags and comments, entities, headings, magic
    words, category and file links, table attributes. (``<nowiki>`` content is literal text and
    may hold any of them.)"""
    return [match.group() for match in _LEFTOVER.finditer(text)]


class Counts:
    """What a dump held besides articles (``sources.CorpusStats`` takes them)."""

    def __init__(self) -> None:
        self.pages = 0
        self.skipped_pages = 0


def _pages(path: str) -> Iterator[tuple[int, bool, str, str | None]]:
    """(namespace, is a redirect, title, latest text) of each page; a damaged file (bz2 or
    XML) is a UserError naming it."""
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


def iter_candidates(path: str, counts: Counts | None = None) -> Iterator[tuple[str, str]]:
    """``_candidate`` of each page of ``path``, in this process; ``article_text`` finishes the
    job."""
    counts = Counts() if counts is None else counts
    for page in _pages(path):
        counts.pages += 1
        candidate = _candidate(page)
        if candidate is None:
            counts.skipped_pages += 1
            continue
        yield candidate


# --- A multistream dump read in parallel: chunks of whole bz2 streams, each parsed by a worker ---

# Where a bz2 stream starts: "BZh", the block size, the first block's magic (48 bits).
_STREAM_START = re.compile(rb"BZh[1-9]1AY&SY")
CHUNK_BYTES = 1 << 20  # compressed bytes per chunk: about 10 streams of enwiki's 100 pages
_PROBE_BYTES = 8 << 20
_PROBE_STREAMS = 4


def multistream_header(path: str) -> bytes | None:
    """The XML before the first page (``<mediawiki>`` and ``<siteinfo>``) when ``path`` is a
    multistream dump whose streams hold whole pages, as Wikimedia writes them (checked on its
    first streams), so that chunks of streams can be read apart; None otherwise (one stream, or
    streams cut anywhere, as pbzip2 cuts them): the file is read as one stream."""
    if not path.endswith(".bz2"):
        return None
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


def iter_chunks(path: str, size: int = CHUNK_BYTES) -> Iterator[bytes]:
    """The compressed bytes of ``path`` in chunks of whole bz2 streams, about ``size`` each (a
    stream longer than that is one chunk); joined they are the file."""
    with user_path(path, "--input"):
        raw = fs.open(path, "rb")
    with raw:
        buffer = b""
        while block := raw.read(size):
            searched = max(1, len(buffer) - 9)  # a start may straddle the blocks
            buffer += block
            starts = [m.start() for m in _STREAM_START.finditer(buffer, searched)]
            if starts:  # up to the last stream that began: every stream before it is whole
                yield buffer[: starts[-1]]
                buffer = buffer[starts[-1] :]
        if buffer:
            yield buffer


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
