"""Pretraining instances from tokenized documents.

- ``sentence_pairs``: ``[CLS] A [SEP] B [SEP]`` pairs with next-sentence labels, as
  create_pretraining_data.py makes them (the paper's objective).
- ``single_segments``: ``[CLS] text [SEP]`` rows without NSP, in RoBERTa's formats.
"""
