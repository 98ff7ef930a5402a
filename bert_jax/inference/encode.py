"""Feature extraction (the paper's feature-based approach, section 5.3 / Table 7).

Texts are tokenized with the model's own tokenizer into `[CLS] A [SEP]` (or `[CLS] A [SEP] B [SEP]`
for a line `A ||| B`, the separator of the original `extract_features.py`), batched into one fixed
shape (the last batch is padded, so the encoder compiles once), run through the encoder under jit,
and reduced:

- `pool="cls"`: the hidden state at [CLS] (not the tanh pooler output), [N, D'].
- `pool="last"`: the hidden state at the last real token ([SEP]), [N, D']: where a left-to-right
  ("ltr") model reads a sentence, since under its causal mask [CLS] has seen nothing else. The
  default (`pool=None`) is the position the model's own pooler reads: "last" for a left-to-right
  model, "cls" for the others; "cls" on a left-to-right model is refused (the same vector for
  every text).
- `pool="mean"`: the average over real tokens ([CLS] and [SEP] included, padding excluded, by
  `input_mask`), as sentence-transformers' mean pooling, [N, D'].
- `pool="none"`: per-token features, zero-padded to the longest row, [N, L, D'], with the number
  of real tokens of each row in `lengths` ([N], int32).

`layers` index the hidden states as Hugging Face's `hidden_states` does: 0 is the embedding output,
i the output of layer i, -1 the last layer. Several layers are concatenated along the feature axis
(D' = len(layers) * hidden), as in the paper's "concat last four hidden" row of Table 7.

A ModernBERT model encodes the same way (its tokenizer's [CLS] and [SEP]; a pair's second text is
told apart by [SEP] alone, ModernBERT having no segment embeddings); its last hidden state is the
one after the final norm, as transformers' `ModernBertModel` gives it (`last_hidden_state`, and
the last of `hidden_states`).
"""

from __future__ import annotations

import dataclasses
import functools
import io
import os
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.core.model import BertConfig, BertModel, last_token_positions
from bert_jax.core.modernbert import ModernBertModel
from bert_jax.core.modernbert_config import ModernBertConfig
from bert_jax.inference.encode_settings import DEFAULT_MAX_SEQ_LENGTH, EncodeSettings
from bert_jax.runtime import fs, topology
from bert_jax.runtime import outputs as files
from bert_jax.runtime.errors import UserError, user_path

PAIR_SEPARATOR = " ||| "
# Rows are padded to a multiple of this many tokens (up to max_seq_length): the compiled shape
# stays fixed while short inputs do not pay for max_seq_length.
_LENGTH_MULTIPLE = 8
_NPY_MAGIC = b"\x93NUMPY"


@dataclasses.dataclass
class Features:
    features: np.ndarray  # float32 [N, D'] or [N, L, D']
    lengths: np.ndarray  # int32 [N]: real tokens per row (after truncation)
    num_truncated: int  # rows whose text was cut to fit max_seq_length
    max_seq_length: int


def read_texts(path: str | os.PathLike) -> list[tuple[str, str | None]]:
    """One example per line (blank lines included, so row i is line i); `A ||| B` is a pair."""
    with fs.open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    examples = []
    for line in lines:
        if PAIR_SEPARATOR.strip() in line:
            a, b = line.split(PAIR_SEPARATOR.strip(), 1)
            examples.append((a.strip(), b.strip()))
        else:
            examples.append((line, None))
    return examples


def _check_layers(layers: tuple[int, ...], config: BertConfig) -> None:
    count = config.num_hidden_layers + 1
    bad = [layer for layer in layers if not -count <= layer < count]
    if bad:
        raise UserError(
            f"layer {bad[0]} does not exist: the model has {config.num_hidden_layers} layers, "
            f"so hidden states are indexed {-count}..{count - 1} (0 = embeddings, -1 = last)"
        )


def _encoder_params(model: Any) -> Any:
    """The encoder's subtree of a model directory's params (`ModelDir.encoder_params`: a
    fine-tuned model's too; BERT's without its pooler)."""
    if isinstance(model.config, ModernBertConfig):
        return model.encoder_params
    return {k: v for k, v in model.encoder_params.items() if k != "pooler"}


