"""Sentence splitting: prose (a JSONL, Parquet, TFDS or Wikipedia text) into sentences.

Public API:

- ``SPLITTERS``: the choices of ``data prepare --splitter``; ``DEFAULT_SPLITTER`` is the one that
  scored best on ``benchmarks/data/sentence_gold.txt`` (``benchmarks/sentence_split_eval.py``;
  README's "Sentence splitting" has the table).
- ``splitter(name) -> Callable[[str], list[str]]``: the named splitter (an unknown name is a
  ``UserError`` naming ``--splitter``); ``splitter_identity(name)`` is the name and the library's
  version, which ``data prepare`` records so that prepared data says how it was split.
- ``split_sentences(text, splitter="regex")``: one call. Its default stays today's rule-based
  splitter, which needs no package and which the embedded corpus is cut with.

Whatever the splitter, a newline always ends a sentence (lines are paragraphs), whitespace inside
a paragraph is collapsed to single spaces, and empty sentences are dropped. Every splitter is a
pure function of its input (no model download, no randomness), so prepared data is reproducible.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from collections.abc import Callable
from importlib import metadata

from bert_jax.runtime.errors import UserError

# Candidates compared in benchmarks/sentence_split_eval.py; the package each needs (None: none).
_PACKAGES = {"syntok": "syntok", "blingfire": "blingfire", "pysbd": "pysbd", "regex": None}
SPLITTERS = tuple(_PACKAGES)
DEFAULT_SPLITTER = "syntok"

# Words that end in a period without ending a sentence (compared lower-case, without the period).
_ABBREVIATIONS = frozenset(
    "e.g i.e etc vs cf al mr mrs ms dr prof st jr sr fig eq sec ch vol approx resp "
    "incl esp viz ca jan feb mar apr jun jul aug sep sept oct nov dec".split()
)
_BOUNDARY = re.compile(r"[.!?]+[\"'”’)\]]*\s+")
_OPENS_SENTENCE = re.compile(r"[\"'“‘(\[]?[A-Z0-9]")


def _paragraphs(text: str) -> list[str]:
    """Non-empty lines of ``text`` with their whitespace collapsed."""
    return [p for p in (" ".join(line.split()) for line in text.splitlines()) if p]


def _regex_paragraph(paragraph: str) -> list[str]:
    """A boundary is ``.``, ``!`` or ``?`` (plus closing quotes/brackets) and whitespace before an
    upper-case letter, digit or opening quote, unless the word before the period is a common
    abbreviation or a single letter (an initial)."""
    sentences: list[str] = []
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
        sentences.append(paragraph[start:end])
        start = end
    sentences.append(paragraph[start:])
    return sentences


def _syntok_paragraph(paragraph: str) -> list[str]:
    from syntok import segmenter

    return [
        "".join(token.spacing + token.value for token in sentence)
        for block in segmenter.process(paragraph)
        for sentence in block
    ]


def _blingfire_paragraph(paragraph: str) -> list[str]:
    import blingfire

    return blingfire.text_to_sentences(paragraph).split("\n")


@functools.cache
def _pysbd_segmenter():
    import pysbd

    return pysbd.Segmenter(language="en", clean=False)


def _pysbd_paragraph(paragraph: str) -> list[str]:
    return _pysbd_segmenter().segment(paragraph)


_PARAGRAPH_SPLITTERS: dict[str, Callable[[str], list[str]]] = {
    "syntok": _syntok_paragraph,
    "blingfire": _blingfire_paragraph,
    "pysbd": _pysbd_paragraph,
    "regex": _regex_paragraph,
}


def _check(name: str) -> None:
    if name not in _PACKAGES:
        raise UserError(f"--splitter {name!r} is not one of {', '.join(SPLITTERS)}")
    package = _PACKAGES[name]
    if package is not None and importlib.util.find_spec(package) is None:
        raise UserError(
            f"--splitter {name} needs the package {package}: pip install 'bert-jax[splitters]'"
        )


@functools.cache
def splitter(name: str = DEFAULT_SPLITTER) -> Callable[[str], list[str]]:
    """The splitter called ``name``: text -> sentences (paragraph = line; module docstring)."""
    _check(name)
    split_paragraph = _PARAGRAPH_SPLITTERS[name]

    def split(text: str) -> list[str]:
        sentences: list[str] = []
        for paragraph in _paragraphs(text):
            sentences.extend(s for s in (s.strip() for s in split_paragraph(paragraph)) if s)
        return sentences

    split.__name__ = f"split_{name}"
    return split


def splitter_identity(name: str) -> str:
    """``name`` and its library's version (``"syntok 1.4.4"``, or ``"regex"``): what prepared
    data records, since another version of a library may cut the same text differently."""
    _check(name)
    package = _PACKAGES[name]
    return name if package is None else f"{name} {metadata.version(package)}"


def split_sentences(text: str, splitter_name: str = "regex") -> list[str]:
    """Split prose into sentences with the named splitter (default: the rule-based one)."""
    return splitter(splitter_name)(text)
