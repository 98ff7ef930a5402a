"""Pretraining data: tokenizers, corpora, instance creation, TFRecords and the tf.data pipeline."""
