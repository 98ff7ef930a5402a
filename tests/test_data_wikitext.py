"""Wikitext -> running text (``wikitext.wikitext_to_paragraphs``): no markup left, no prose lost,
on the markup patterns of real articles."""

from __future__ import annotations

import pytest

from bert_jax.data.sources import wikipedia_dump as wikipedia
from bert_jax.data.sources import wikitext
from bert_jax.data.sources.documents import read_documents
from tests.corpus_fixtures import realistic_articles, realistic_dump_xml

strip = wikitext.wikitext_to_paragraphs


def test_unbalanced_bold_and_italics_in_table_cells_keep_the_prose_and_leave_no_markup():
    # The examples: an italics left open in a table cell swallowed the table's end and the
    # prose after it; a bold one took a whole paragraph out.
    text = "{|\n| 1\n|}\n\nThe economy is large.\n\n{|\n| 29% ''62\n|}\nAlaska has ''boroughs''."
    assert strip(text) == ["The economy is large.", "Alaska has boroughs."]
    bold = text.replace("| 1", "| '''1")
    assert strip(bold) == ["The economy is large.", "Alaska has boroughs."]
    # As MediaWiki does, an unbalanced mark ends at the end of its line and takes no words.
    assert strip("The ''Exxon Valdez spill.\nIt was '''large.\n\nNext.") == [
        "The Exxon Valdez spill. It was large.",
        "Next.",
    ]


def test_bold_and_italics_runs_resolve_as_mediawiki_does():
    assert strip("'''''Both''''' and '''bold''' and ''italic''.") == ["Both and bold and italic."]
    # Four marks: an apostrophe, then bold. An odd count of both on a line: the bold after a
    # word is an apostrophe, then italics (the possessive of an italic title).
    assert strip("The '''[[Vienna Philharmonic]]''''s concert.") == [
        "The Vienna Philharmonic's concert."
    ]
    assert strip("''[[The Wall Street Journal]]'''s report.") == [
        "The Wall Street Journal's report."
    ]
    assert strip("l'''amour'' est") == ["l'amour est"]
    # Marks on either side of a dropped template do not join into a longer run.
    assert strip("A film (''{{lang|de|Angst}}'') won.") == ["A film won."]


def test_entities_are_decoded_everywhere_and_nbsp_is_a_space():
    text = (
        "It ran [[OS&nbsp;X]] and [[macOS|Mac&nbsp;OS&nbsp;X]] on [[AT&amp;T]]'s network; "
        "[https://example.org R&amp;D pages] cost 7&nbsp;&euro; &ndash; or 8&#160;&#x20AC;."
    )
    assert strip(text) == [
        "It ran OS X and Mac OS X on AT&T's network; R&D pages cost 7 \u20ac \u2013 or 8 \u20ac."
    ]


def test_nowiki_keeps_its_content_as_literal_text():
    assert strip("Write <nowiki>[[x]] &amp; {{y}} ''z''</nowiki> here; [[Link]]<nowiki/>s.") == [
        "Write [[x]] & {{y}} ''z'' here; Links."
    ]


