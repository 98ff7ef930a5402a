"""Corpora as documents (lists of sentences).

- ``documents``: ``source_kind`` (what a path or name is), ``read_documents`` / ``iter_documents``
  (prose split into sentences in worker processes), corpus statistics.
- ``embedded``: the corpus that ships with Python, for runs without data.
- ``parquet``: Parquet files, one row a document, streamed by row group.
- ``wikipedia_dump``: Wikipedia XML dumps (multistream or not), one article a document.
- ``wikitext``: an article's markup -> its running text (what the paper keeps).
- ``text_check``: input that is not text refused, named by file and line, as it is read.
- ``splits``: inputs cut into splits a runner reads apart, every byte read once.
"""
