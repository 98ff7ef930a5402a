"""Pretraining data: tokenizers, corpora, instance creation, TFRecords and the tf.data pipeline.

- ``tokenizer``: ``load_tokenizer``, ``train_sentencepiece`` / ``train_tokenizer``, ``encode_pair``.
- ``corpus``: ``embedded_documents``, ``read_documents`` / ``iter_documents``.
- ``pretraining``: ``create_instances``, ``mask_instance`` (pure NumPy, deterministic by seed).
- ``records``: the original BERT TFRecord features; ``prepare``: ``prepare_records``
  (``bert-jax data prepare``).
- ``pipeline``: ``make_pretrain_iterator`` -> per-host batches with ``get_state``/``set_state``.

Importing ``tokenizer``, ``corpus`` and ``pretraining`` never imports TensorFlow; the other modules
import it lazily, inside the functions that read or write records.
"""
