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
