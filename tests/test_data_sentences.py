"""Rule-based sentence splitting (JSONL and TFDS text, the embedded corpus's prose)."""

from __future__ import annotations

from bert_jax.data.sentences import split_sentences


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
