"""The interface every tokenizer implements, and BERT's five special tokens.

``Tokenizer`` holds what WordPiece (``data/tokenizers/wordpiece.py``) and SentencePiece
(``data/tokenizers/sentencepiece.py``) share: the special ids, the per-id tables whole-word masking
and random MLM replacement read, the vocabulary-size check, the fingerprint prepared data records,
and ``save``. Callers import it through ``bert_jax.data.tokenizers.load_or_train``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Sequence

import numpy as np

from bert_jax.runtime import fs
from bert_jax.runtime.errors import UserError
from bert_jax.runtime.outputs import write_json_atomic

CONFIG_NAME = "bert_jax_tokenizer.json"
SPM_NAME = "spiece.model"
VOCAB_NAME = "vocab.txt"

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)


def special_token_pattern(tokens: Iterable[str]) -> re.Pattern[str]:
    """A regex whose ``split`` alternates text and the given special tokens, written in text.

    Matched on the text as given (before lower-casing), longest token first, anywhere (also
    inside a word): Hugging Face's added tokens match the same way, so "x[MASK]y" is x, [MASK],
    y on both sides and "[mask]" is ordinary text on both.
    """
    alternatives = sorted(set(tokens), key=len, reverse=True)
    return re.compile("(" + "|".join(re.escape(token) for token in alternatives) + ")")


class Tokenizer:
    """Common interface of the WordPiece and SentencePiece tokenizers.

    ``encode(text)`` gives ids without adding special tokens; with ``allow_special`` (the
    default) the five special tokens written in the text ("[MASK]", "[SEP]", ...) become their
    ids, exactly as the exported Hugging Face tokenizer reads them (``convert --to hf``);
    without it they are ordinary text, as in the original BERT's data preparation.
    ``encode_batch(texts)`` encodes many texts as ``encode(text, allow_special=False)`` does,
    in one call (what data preparation uses).
    """

    kind: str
    lowercase: bool
    vocab_size: int
    pad_id: int
    unk_id: int
    cls_id: int
    sep_id: int
    mask_id: int
    # Per-id tables, length vocab_size.
    _word_start_table: np.ndarray
    _ordinary_table: np.ndarray

    # --- to implement (encode_batch: where one call for many texts is faster) ---------------
    def tokenize(self, text: str, allow_special: bool = True) -> list[str]:
        raise NotImplementedError

    def encode(self, text: str, allow_special: bool = True) -> list[int]:
        raise NotImplementedError

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(text, allow_special=False) for text in texts]

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        raise NotImplementedError

    def convert_tokens_to_ids(self, tokens: Iterable[str]) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        raise NotImplementedError

    def _save_files(self, directory: str) -> None:
        raise NotImplementedError

    def _fingerprint_bytes(self) -> bytes:
        raise NotImplementedError

    # --- shared -------------------------------------------------------------------------------
    @property
    def special_ids(self) -> dict[str, int]:
        return {
            PAD: self.pad_id,
            UNK: self.unk_id,
            CLS: self.cls_id,
            SEP: self.sep_id,
            MASK: self.mask_id,
        }

    @property
    def word_start_table(self) -> np.ndarray:
        """bool[vocab_size]: True where an id begins a new word (special tokens included)."""
        return self._word_start_table

    @property
    def ordinary_ids(self) -> np.ndarray:
        """int32 ids that a random MLM replacement may take.

        Excludes special, control, unknown and ``[unused*]`` entries: the original draws from the
        whole vocabulary and so can insert [SEP] or [CLS] into the middle of a sequence.
        """
        return np.flatnonzero(self._ordinary_table).astype(np.int32)

    def word_start(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Which ids begin a new word: a WordPiece not starting with "##", a SentencePiece piece
        starting with "▁", and every special token. Used to group sub-tokens for whole-word masking.
        """
        ids = np.asarray(ids, dtype=np.int64)
        return self._word_start_table[ids]

    def check_vocab_size(self, model_vocab_size: int) -> None:
        """Fail before training when ids could index past the model's embedding table.

        An out-of-range id does not raise on accelerators; it silently reads garbage and is a
        known cause of NaN losses with the original code.
        """
        if self.vocab_size > model_vocab_size:
            raise UserError(
                f"tokenizer vocabulary has {self.vocab_size} entries but the model's vocab_size is "
                f"{model_vocab_size}: ids >= {model_vocab_size} would index past the embedding "
                "table. Set the model's vocab_size to at least the tokenizer's."
            )

    def fingerprint(self) -> str:
        """A short hash of the vocabulary and settings; prepared data records it."""
        digest = hashlib.sha256(self._fingerprint_bytes())
        digest.update(json.dumps({"lowercase": self.lowercase, "kind": self.kind}).encode())
        return digest.hexdigest()[:16]

    def save(self, directory: str) -> None:
        """Write everything needed to load this tokenizer again with ``load_tokenizer``."""
        fs.makedirs(directory, exist_ok=True)
        self._save_files(directory)
        config = {
            "type": self.kind,
            "lowercase": self.lowercase,
            "vocab_size": self.vocab_size,
            "special_tokens": self.special_ids,
        }
        write_json_atomic(os.path.join(directory, CONFIG_NAME), config)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(vocab_size={self.vocab_size}, lowercase={self.lowercase}, "
            f"fingerprint={self.fingerprint()})"
        )
