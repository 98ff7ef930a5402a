"""Sentence splitting: prose (a JSONL, Parquet, TFDS or Wikipedia text) into sentences.

Public API:

- ``SPLITTERS``: the choices of ``data prepare --splitter``; ``DEFAULT_SPLITTER`` was chosen on
  the gold sets of ``benchmarks/sentence_split_eval.py`` (our sample and two public ones;
  docs/reproduce.md, "Sentence splitting", has the table and the reasons).
- ``splitter(name) -> Callable[[str], list[str]]``: the named splitter (an unknown name is a
  ``UserError`` naming ``--splitter``); ``splitter_identity(name)`` is the name and the library's
  version, which ``data prepare`` records so that prepared data says how it was split.
- ``split_sentences(text, splitter="regex")``: one call. Its default stays today's rule-based
  splitter, which needs no package and which the embedded corpus is cut with.

Whatever the splitter, a newline always ends a sentence (lines are paragraphs), whitespace inside
a paragraph is collapsed to single spaces, and empty sentences are dropped. Every splitter is a
pure function of its input (no model download, no randomness), so prepared data is reproducible.

A splitter only cuts: the sentences of a paragraph, joined, are the paragraph up to whitespace.
The sentences are always pieces of the text itself, cut where the library cut (syntok at its
tokens' offsets: its tokens are normalised, "don't" -> "do" "not"), and every paragraph is
checked (``_cut_like``, about 75 ns a word): a library that changed, added or dropped a word
raises ``SplitterChangedTextError`` (a ``UserError`` naming the splitter and the text), so no
rewritten word reaches prepared data. Whitespace and invisible characters (control and format
characters: zero-width space, soft hyphen) a library drops or respaces are kept from the text.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import unicodedata
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
    # Cut the paragraph where syntok's sentences start: its tokens' values are normalised
    # (``process`` turns "don't" into "do" + "not"), their offsets are the text's.
    from syntok import segmenter

    starts = [
        sentence[0].offset
        for block in segmenter.analyze(paragraph)
        for sentence in block
        if sentence
    ]
    bounds = [0, *starts[1:], len(paragraph)]
    return [paragraph[begin:end] for begin, end in zip(bounds, bounds[1:])]


def _blingfire_paragraph(paragraph: str) -> list[str]:
    import blingfire

    # A NUL would end the text for the C library (the rest lost); the paragraph is cut below.
    return blingfire.text_to_sentences(paragraph.replace("\x00", " ")).split("\n")


@functools.cache
def _pysbd_segmenter():
    import pysbd

    return pysbd.Segmenter(language="en", clean=False)


def _pysbd_paragraph(paragraph: str) -> list[str]:
    return _pysbd_segmenter().segment(paragraph)


class SplitterChangedTextError(UserError):
    """A splitter whose sentences, joined, are not the paragraph it was given (up to whitespace):
    it changed, added or dropped words. Prepared data must never hold them."""


def _no_space(text: str) -> str:
    return "".join(text.split())


def _near(text: str, nonspace_index: int, before: int = 40, after: int = 30) -> str:
    """The part of `text` around its `nonspace_index`-th non-space character."""
    count = 0
    for position, char in enumerate(text):
        if not char.isspace():
            if count == nonspace_index:
                return text[max(0, position - before) : position + after]
            count += 1
    return text[-before:]


def _changed_text(name: str, paragraph: str, pieces: list[str]) -> SplitterChangedTextError:
    given, got = _no_space(paragraph), _no_space("".join(pieces))
    first = next(
        (i for i, (a, b) in enumerate(zip(given, got)) if a != b), min(len(given), len(got))
    )
    came_out = " ".join(p.strip() for p in pieces)
    return SplitterChangedTextError(
        f"--splitter {splitter_identity(name)} changed the text it split ({len(given)} "
        f"characters in, {len(got)} out, the first difference at character {first}): "
        f"{_near(paragraph, first)!r} came out as {_near(came_out, first)!r}; a splitter may "
        "only cut a paragraph: choose another --splitter (regex needs no library)"
    )


def _invisible(char: str) -> bool:
    """Whitespace, control and format characters (zero-width space, soft hyphen, BOM): what a
    splitter may turn into a space or drop without changing a word. The sentences keep them."""
    return char.isspace() or unicodedata.category(char) in ("Cc", "Cf")


def _cut_like(name: str, paragraph: str, pieces: list[str]) -> list[str]:
    """`paragraph` cut where the splitter's `pieces` end: the sentences as they are in the text,
    whatever the splitter did to them; SplitterChangedTextError if the pieces, joined, are not
    the paragraph up to whitespace (and invisible characters: ``_invisible``). `paragraph` has
    single spaces (``_paragraphs``)."""
    sentences: list[str] = []
    position, length = 0, len(paragraph)
    for piece in pieces:
        piece = " ".join(piece.split())
        if not piece:
            continue
        if paragraph.startswith(" ", position):
            position += 1
        if paragraph.startswith(piece, position):  # the usual case: the text, cut at a space
            sentences.append(piece)
            position += len(piece)
            continue
        start = position  # respaced or changed: compare the visible characters one by one
        for char in piece:
            if _invisible(char):
                continue
            while position < length and _invisible(paragraph[position]):
                position += 1
            if position == length or paragraph[position] != char:
                raise _changed_text(name, paragraph, pieces)
            position += 1
        sentence = paragraph[start:position].strip()
        if sentence:
            sentences.append(sentence)
    if not all(map(_invisible, paragraph[position:])):  # text left over: the splitter dropped it
        raise _changed_text(name, paragraph, pieces)
    if position < length and sentences:  # invisible characters after the last cut stay
        sentences[-1] = (sentences[-1] + paragraph[position:]).strip()
    return sentences


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
            f"--splitter {name} needs the package {package}: pip install -e '.[splitters]' in "
            "a bert-jax checkout"
        )


@functools.cache
def splitter(name: str = DEFAULT_SPLITTER) -> Callable[[str], list[str]]:
    """The splitter called ``name``: text -> sentences (paragraph = line; module docstring)."""
    _check(name)
    split_paragraph = _PARAGRAPH_SPLITTERS[name]

    def split(text: str) -> list[str]:
        sentences: list[str] = []
        for paragraph in _paragraphs(text):
            sentences.extend(_cut_like(name, paragraph, split_paragraph(paragraph)))
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
