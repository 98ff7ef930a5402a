"""Sentence splitting: prose (a JSONL or TFDS text field, a docstring) into sentences.

``split_sentences(text) -> list[str]`` is rule-based and dependency-free: a boundary is ``.``,
``!`` or ``?`` (plus closing quotes/brackets) and whitespace before an upper-case letter, digit or
opening quote, unless the word before the period is a common abbreviation or an initial.
"""

from __future__ import annotations

import re

# Words that end in a period without ending a sentence (compared lower-case, without the period).
_ABBREVIATIONS = frozenset(
    "e.g i.e etc vs cf al mr mrs ms dr prof st jr sr fig eq sec ch vol approx resp "
    "incl esp viz ca jan feb mar apr jun jul aug sep sept oct nov dec".split()
)
_BOUNDARY = re.compile(r"[.!?]+[\"'”’)\]]*\s+")
_OPENS_SENTENCE = re.compile(r"[\"'“‘(\[]?[A-Z0-9]")


def split_sentences(text: str) -> list[str]:
    """Split prose into sentences; newlines always end a sentence (they separate paragraphs).

    Rule-based: a boundary is ``.``, ``!`` or ``?`` (plus closing quotes/brackets) and whitespace
    before an upper-case letter, digit or opening quote, unless the word before the period is a
    common abbreviation or a single letter (an initial).
    """
    sentences: list[str] = []
    for paragraph in text.splitlines():
        paragraph = " ".join(paragraph.split())
        if not paragraph:
            continue
        start = 0
        for match in _BOUNDARY.finditer(paragraph):
            end = match.end()
            if not _OPENS_SENTENCE.match(paragraph, end):
                continue
            head = paragraph[start : match.start()]
            last_word = head.rsplit(" ", 1)[-1].lstrip("(\"'[").lower()
            if paragraph[match.start()] == "." and (
                last_word in _ABBREVIATIONS or (len(last_word) == 1 and last_word.isalpha())
            ):
                continue
            sentence = paragraph[start:end].strip()
            if sentence:
                sentences.append(sentence)
            start = end
        tail = paragraph[start:].strip()
        if tail:
            sentences.append(tail)
    return sentences
