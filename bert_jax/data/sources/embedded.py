"""The embedded corpus: real English prose that ships with Python itself, for runs without data.

Public API: ``embedded_documents(split="train") -> list[Document]`` and
``embedded_document_names(split)``. The documents are the language reference in
``pydoc_data.topics`` and the standard library's docstrings, read with ``ast`` so nothing is
imported or executed. Deterministic order for a given Python installation; ``split`` is "train",
"eval" (about 5% of documents, chosen by a hash of the document's name, so the split is stable)
or "all".

Reading it means parsing some 440 standard-library files (about 11 s on a 2-core machine), so the
result is kept in a cache file under bert-jax's cache root (``runtime.caches.cache_root``:
``$BERT_JAX_CACHE_DIR``, else ``$XDG_CACHE_HOME/bert_jax``, else ``~/.cache/bert_jax``) named by
a digest of what it is built from: this Python, the standard library's files (path, size,
modification time) and the code that extracts the prose. Anything else (no cache, an unwritable
or damaged one) builds it afresh.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import re
import sys
import sysconfig
import zlib

from bert_jax.data import sentences as sentences_module
from bert_jax.data.sentences import split_sentences
from bert_jax.runtime import caches
from bert_jax.runtime.errors import UserError
from bert_jax.runtime.outputs import write_bytes_atomic

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


def _stdlib_files(stdlib: str) -> list[str]:
    """The standard-library sources the corpus reads, in a fixed order."""
    paths = []
    for root, dirs, files in os.walk(stdlib):
        dirs[:] = sorted(d for d in dirs if d not in _SKIPPED_STDLIB_DIRS)
        paths.extend(os.path.join(root, name) for name in sorted(files) if name.endswith(".py"))
    return paths


def _build(stdlib: str, paths: list[str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    documents: list[tuple[str, tuple[str, ...]]] = []
    try:
        from pydoc_data.topics import topics
    except ImportError:  # some distributions strip pydoc_data; the docstrings still suffice
        topics = {}
    for name in sorted(topics):
        sentences = _prose_sentences(topics[name])
        if sentences:
            documents.append((f"pydoc:{name}", tuple(sentences)))
    for path in paths:
        sentences = _prose_sentences(_stdlib_docstrings(path))
        if sentences:
            documents.append((f"stdlib:{os.path.relpath(path, stdlib)}", tuple(sentences)))
    return tuple(documents)


def _cache_path(stdlib: str, paths: list[str]) -> str | None:
    """The corpus's file under bert-jax's cache root (`runtime.caches`), None with caching off."""
    root = caches.cache_root()
    if root is None:
        return None
    digest = hashlib.sha256()
    for code in (__file__, sentences_module.__file__):
        with open(code, "rb") as f:
            digest.update(f.read())
    digest.update(f"{sys.version}\0{stdlib}\0".encode())
    for path in paths:
        stat = os.stat(path)
        digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    return os.path.join(root, f"embedded-corpus-{digest.hexdigest()[:24]}.json")


def _read_cache(path: str) -> tuple[tuple[str, tuple[str, ...]], ...] | None:
    try:
        with open(path, encoding="utf-8") as f:
            stored = json.load(f)
        return tuple((str(name), tuple(str(s) for s in sentences)) for name, sentences in stored)
    except (OSError, ValueError, TypeError):
        return None


@functools.lru_cache(maxsize=1)
def _embedded_corpus() -> tuple[tuple[str, tuple[str, ...]], ...]:
    stdlib = sysconfig.get_paths()["stdlib"]
    paths = _stdlib_files(stdlib)
    cached = _cache_path(stdlib, paths)
    documents = None if cached is None else _read_cache(cached)
    if documents is None:
        documents = _build(stdlib, paths)
        try:
            if cached is not None:
                os.makedirs(os.path.dirname(cached), exist_ok=True)
                encoded = json.dumps(documents, ensure_ascii=False).encode("utf-8")
                write_bytes_atomic(cached, encoded)
        except OSError:
            pass  # a read-only home: rebuilt by the next process
    if len(documents) < 2:
        raise RuntimeError(
            f"the embedded corpus found only {len(documents)} documents in {stdlib}; this Python "
            "installation ships without its standard-library sources"
        )
    return documents


def _is_eval_document(name: str) -> bool:
    return zlib.crc32(name.encode("utf-8")) % _EVAL_MODULUS == 0


def embedded_documents(split: str = "train") -> list[Document]:
    """The embedded English corpus; ``split`` is "train", "eval" or "all" (see module docstring)."""
    if split not in ("train", "eval", "all"):
        raise UserError(f"embedded corpus split must be train, eval or all, not {split!r}")
    return [
        list(sentences)
        for name, sentences in _embedded_corpus()
        if split == "all" or (split == "eval") == _is_eval_document(name)
    ]


def embedded_document_names(split: str = "train") -> list[str]:
    """Names (``pydoc:TOPIC`` / ``stdlib:PATH``) of ``embedded_documents(split)``, same order."""
    if split not in ("train", "eval", "all"):
        raise UserError(f"embedded corpus split must be train, eval or all, not {split!r}")
    return [
        name
        for name, _ in _embedded_corpus()
        if split == "all" or (split == "eval") == _is_eval_document(name)
    ]