def _hidden_states(params, input_ids, input_mask, segment_ids, config) -> tuple[jax.Array, ...]:
    """The embeddings' output, then each layer's (the last as the model's sequence output)."""
    if isinstance(config, ModernBertConfig):
        outputs = ModernBertModel(config).apply(
            {"params": params}, input_ids, input_mask, deterministic=True
        )
        # The last layer's state after the final norm, as transformers' ModernBertModel gives it.
        return (*outputs["hidden_states"][:-1], outputs["sequence_output"])
    outputs = BertModel(config, add_pooler=False).apply(
        {"params": params}, input_ids, input_mask, segment_ids, deterministic=True
    )
    return outputs["hidden_states"]


@functools.partial(jax.jit, static_argnames=("config", "pool", "layers"))
def _features(params, input_ids, input_mask, segment_ids, *, config, pool, layers):
    states = _hidden_states(params, input_ids, input_mask, segment_ids, config)
    hidden = jnp.concatenate([states[layer].astype(jnp.float32) for layer in layers], axis=-1)
    mask = input_mask.astype(jnp.float32)[..., None]
    if pool == "cls":
        return hidden[:, 0]
    if pool == "last":
        last = last_token_positions(input_mask)[..., None]  # [batch, 1, 1]
        return jnp.take_along_axis(hidden, last, axis=1)[:, 0]
    if pool == "mean":
        return jnp.sum(hidden * mask, axis=1) / jnp.maximum(jnp.sum(mask, axis=1), 1.0)
    return hidden * mask


def _pool_for(config: BertConfig, pool: str | None, where: str = "the model") -> str:
    """`pool` (one of the declared choices) for this model; None gives the position the model's
    pooler reads (see module doc)."""
    if pool is None:
        return "last" if config.is_decoder else "cls"
    if pool == "cls" and config.is_decoder:
        raise UserError(
            f"--pool cls on {where}, a left-to-right model (objective 'ltr'), would give every "
            "text the same vector: under its causal mask [CLS] sees only itself; use --pool last "
            "(its default: the last real token), mean or none"
        )
    return pool


def _tokenize(tokenizer, examples, max_seq_length: int):
    """input ids etc. per example, unpadded, and how many were truncated."""
    from bert_jax.data.tokenizers.pair_encoding import encode_pair

    rows, truncated = [], 0
    for text_a, text_b in examples:
        encoded = encode_pair(tokenizer, text_a, text_b, max_seq_length=max_seq_length)
        length = int(encoded["input_mask"].sum())
        full = len(tokenizer.encode(text_a)) + 2
        if text_b is not None:
            full += len(tokenizer.encode(text_b)) + 1
        truncated += full > length
        rows.append((encoded, length))
    return rows, truncated


