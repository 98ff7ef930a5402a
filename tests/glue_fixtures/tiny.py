"""Shared fixtures of the fine-tuning tests: a WordPiece vocabulary built from the GLUE fixture
files and a tiny randomly initialised encoder, small enough to compile and train in seconds."""

from __future__ import annotations

import collections
import functools
import os
import re
import string

import flax.linen as nn
import jax
import numpy as np

from bert_jax.core.model import BertConfig, BertForPreTraining
from bert_jax.core.trainer import dummy_batch, model_inputs
from bert_jax.data.tokenizers.interface import SPECIAL_TOKENS
from bert_jax.data.tokenizers.wordpiece import WordPieceTokenizer
from bert_jax.finetune.tuning.settings import PretrainedEncoder
from tests.helpers import tiny_config

GLUE_DIR = os.path.dirname(os.path.abspath(__file__))
VOCAB_SIZE = 512


def fixture_vocab(size: int = VOCAB_SIZE) -> list[str]:
    """Special tokens, single characters (alone and as "##" continuations), then the most frequent
    lower-cased words of the fixture files, up to `size` entries."""
    counts: collections.Counter[str] = collections.Counter()
    for directory, _, files in os.walk(GLUE_DIR):
        for name in files:
            if name.endswith(".tsv"):
                with open(os.path.join(directory, name), encoding="utf-8-sig") as f:
                    counts.update(re.findall(r"[a-z]+", f.read().lower()))
    characters = list(string.ascii_lowercase + string.digits + string.punctuation)
    vocab = list(SPECIAL_TOKENS) + characters + ["##" + c for c in characters]
    for word, _ in counts.most_common():
        if len(vocab) >= size:
            break
        if word not in vocab:
            vocab.append(word)
    return vocab


def fixture_tokenizer() -> WordPieceTokenizer:
    return WordPieceTokenizer(fixture_vocab(), lowercase=True)


def tiny_encoder(seed: int = 0, **overrides) -> tuple[BertConfig, dict]:
    """(BertConfig, BertForPreTraining params as NumPy) of a random tiny model (a fresh dict tree
    over shared, read-only arrays; initialised once per process and arguments)."""
    config, params = _tiny_encoder(seed, tuple(sorted(overrides.items())))
    return config, jax.tree.map(lambda x: x, params)


@functools.lru_cache(maxsize=4)
def _tiny_encoder(seed: int, overrides: tuple) -> tuple[BertConfig, dict]:
    config = tiny_config(vocab_size=VOCAB_SIZE, **dict(overrides))
    params = jax.tree.map(np.asarray, _init(config)(jax.random.key(seed))["params"])
    for leaf in jax.tree.leaves(params):
        leaf.flags.writeable = False
    return config, params


@functools.cache
def _init(config: BertConfig):
    """The model's initializer, compiled once for every seed."""
    inputs = model_inputs(dummy_batch(1, 8, 2))
    return jax.jit(lambda rng: nn.meta.unbox(BertForPreTraining(config).init(rng, **inputs)))


def tiny_pretrained(seed: int = 0) -> PretrainedEncoder:
    config, params = tiny_encoder(seed)
    return PretrainedEncoder(config, params["bert"], fixture_tokenizer(), "tiny-random")
