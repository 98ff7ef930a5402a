"""Sentence splitting: the rule-based default of `split_sentences` (the embedded corpus's prose)
and the library splitters `data prepare --splitter` offers."""

from __future__ import annotations

from importlib import metadata

import pytest

from bert_jax.data import sentences
from bert_jax.data.sentences import split_sentences
from bert_jax.runtime.errors import UserError


def test_split_sentences():
    text = (
        "The if statement is used for conditional execution. It selects exactly one suite, "
        "e.g. the first true one! Does Mr. Smith agree? Yes: see section 3.2. "
        'Version 2 came later. "Quoted sentences" count too.\nA new line is a new sentence'
    )
    assert split_sentences(text) == [
        "The if statement is used for conditional execution.",
        "It selects exactly one suite, e.g. the first true one!",
        "Does Mr. Smith agree?",
        "Yes: see section 3.2.",
        "Version 2 came later.",
        '"Quoted sentences" count too.',
        "A new line is a new sentence",
    ]
    assert split_sentences("  \n\n ") == []
    assert split_sentences("J. R. R. Tolkien wrote it. Then more.") == [
        "J. R. R. Tolkien wrote it.",
        "Then more.",
    ]


def test_every_splitter_keeps_paragraphs_and_the_hard_cases():
    text = (
        'Dr. J. R. Lowe moved to the U.S. in 1952. "Are you coming?" she asked. '
        "Results improved by 2.5 points (Smith et al. 2019). Wait... then what?\n"
        "A new paragraph   starts here. It ends here."
    )
    expected = [
        "Dr. J. R. Lowe moved to the U.S. in 1952.",
        '"Are you coming?" she asked.',
        "Results improved by 2.5 points (Smith et al. 2019).",
        "Wait... then what?",
        "A new paragraph starts here.",
        "It ends here.",
    ]
    for name in ("syntok", "pysbd", "regex"):
        assert sentences.splitter(name)(text) == expected, name
    assert sentences.splitter("blingfire")(text)[-2:] == expected[-2:]
    assert sentences.DEFAULT_SPLITTER in sentences.SPLITTERS
    assert split_sentences("One. Two.", "syntok") == ["One.", "Two."]


def test_an_unknown_splitter_is_a_user_error_naming_the_flag():
    with pytest.raises(UserError, match="--splitter 'punkt' is not one of syntok, "):
        sentences.splitter("punkt")
    assert sentences.splitter_identity("regex") == "regex"
    assert sentences.splitter_identity("syntok") == f"syntok {metadata.version('syntok')}"


# Prose where splitters have rewritten words: contractions (syntok's tokenizer makes "don't"
# "donot"), quotes, URLs and e-mail addresses, numbers, non-ASCII letters, invisible characters.
HARD_PROSE = [
    "I don't know. She can't go. It's the U.S. economy, isn't it? We won't; they wouldn't.",
    "Y'all'd've gone. 'Tis the season, ain't it? O'Neill's rock 'n' roll band shouldn't've.",
    'He said “don’t!” and left. ‘Fine,’ she said. "Why?" (Nobody knew.) [Citation needed.]',
    "See https://en.wikipedia.org/wiki/U.S._Route_66?a=1&b=2#History. Mail jane.doe@example.com!",
    "It cost $3.50, i.e. 3.5 dollars, on 1.2.2020 at 10:30 p.m. Pi is 3.14159... roughly 22/7.",
    "Café au lait, naïve façade — résumé… São Paulo’s Größe. 日本語の文。これは二番目。",
    "Ελληνικά κείμενα. Русский текст здесь. Zero\u200bwidth, soft\u00adhyphen, \ufeffBOM.",
    "Tabs\tand  double  spaces. A NUL\x00in text. The end",
]


def _visible(text: str) -> str:
    return "".join(text.split())


@pytest.mark.parametrize("name", sentences.SPLITTERS)
def test_every_splitter_keeps_every_word_of_real_prose(name):
    """The sentences of a paragraph, joined, are the paragraph up to whitespace: a splitter cuts,
    it never rewrites. Checked on the embedded corpus (Python's documentation) and the hard
    cases above."""
    from bert_jax.data.sources.embedded import embedded_documents

    split = sentences.splitter(name)
    documents = embedded_documents("all")[:: 10 if name == "pysbd" else 2]
    paragraphs = [" ".join(document) for document in documents] + HARD_PROSE
    for paragraph in paragraphs:
        assert _visible("".join(split(paragraph))) == _visible(paragraph), paragraph[:200]
    assert split(HARD_PROSE[0])[0] == "I don't know."


def test_syntok_keeps_contractions():
    text = "I don't know. She can't go. It's the U.S. economy, isn't it?"
    assert sentences.splitter("syntok")(text) == [
        "I don't know.",
        "She can't go.",
        "It's the U.S. economy, isn't it?",
    ]


def test_a_splitter_that_changes_words_stops_the_run_naming_it_and_the_text(monkeypatch):
    """What syntok's ``process`` did: rebuild the sentences from normalised tokens."""

    def rewrites(paragraph):
        return [paragraph.replace("n't", "not")]

    def drops(paragraph):
        return [paragraph[: len(paragraph) // 2]]

    for fault in (rewrites, drops):
        monkeypatch.setitem(sentences._PARAGRAPH_SPLITTERS, "regex", fault)
        sentences.splitter.cache_clear()
        try:
            with pytest.raises(sentences.SplitterChangedTextError) as caught:
                sentences.splitter("regex")("Fine words. I don't know why it stops here.")
        finally:
            sentences.splitter.cache_clear()
        message = str(caught.value)
        assert "--splitter regex changed the text" in message and "\n" not in message
        assert "know why" in message and "choose another --splitter" in message


def test_splitters_may_respace_but_the_sentences_are_the_texts():
    """A library that respaces or drops invisible characters still yields the text's own
    sentences (cut where it cut), never its version of them."""
    cut = sentences._cut_like
    assert cut("x", "One.Two three. Four", ["One.", "Two  three.", "Four"]) == [
        "One.",
        "Two three.",
        "Four",
    ]
    assert cut("x", "Zero\u200bwidth. Next.", ["Zero width.", "Next."]) == [
        "Zero\u200bwidth.",
        "Next.",
    ]
    assert cut("x", "A. B.\x07", ["A.", "B."]) == ["A.", "B.\x07"]


def _gold_sets() -> dict[str, list[list[str]]]:
    """The benchmark's gold sets (benchmarks/sentence_split_eval.py), read from the repository."""
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "sentence_split_eval.py")
    spec = importlib.util.spec_from_file_location("sentence_split_eval", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {name: module.read_gold(file) for name, file in module.GOLD_SETS.items()}


def test_the_gold_sets_are_whole_and_no_splitter_changes_their_words():
    """The public sets come with the repository (no download); their provenance header is not
    read as a paragraph; every splitter keeps their words too."""
    gold = _gold_sets()
    assert {name: len(paragraphs) for name, paragraphs in gold.items()} == {
        "own": 121,
        "golden rules": 48,
        "syntok OSPL": 1,
    }
    assert gold["golden rules"][0] == ["Hello World.", "My name is Jonas."]
    for name in sentences.SPLITTERS:
        split = sentences.splitter(name)
        for paragraphs in gold.values():
            for paragraph in paragraphs:
                text = " ".join(paragraph)
                assert _visible("".join(split(text))) == _visible(text), (name, text[:100])