def encode_texts(
    model: Any,
    texts: Sequence[str | tuple[str, str | None]],
    settings: EncodeSettings | None = None,
    **options: Any,
) -> Features:
    """Features for `texts` (strings or (A, B) pairs) from a loaded `ModelDir` (see module doc).

    `settings` (default: the declared defaults, encode_settings.py), with `options`
    (`pool="mean"`, `layers="-2,-1"`, `batch_size=8`: its fields) replacing some of them. An
    unset `max_seq_length` is DEFAULT_MAX_SEQ_LENGTH, or the model's max_position_embeddings when
    smaller; `dtype` overrides the compute dtype (e.g. "bfloat16"); features are float32.
    """
    topology.quiet_library_runtime()  # before JAX starts its backends: no libtpu noise
    settings = dataclasses.replace(settings or EncodeSettings(), **options)
    pool = _pool_for(model.config, settings.pool, model.path)
    batch_size = settings.batch_size
    config = model.config
    if isinstance(config, BertConfig):
        config = config.replace(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    if settings.dtype is not None:
        config = config.replace(dtype=settings.dtype)
    max_seq_length = settings.max_seq_length
    if max_seq_length is None:
        max_seq_length = min(DEFAULT_MAX_SEQ_LENGTH, config.max_position_embeddings)
    if max_seq_length > config.max_position_embeddings:
        raise UserError(
            f"--max-seq-length {max_seq_length} exceeds the model's max_position_embeddings="
            f"{config.max_position_embeddings}"
        )
    layer_ids = settings.layers
    _check_layers(layer_ids, config)
    if model.params is None:
        raise ValueError(f"{model.path} was loaded without params")
    examples = [(t, None) if isinstance(t, str) else (t[0], t[1]) for t in texts]
    rows, truncated = _tokenize(model.tokenizer, examples, max_seq_length)
    lengths = np.array([length for _, length in rows], dtype=np.int32)
    longest = int(lengths.max()) if len(rows) else 1
    seq_len = min(max_seq_length, -(-longest // _LENGTH_MULTIPLE) * _LENGTH_MULTIPLE)
    # The pooler is not needed for features; leave it on the host.
    encoder = _encoder_params(model)
    device = jax.devices()[0]
    encoder = jax.device_put(encoder, device)

    hidden = len(layer_ids) * config.hidden_size
    shape = (len(rows), hidden) if pool != "none" else (len(rows), longest, hidden)
    out = np.zeros(shape, dtype=np.float32)
    pending: list[tuple[int, int, Any]] = []

    def drain(keep: int) -> None:
        while len(pending) > keep:
            start, count, result = pending.pop(0)
            values = np.asarray(result)[:count]
            out[start : start + count] = values if pool != "none" else values[:, :longest]

    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        batch = {
            key: np.zeros((batch_size, seq_len), np.int32)
            for key in ("input_ids", "input_mask", "segment_ids")
        }
        # Padding rows get one visible token, so no attention row is fully masked.
        batch["input_mask"][:, 0] = 1
        for i, (encoded, _) in enumerate(chunk):
            for key in batch:
                batch[key][i] = encoded[key][:seq_len]
        result = _features(
            encoder,
            jax.device_put(batch["input_ids"], device),
            jax.device_put(batch["input_mask"], device),
            jax.device_put(batch["segment_ids"], device),
            config=config,
            pool=pool,
            layers=layer_ids,
        )
        pending.append((start, len(chunk), result))
        drain(keep=1)  # the host copies batch k-1 while the device runs batch k
    drain(keep=0)
    return Features(out, lengths, int(truncated), max_seq_length)


def _check_replaceable_npy(path: str) -> None:
    """An existing OUT is replaced only when it is a NumPy array file (what encode writes)."""
    if fs.isdir(path):
        raise UserError(f"--output {path} is a directory; give a file name such as OUT.npy")
    if fs.exists(path):
        with fs.open(path, "rb") as f:
            if f.read(len(_NPY_MAGIC)) != _NPY_MAGIC:
                raise UserError(
                    f"--output {path} exists and is not a NumPy .npy file; bert-jax replaces "
                    "only .npy files (choose another name or move it away)"
                )


def _save_npy(path: str, array: np.ndarray) -> None:
    # Written beside and renamed: a killed run never leaves a half-written OUT.npy.
    buffer = io.BytesIO()
    np.save(buffer, array)  # through a file object: np.save(path) would append ".npy"
    files.write_bytes_atomic(path, buffer.getvalue())


def lengths_path(output: str | os.PathLike) -> str:
    """Where `pool="none"` writes the per-row token counts: OUT.npy -> OUT.lengths.npy."""
    output = os.fspath(output)
    stem = output[: -len(".npy")] if output.endswith(".npy") else output
    return stem + ".lengths.npy"


def encode_file(
    model: str | os.PathLike,
    input_path: str | os.PathLike,
    output_path: str | os.PathLike,
    settings: EncodeSettings | None = None,
    **options: Any,
) -> dict[str, Any]:
    """`bert-jax encode`: features of every line of `input_path` saved to `output_path` (.npy),
    with `settings` and `options` as `encode_texts` takes them.

    With `pool="none"` the token counts go to `lengths_path(output_path)`. Returns a summary.
    """
    from bert_jax.training.load_model import load_model_dir

    settings = dataclasses.replace(settings or EncodeSettings(), **options)
    output_path = os.fspath(output_path)
    outputs = [output_path] + ([lengths_path(output_path)] if settings.pool == "none" else [])
    for path in outputs:  # before anything is read: a refusal costs nothing
        _check_replaceable_npy(path)
    with user_path(input_path, "--input"):
        examples = read_texts(input_path)
    if not examples:
        raise UserError(f"{input_path} holds no lines to encode")
    loaded = load_model_dir(model)
    result = encode_texts(loaded, examples, settings)
    parent = os.path.dirname(fs.abspath(output_path))
    with user_path(output_path, "--output", writing=True):
        fs.makedirs(parent, exist_ok=True)
        _save_npy(output_path, result.features)
        written = [output_path]
        if settings.pool == "none":
            _save_npy(lengths_path(output_path), result.lengths)
            written.append(lengths_path(output_path))
    return {
        "model": loaded.path,
        "texts": len(examples),
        "shape": list(result.features.shape),
        "truncated": result.num_truncated,
        "max_seq_length": result.max_seq_length,
        "written": written,
    }
