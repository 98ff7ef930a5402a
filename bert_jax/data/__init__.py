"""Pretraining data, by stage; each module imports only the stages above it in this list.

- ``layout``: names on disk of prepared data (record suffix, ``prepare_config.json``,
  ``tokenizer/``); ``files``: atomic writes and the one rule for replacing an output directory.
- ``sentences``: ``split_sentences``; ``embedded``: the corpus that ships with Python;
  ``sources``: ``source_kind`` (what a path or name is), ``read_documents`` / ``iter_documents``.
- ``tokenizer``: ``load_tokenizer``, ``train_sentencepiece`` / ``train_tokenizer``, ``encode_pair``
  (the interface in ``tokenizer_base``; ``wordpiece`` and ``sentencepiece_tokenizer`` implement it).
- ``masking``: ``MaskingConfig``, static ``mask_instance``, the pipeline's ``dynamic_mask_batch``;
  ``row_masking``: ``mask_rows`` (many rows at once, exactly ``mask_ids``' draws).
- ``instances``: ``tokenize_documents``, ``create_instances``, ``create_instance_rows``,
  ``instances_to_arrays``.
- ``records``: the original BERT TFRecord features (serialize, write, parse, read).
- ``manifest``: a records directory's inputs (identity, UTF-8 text) and its completion mark;
  ``integrity``: damaged TFRecord files named (or skipped and counted).
- ``groups``: prepare's unit of work (a group of documents -> one shard);
  ``prepare``: ``prepare_records(sources, tokenizer, output_dir, PrepareSettings)``
  (``bert-jax data prepare``) and ``prepare_cached`` (a corpus prepared once for a run).
- ``packing``: several instances per row; ``pipeline``: ``make_pretrain_iterator(records,
  PipelineSettings)`` -> per-host batches with ``get_state``/``set_state``; ``shards``: the
  global batch from a fixed number of readers.

Importing ``tokenizer``, ``sources``, ``masking``, ``row_masking`` and ``instances`` never imports
TensorFlow; the other modules import it lazily, inside the functions that read or write records.
"""
