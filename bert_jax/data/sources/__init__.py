"""Corpora as documents (lists of sentences).

- ``kinds``: ``source_kind`` (what a path or name is), ``corpus_format``, ``expand_sources``.
- ``documents``: ``read_documents`` / ``iter_documents``, a corpus's documents from any source
  (read through ``splits.read_split``, in one process or several).
- ``readers``: the formats' reading pieces (lines, text, JSONL, TFDS) that ``splits`` uses.
- ``corpus_stats``: ``CorpusStats``, what reading counted and skipped.
- ``embedded``: the corpus that ships with Python, for runs without data.
- ``parquet``: Parquet files, one row a document, streamed by row group.
- ``wikipedia_dump``: Wikipedia XML dumps (multistream or not), one article a document.
- ``wikitext``: an article's markup -> its running text (what the paper keeps).
- ``text_check``: input that is not text refused, named by file and line, as it is read.
- ``splits``: inputs cut into splits a runner reads apart, every byte read once.
"""
