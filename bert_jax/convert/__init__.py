"""Checkpoint interop: Google TF1 BERT and Hugging Face BERT, in and out."""
