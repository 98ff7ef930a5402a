"""Sentence pairs as fine-tuning inputs: ``[CLS] A [SEP] (B [SEP])`` with the original
run_classifier truncation, padded to a fixed length.

- ``encode_pair(tokenizer, text_a, text_b=None, *, max_seq_length) -> dict`` and
  ``encode_pairs(...)`` (many, stacked): int32 ``input_ids``, ``input_mask``, ``segment_ids``.
- ``truncate_pair``: that truncation (the longer side loses a token, on a tie the second).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bert_jax.data.tokenizers.interface import Tokenizer
from bert_jax.runtime.errors import UserError


def truncate_pair(tokens_a: list, tokens_b: list, max_tokens: int) -> None:
    """Shorten the longer list from the end until both fit (run_classifier's rule, in place).

    On a tie the second list loses a token, as in the original.
    """
    excess = len(tokens_a) + len(tokens_b) - max_tokens
    if excess <= 0:
        return
    len_a, len_b = len(tokens_a), len(tokens_b)
    while len_a + len_b > max_tokens:
        if len_a > len_b:
            len_a -= 1
        else:
            len_b -= 1
    del tokens_a[len_a:]
    del tokens_b[len_b:]


def encode_pair(
    tokenizer: Tokenizer,
    text_a: str,
    text_b: str | None = None,
    *,
    max_seq_length: int,
) -> dict[str, np.ndarray]:
    """``[CLS] A [SEP]`` or ``[CLS] A [SEP] B [SEP]``, truncated and padded to ``max_seq_length``.

    Returns int32 ``input_ids``, ``input_mask``, ``segment_ids`` of shape [max_seq_length].
    """
    if max_seq_length < (5 if text_b is not None else 3):
        raise UserError(f"max_seq_length {max_seq_length} leaves no room for text")
    tokens_a = tokenizer.encode(text_a)
    if text_b is None:
        del tokens_a[max_seq_length - 2 :]
        ids = [tokenizer.cls_id, *tokens_a, tokenizer.sep_id]
        segments = [0] * len(ids)
    else:
        tokens_b = tokenizer.encode(text_b)
        truncate_pair(tokens_a, tokens_b, max_seq_length - 3)
        ids = [tokenizer.cls_id, *tokens_a, tokenizer.sep_id, *tokens_b, tokenizer.sep_id]
        segments = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
    input_ids = np.full(max_seq_length, tokenizer.pad_id, dtype=np.int32)
    input_mask = np.zeros(max_seq_length, dtype=np.int32)
    segment_ids = np.zeros(max_seq_length, dtype=np.int32)
    input_ids[: len(ids)] = ids
    input_mask[: len(ids)] = 1
    segment_ids[: len(ids)] = segments
    return {"input_ids": input_ids, "input_mask": input_mask, "segment_ids": segment_ids}


def encode_pairs(
    tokenizer: Tokenizer,
    texts_a: Sequence[str],
    texts_b: Sequence[str] | None = None,
    *,
    max_seq_length: int,
) -> dict[str, np.ndarray]:
    """``encode_pair`` over many examples, stacked into int32 arrays [N, max_seq_length]."""
    if texts_b is not None and len(texts_b) != len(texts_a):
        raise ValueError(f"{len(texts_a)} first texts but {len(texts_b)} second texts")
    rows = [
        encode_pair(
            tokenizer, a, None if texts_b is None else texts_b[i], max_seq_length=max_seq_length
        )
        for i, a in enumerate(texts_a)
    ]
    if not rows:
        empty = np.zeros((0, max_seq_length), dtype=np.int32)
        return {"input_ids": empty, "input_mask": empty.copy(), "segment_ids": empty.copy()}
    return {key: np.stack([row[key] for row in rows]) for key in rows[0]}
