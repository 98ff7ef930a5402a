"""Pretraining data, one folder per stage; a stage imports only the stages listed before it.

- ``objectives``: the objective, instance format, masking defaults and short-instance share, as
  data settings; ``layout``: names on disk of prepared data (record suffix, ``prepare_config.json``,
  ``tokenizer/``); ``sentences``: ``split_sentences`` (syntok or the regex).
- ``sources/``: what a source is and the documents it holds (text, JSONL, TFDS, Parquet,
  Wikipedia dumps, the embedded corpus), and inputs cut into splits read apart.
- ``records/``: the original BERT TFRecord features, damaged files named, a records directory's
  manifest (inputs by content, completion marks).
- ``tokenizers/``: one interface; WordPiece and SentencePiece; loading any tokenizer's files or
  training one; sentence pairs encoded for fine-tuning.
- ``masking/``: the shares and their one draw-to-outcome rule; static masking of one sequence
  or many rows at once; dynamic masking of a batch in tf.data.
- ``instances/``: document-level sentence pairs (NSP) and single segments (no NSP).
- ``pipeline/``: per-host tf.data with a resumable position, input shards, packing.
- ``preparation/``: ``bert-jax data prepare``: groups of documents -> shards, in local processes
  or as an Apache Beam pipeline, and the merge of several machines' records.

Importing sources, tokenizers, masking (but its dynamic batch) and instances never imports
TensorFlow; the other modules import it lazily, inside the functions that read or write records.
"""
