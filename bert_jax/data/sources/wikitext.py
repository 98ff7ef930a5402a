"""Wikitext -> running text: what the paper keeps of an article ("text passages only; lists,
tables and headers ignored").

Public API: ``parse(wikitext)`` (mwparserfromhell), ``wikitext_to_paragraphs(wikicode)`` (one
paragraph per item), ``is_disambiguation(title, wikicode)``, and ``markup_leftovers(text)``: the
markup that stripped text must never hold (the tests and
``benchmarks/wikipedia_extractors_bench.py`` count it). What is dropped and what is kept is
described in ``wikipedia``'s docstring, which reads dumps and calls this module per article.
"""

from __future__ import annotations

import html
import re

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
