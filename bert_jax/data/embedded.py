"""The embedded corpus: real English prose that ships with Python itself, for runs without data.

Public API: ``embedded_documents(split="train") -> list[Document]`` and
``embedded_document_names(split)``. The documents are the language reference in
``pydoc_data.topics`` and the standard library's docstrings, read with ``ast`` so nothing is
imported or executed. Deterministic order for a given Python installation; ``split`` is "train",
"eval" (about 5% of documents, chosen by a hash of the document's name, so the split is stable)
or "all".
"""

from __future__ import annotations

import ast
import functools
import os
import re
import sysconfig
import zlib

from bert_jax.data.sentences import split_sentences

Document = list[str]

# One document in twenty is held out for evaluation.
_EVAL_MODULUS = 20

_UNDERLINE = re.compile(r"^([*=\-~^#])\1{2,}$")
# Parts of the standard library that are tests, tools or GUI code rather than documented API.
_SKIPPED_STDLIB_DIRS = frozenset(
    {
        "test",
        "tests",
        "idlelib",
        "lib2to3",
        "turtledemo",
        "tkinter",
        "ensurepip",
        "site-packages",
        "dist-packages",
        "__pycache__",
        "pydoc_data",
        # Generated codec tables: one boilerplate docstring each, repeated a hundred times.
        "encodings",
    }
)


def _prose_sentences(text: str) -> list[str]:
    """Sentences from the prose paragraphs of reST-like text (pydoc topics, docstrings).

    Drops headings, indented blocks (code, grammar, argument tables) and doctest lines, so what
    remains is running English text.
    """
    lines = text.expandtabs().splitlines()
    paragraphs: list[str] = []
    current: list[str] = []

    def flush() -> None:
        if current:
            paragraphs.append(" ".join(current))
            current.clear()

    for index, line in enumerate(lines):
        stripped = line.strip()
        next_line = lines[index + 1].strip() if index + 1 < len(lines) else ""
        if (
            not stripped
            or line[0].isspace()
            or _UNDERLINE.match(stripped)
            or _UNDERLINE.match(next_line)
            or stripped.startswith((">>>", "..."))
        ):
            flush()
            continue
        current.append(stripped)
    flush()
    sentences: list[str] = []
    for paragraph in paragraphs:
        letters = sum(c.isalpha() for c in paragraph)
        if len(paragraph.split()) < 3 or letters < 0.6 * len(paragraph):
            continue
        sentences.extend(s for s in split_sentences(paragraph) if any(c.isalpha() for c in s))
    return sentences


def _stdlib_docstrings(path: str) -> str:
    with open(path, "rb") as f:
        source = f.read()
    try:
        tree = ast.parse(source, filename=path)
    except (SyntaxError, ValueError):
        return ""
    parts = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc:
                parts.append(doc)
    return "\n\n".join(parts)


@functools.lru_cache(maxsize=1)
def _embedded_corpus() -> tuple[tuple[str, tuple[str, ...]], ...]:
    documents: list[tuple[str, tuple[str, ...]]] = []
    try:
        from pydoc_data.topics import topics
    except ImportError:  # some distributions strip pydoc_data; the docstrings still suffice
        topics = {}
    for name in sorted(topics):
        sentences = _prose_sentences(topics[name])
        if sentences:
            documents.append((f"pydoc:{name}", tuple(sentences)))
    stdlib = sysconfig.get_paths()["stdlib"]
    for root, dirs, files in os.walk(stdlib):
        dirs[:] = sorted(d for d in dirs if d not in _SKIPPED_STDLIB_DIRS)
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(root, name)
            sentences = _prose_sentences(_stdlib_docstrings(path))
            if sentences:
                documents.append((f"stdlib:{os.path.relpath(path, stdlib)}", tuple(sentences)))
    if len(documents) < 2:
        raise RuntimeError(
            f"the embedded corpus found only {len(documents)} documents in {stdlib}; this Python "
            "installation ships without its standard-library sources"
        )
    return tuple(documents)


def _is_eval_document(name: str) -> bool:
    return zlib.crc32(name.encode("utf-8")) % _EVAL_MODULUS == 0


def embedded_documents(split: str = "train") -> list[Document]:
    """The embedded English corpus; ``split`` is "train", "eval" or "all" (see module docstring)."""
    if split not in ("train", "eval", "all"):
        raise ValueError(f"embedded corpus split must be train, eval or all, not {split!r}")
    return [
        list(sentences)
        for name, sentences in _embedded_corpus()
        if split == "all" or (split == "eval") == _is_eval_document(name)
    ]


def embedded_document_names(split: str = "train") -> list[str]:
    """Names (``pydoc:TOPIC`` / ``stdlib:PATH``) of ``embedded_documents(split)``, same order."""
    if split not in ("train", "eval", "all"):
        raise ValueError(f"embedded corpus split must be train, eval or all, not {split!r}")
    return [
        name
        for name, _ in _embedded_corpus()
        if split == "all" or (split == "eval") == _is_eval_document(name)
    ]