@pytest.mark.parametrize(
    "markup",
    [
        # references: with templates inside, named and self-closing (quoted or not), grouped,
        # over several lines, list-defined
        "A<ref>{{cite web|title=T {{!}} ''x|url=u}}</ref> B<ref name=x/> C<ref name='y z' />.",
        "A<ref group=note>{{efn|a {{b|[[c]]}}}}</ref>\n<ref name=q>{{cite\n |a=1\n}}</ref> B C.",
        "A B C.{{Reflist|refs=\n<ref name=r>{{cite book|t=x}}</ref>\n}}<references />",
        # nested templates and parser functions
        "{{Infobox x|a={{convert|1|km}}|b={{ubl|[[L]]|{{nowrap|''q''}}}}|c={{#expr:1+2}}}}\nA B C.",
        # definition lists, lists, headings, magic words, comments, categories, files
        "; Term\n: Definition.\n;Term: inline\n* item\n# item\n== H<ref>r</ref> ==\nA B C.",
        "__NOTOC__{{DEFAULTSORT:X}}<!-- a\ncomment -->A B C.\n[[Category:X| ]]\n[[de:X]]",
        "[[File:A.jpg|thumb|alt=a|A caption with [[a link]] and <ref>r</ref>]]\nA B C.",
        # galleries, math, other tags that hold no prose
        "<gallery mode=packed>\nFile:A.jpg|''Cap'' [[x]]\n</gallery>\nA B C.<math>x^2</math>",
        ':<math display="block">a^2</math>\n<score>\\relative c</score>A B C.',
        # tables: cell styles and attributes, quotes, captions, nested tables, templates in cells
        '{| class="wikitable" style="a:b"\n|+ Cap<ref>r</ref>\n|-\n! scope="col" | H !! H2\n'
        '|- style="x"\n| style="text-align:right" | \'\'1 || "q" || {{Yes}}\n|-\n| a ||\n'
        "{|\n| ''n || '''m\n|}\n|}\nA B C.",
        # an unclosed table ends at its last row; the paragraph after it stays
        "{| class=wikitable\n|-\n| a || ''b\n| c\n\nA B C.",
        # HTML tables
        "<table><tr><td>1</td></tr></table>A B C.",
    ],
)
def test_markup_leaves_nothing_behind(markup):
    paragraphs = strip(markup)
    assert paragraphs and paragraphs[-1].endswith("A B C."), paragraphs
    text = "\n".join(paragraphs)
    assert wikitext.markup_leftovers(text) == [], text


def test_block_tags_are_paragraphs():
    assert strip(
        "It is true:\n<blockquote>Given ''a'', b.</blockquote>\nAfter <div>x</div> end."
    ) == [
        "It is true:",
        "Given a, b.",
        "After",
        "x",
        "end.",
    ]
    # A block inside a list item is part of the list: dropped with it.
    assert strip(
        "* Item <div>in a div</div> more\n; Term <blockquote>q</blockquote> : d\nA B C."
    ) == ["A B C."]


def test_the_leftover_detector_finds_every_kind_of_markup():
    for leftover in (
        "{|",
        "|}",
        "|-",
        "{{x",
        "}}",
        "[[x",
        "]]",
        "<ref>",
        "</ref>",
        "<ref name=a/>",
        "''",
        "&nbsp;",
        "&amp;",
        "&#160;",
        "== H ==",
        "<math>",
        "<br />",
        "<!--",
        "__NOTOC__",
        "[https://x.org y]",
        'style="a"',
        "Category:X",
        "File:X.jpg",
    ):
        assert wikitext.markup_leftovers(f"Some text {leftover} more."), leftover
    assert wikitext.markup_leftovers("It's 5 < 6 & 7 > 3; the U.S. economy (2020): 4% - 3.") == []


def test_real_format_articles_keep_every_paragraph_word_for_word_and_no_markup():
    for title, markup, expected in realistic_articles():
        paragraphs = wikitext.wikitext_to_paragraphs(markup)
        assert wikitext.markup_leftovers("\n".join(paragraphs)) == [], title
        assert paragraphs == expected, title


@pytest.mark.parametrize("siteinfo", [True, False])
def test_a_real_format_dump_with_or_without_siteinfo(tmp_path, siteinfo):
    dump = tmp_path / "enwiki-20240501-pages-articles.xml"
    dump.write_text(realistic_dump_xml(siteinfo=siteinfo), encoding="utf-8")
    articles = realistic_articles()
    read = list(wikipedia.iter_articles(str(dump)))
    assert [title for title, _ in read] == [title for title, _, _ in articles]
    assert [text.split("\n") for _, text in read] == [expected for _, _, expected in articles]
    documents, stats = read_documents([dump], splitter_name="regex")
    assert len(documents) == len(articles) and stats.skipped_pages == 2 * len(articles)
