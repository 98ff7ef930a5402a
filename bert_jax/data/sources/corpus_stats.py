"""What reading a corpus counted: ``CorpusStats`` (files, documents, sentences, and the bad input
skipped, with the first few places), summed over splits and workers."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from bert_jax.data.sources.embedded import Document

_MAX_PROBLEM_EXAMPLES = 20


@dataclass
class CorpusStats:
    """Counts of what was read, kept and skipped; ``problems`` holds the first few locations."""

    files: int = 0
    empty_files: int = 0
    documents: int = 0
    sentences: int = 0
    empty_documents: int = 0
    one_sentence_documents: int = 0
    invalid_utf8_lines: int = 0
    long_lines: int = 0
    bad_records: int = 0
    skipped_pages: int = 0  # Wikipedia pages that are not articles (redirects, talk, ...)
    problems: list[str] = field(default_factory=list)

    def note(self, counter: str, where: str) -> None:
        setattr(self, counter, getattr(self, counter) + 1)
        if len(self.problems) < _MAX_PROBLEM_EXAMPLES:
            self.problems.append(f"{where}: {counter.replace('_', ' ')}")

    def add_document(self, document: Document) -> None:
        self.documents += 1
        self.sentences += len(document)
        if len(document) == 1:
            self.one_sentence_documents += 1

    def merge(self, other: CorpusStats) -> None:
        for f in dataclasses.fields(self):
            if f.name == "problems":
                room = _MAX_PROBLEM_EXAMPLES - len(self.problems)
                self.problems.extend(other.problems[: max(0, room)])
            else:
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        counts = {k: v for k, v in self.as_dict().items() if k != "problems" and v}
        return ", ".join(f"{k}={v}" for k, v in counts.items()) or "nothing read"
