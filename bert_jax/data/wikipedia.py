"""Wikipedia XML dumps (``*.xml.bz2``, ``*.xml-p1p41242.bz2``, ``*.xml``) -> a document per article.

Public API:

- ``is_wikipedia_dump(path)``: by name (``.xml``, ``.bz2``), the sources ``sources`` hands here.
- ``iter_articles(path) -> Iterator[(title, text)]``: the articles of a dump, streamed; ``text``
  holds one paragraph per line. It is ``iter_candidates`` (reading: bz2, XML, namespace and
  redirect; cheap) then ``article_text`` (parsing the wikitext: the costly part, which
  ``sources`` runs in worker processes).
- ``wikitext_to_paragraphs(wikitext) -> list[str]``: the stripping alone.

Pages are streamed with ``mwxml`` (one page in memory at a time; ``.bz2`` decompressed on the
fly, multistream dumps included, local or ``gs://`` through ``bert_jax.fs``) and kept when they are
articles: namespace 0, not a redirect, not a disambiguation page (a disambiguation template such
as ``{{disambiguation}}``, ``{{dab}}``, ``{{hndis}}``, or a title ending in "(disambiguation)").
Their wikitext is parsed with ``mwparserfromhell`` and only running text stays, as the paper
asks ("text passages only; lists, tables and headers ignored"): templates (infoboxes, citations,
navigation boxes), references, tables, lists (``*``, ``#``, ``;``, ``:`` lines), headings,
comments, file/image/category/interlanguage links, and tags that hold no prose (``<math>``,
``<gallery>``, ...) are dropped; a link keeps its text, bold and italics their words, an HTML
entity its character. Paragraphs stay paragraphs: wikitext's blank lines separate them, the
lines inside one are joined, and a sentence never runs across two.

A dump that is not valid bz2 or not valid XML is a ``UserError`` naming the file.
"""

from __future__ import annotations

import bz2
import re
from collections.abc import Iterator

from bert_jax import fs
from bert_jax.errors import UserError, user_path

# Tags whose content is not running text.
_DROPPED_TAGS = frozenset(
    "ref references gallery math chem ce score timeline graph mapframe maplink syntaxhighlight "
    "source pre code templatedata templatestyles imagemap inputbox hiero categorytree "
    "table tr td th caption ul ol dl li dt dd noinclude includeonly onlyinclude".split()
)
# Wiki markup that starts a list line (`*`, `#`, `;`, `:`): the whole line is dropped.
_LIST_MARKUP = frozenset("*#;:")
_LINE_BREAK_TAGS = frozenset(("br", "hr"))
_DROPPED_LINK_NAMESPACES = frozenset(("file", "image", "media", "category"))
# An interlanguage link `[[de:Titel]]` (shown in the sidebar, not the text): a lower-case
# language code, where an article's title is capitalised (`[[Ali: Fear Eats the Soul]]`).
_INTERLANGUAGE = re.compile(r"^[a-z]{2,3}(-[a-z]+)*:")
# Besides these, any template whose name ends in " disambiguation" ({{school disambiguation}}).
_DISAMBIGUATION_TEMPLATES = frozenset(
    ("disambiguation", "disambig", "dab", "disamb", "dis", "hndis", "geodis", "numberdis")
)
_BEHAVIOUR_SWITCH = re.compile(r"__[A-Z]+__")
_EMPTY_BRACKETS = re.compile(r"\(\s*[,;:]?\s*\)")
_SPACE_BEFORE_PUNCTUATION = re.compile(r"\s+([,.;:!?])")
# Marks a list line while the text is assembled; such lines are removed afterwards.
_LIST_LINE = "\x00"


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


