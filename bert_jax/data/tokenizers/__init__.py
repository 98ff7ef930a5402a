"""Tokenizers behind one interface.

- ``interface``: ``Tokenizer`` (what every tokenizer implements) and BERT's five special tokens.
- ``wordpiece``: Google's ``vocab.txt`` or Hugging Face's ``tokenizer.json``, as BERT tokenizes.
- ``sentencepiece``: SentencePiece models with the special pieces: load, encode, train.
- ``load_or_train``: ``load_tokenizer`` (any tokenizer's files), ``train_tokenizer`` (a
  SentencePiece model from any corpus) and ``check_prepared_with`` (records made with this
  tokenizer, or one line naming both).
- ``train_settings``: ``TokenizerTrainSettings``, a SentencePiece training's settings declared
  once (``bert-jax tokenizer train``'s flags, ``train_tokenizer``'s argument).
- ``pair_encoding``: ``encode_pair(s)``: ``[CLS] A [SEP] (B [SEP])``, truncated as
  run_classifier does, padded (fine-tuning inputs).
"""