def _append_text(nodes, out: list[str]) -> None:
    """The running text of ``nodes`` (a Wikicode's), appended to ``out`` piece by piece."""
    import mwparserfromhell.nodes as n

    for node in nodes:
        if isinstance(node, n.Text):
            out.append(node.value)
        elif isinstance(node, n.Wikilink):
            if _link_is_dropped(str(node.title)):
                continue
            if node.text is not None:
                _append_text(node.text.nodes, out)
            else:
                out.append(str(node.title).lstrip(":").split("#")[0])
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
            elif tag not in _DROPPED_TAGS and node.contents is not None:
                _append_text(node.contents.nodes, out)
        # Templates, headings, comments, arguments: nothing of them is running text.


def wikitext_to_paragraphs(wikicode) -> list[str]:
    """Paragraphs of running text (``wikicode``: a string or a parsed ``Wikicode``)."""
    import mwparserfromhell

    if isinstance(wikicode, str):
        wikicode = mwparserfromhell.parse(wikicode)
    pieces: list[str] = []
    _append_text(wikicode.nodes, pieces)
    paragraphs: list[str] = []
    current: list[str] = []
    for line in "".join(pieces).split("\n"):
        if line.lstrip().startswith(_LIST_LINE):
            line = ""  # a list item ends the paragraph before it, as in the rendered page
        line = _BEHAVIOUR_SWITCH.sub("", line).strip()
        if line:
            current.append(line)
        elif current:
            paragraphs.append(" ".join(current))
            current = []
    if current:
        paragraphs.append(" ".join(current))
    cleaned = []
    for paragraph in paragraphs:
        paragraph = " ".join(_EMPTY_BRACKETS.sub("", paragraph).split())
        paragraph = _SPACE_BEFORE_PUNCTUATION.sub(r"\1", paragraph)
        if any(c.isalpha() for c in paragraph):
            cleaned.append(paragraph)
    return cleaned


class Counts:
    """What a dump held besides articles (``sources.CorpusStats`` takes them)."""

    def __init__(self) -> None:
        self.pages = 0
        self.skipped_pages = 0


def _pages(path: str) -> Iterator[tuple[int, bool, str, str | None]]:
    """(namespace, is a redirect, title, latest text) of each page; a damaged file (bz2 or
    XML) is a UserError naming it."""
    import mwxml
    from mwxml.errors import MalformedXML

    with user_path(path, "--input"):
        raw = fs.open(path, "rb")
    # BZ2File reads concatenated streams too (the "multistream" dumps).
    stream = bz2.BZ2File(raw) if path.endswith(".bz2") else raw
    try:
        dump = mwxml.Dump.from_file(stream)
        for page in dump:
            text = None
            for revision in page:  # a pages-articles dump holds the latest revision only
                text = revision.text
            yield page.namespace, bool(page.redirect), page.title, text
    except (OSError, EOFError, SyntaxError, MalformedXML) as err:
        # bz2: "Invalid data stream" (OSError) or a stream cut short (EOFError); XML:
        # ElementTree's ParseError (a SyntaxError) or mwxml's MalformedXML.
        reason = " ".join("".join(c if c.isprintable() else " " for c in str(err)).split())
        raise UserError(f"--input {path}: not a readable Wikipedia XML dump ({reason})") from err
    finally:
        stream.close()
        raw.close()


def iter_candidates(path: str, counts: Counts | None = None) -> Iterator[tuple[str, str]]:
    """(title, wikitext) of the pages of ``path`` that may be articles: namespace 0, not a
    redirect, not empty (cheap: no wikitext is parsed). ``article_text`` finishes the job."""
    counts = Counts() if counts is None else counts
    for namespace, redirect, title, text in _pages(path):
        counts.pages += 1
        if namespace != 0 or redirect or not text or text.lstrip()[:9].upper() == "#REDIRECT":
            counts.skipped_pages += 1
            continue
        yield title, text


def article_text(title: str, wikitext: str) -> str | None:
    """The running text of an article, one paragraph per line; None for a disambiguation page."""
    import mwparserfromhell

    wikicode = mwparserfromhell.parse(wikitext)
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
