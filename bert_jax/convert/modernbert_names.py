"""The one table that names every ModernBERT weight in bert-jax and transformers terms, and the
strict import and check over it (what `mapping.py` and `strict.py` are to BERT).

Each `Entry` ties a bert-jax parameter path (core/modernbert.py's tree) to its key in
transformers' `ModernBertForMaskedLM` state dict, with both shapes and the layout change:

- "vector"    : the same 1-D array (norms, biases; the decoder bias has a row per word);
- "embedding" : [vocab, hidden] both sides;
- "dense"     : bert-jax kernel [in, out]; transformers' weight [out, in];
- "qkv"       : bert-jax [hidden, 3, heads, head_dim]; transformers' Wqkv [3 x hidden, hidden]
                (its rows: queries, keys, values, each head after head);
- "qkv_bias"  : bert-jax [3, heads, head_dim]; transformers' [3 x hidden];
- "attn_out"  : bert-jax [heads, head_dim, hidden]; transformers' Wo [hidden, hidden];
- "geglu"     : bert-jax [hidden, 2, intermediate]; transformers' Wi [2 x intermediate, hidden]
                (its rows: the input, then the gate);
- "geglu_bias": bert-jax [2, intermediate]; transformers' [2 x intermediate].

Vocabulary rows are `padded_vocab_size` in bert-jax (zero rows appended), `vocab_size` outside.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from flax import traverse_util

from bert_jax.convert.mapping import get_path, set_path
from bert_jax.convert.strict import ConversionError, ConversionReport
from bert_jax.core.modernbert_config import ModernBertConfig

Path = tuple[str, ...]
# transformers ties the decoder to the token embeddings and does not save it; a state dict
# taken from a live model holds it as a copy.
TIED = {"decoder.weight": "model.embeddings.tok_embeddings.weight"}


@dataclasses.dataclass(frozen=True)
class Entry:
    path: Path  # bert-jax params path
    hf: str  # transformers ModernBertForMaskedLM state-dict key
    layout: str
    shape: tuple[int, ...]  # bert-jax
    hf_shape: tuple[int, ...]
    head: bool = False  # the MLM head's (absent from an encoder-only model)


def entries(config: ModernBertConfig, with_heads: bool = True) -> list[Entry]:
    """Every weight of ModernBertForMaskedLM (or of ModernBertModel without `with_heads`)."""
    d, f = config.hidden_size, config.intermediate_size
    h, k = config.num_attention_heads, config.head_dim
    table: list[Entry] = []

    def norm(path: Path, hf: str, head: bool = False) -> None:
        table.append(Entry((*path, "scale"), f"{hf}.weight", "vector", (d,), (d,), head))
        if config.norm_bias:
            table.append(Entry((*path, "bias"), f"{hf}.bias", "vector", (d,), (d,), head))

    def linear(path: Path, hf: str, layouts: tuple[str, str], shapes, bias: bool, head=False):
        (kernel, kernel_hf), (vector, vector_hf) = shapes
        table.append(Entry((*path, "kernel"), f"{hf}.weight", layouts[0], kernel, kernel_hf, head))
        if bias:
            table.append(Entry((*path, "bias"), f"{hf}.bias", layouts[1], vector, vector_hf, head))

    emb = ("model", "embeddings")
    table.append(
        Entry(
            (*emb, "tok_embeddings", "embedding"),
            "model.embeddings.tok_embeddings.weight",
            "embedding",
            (config.padded_vocab_size, d),
            (config.vocab_size, d),
        )
    )
    norm((*emb, "norm"), "model.embeddings.norm")
    for i in range(config.num_hidden_layers):
        layer, hf = ("model", f"layers_{i}"), f"model.layers.{i}"
        if i > 0:  # layer 0 reads the embeddings' norm
            norm((*layer, "attn_norm"), f"{hf}.attn_norm")
        attention_shapes = (((d, 3, h, k), (3 * d, d)), ((3, h, k), (3 * d,)))
        linear(
            (*layer, "attn", "Wqkv"),
            f"{hf}.attn.Wqkv",
            ("qkv", "qkv_bias"),
            attention_shapes,
            config.attention_bias,
        )
        linear(
            (*layer, "attn", "Wo"),
            f"{hf}.attn.Wo",
            ("attn_out", "vector"),
            (((h, k, d), (d, d)), ((d,), (d,))),
            config.attention_bias,
        )
        norm((*layer, "mlp_norm"), f"{hf}.mlp_norm")
        linear(
            (*layer, "mlp", "Wi"),
            f"{hf}.mlp.Wi",
            ("geglu", "geglu_bias"),
            (((d, 2, f), (2 * f, d)), ((2, f), (2 * f,))),
            config.mlp_bias,
        )
        linear(
            (*layer, "mlp", "Wo"),
            f"{hf}.mlp.Wo",
            ("dense", "vector"),
            (((f, d), (d, f)), ((d,), (d,))),
            config.mlp_bias,
        )
    norm(("model", "final_norm"), "model.final_norm")
    if with_heads:
        linear(
            ("head", "dense"),
            "head.dense",
            ("dense", "vector"),
            (((d, d), (d, d)), ((d,), (d,))),
            config.classifier_bias,
            head=True,
        )
        norm(("head", "norm"), "head.norm", head=True)
        if config.decoder_bias:
            rows = (config.padded_vocab_size,), (config.vocab_size,)
            table.append(Entry(("decoder_bias",), "decoder.bias", "vector", *rows, head=True))
    return table


def task_entries(config: ModernBertConfig, outputs: int, encoder_key: str = "bert") -> list[Entry]:
    """Every weight of a fine-tuned ModernBERT model (the fine-tuning state's tree: the encoder
    under `encoder_key`, the head under "classifier") with its name in transformers'
    ModernBertFor<task> classes, which all have the same head: `head.dense`, `head.norm` (the
    MLM head's transform, under classifier/head) and `classifier` (under classifier/output, a
    bias always: an nn.Linear), `outputs` wide (`task_heads.HeadKind.num_outputs`)."""
    d = config.hidden_size
    table = [
        dataclasses.replace(entry, path=(encoder_key, *entry.path[1:]))
        for entry in entries(config, with_heads=False)
    ]
    table += [
        dataclasses.replace(entry, path=("classifier", *entry.path))
        for entry in entries(config, with_heads=True)
        if entry.path[0] == "head"
    ]
    table.append(
        Entry(
            ("classifier", "output", "kernel"),
            "classifier.weight",
            "dense",
            (d, outputs),
            (outputs, d),
            head=True,
        )  # fmt: skip
    )
    table.append(
        Entry(
            ("classifier", "output", "bias"),
            "classifier.bias",
            "vector",
            (outputs,),
            (outputs,),
            head=True,
        )  # fmt: skip
    )
    return table


def _vocab_rows(entry: Entry) -> bool:
    return entry.path[-1] in ("embedding", "decoder_bias")


def to_bert_jax(entry: Entry, value: np.ndarray, config: ModernBertConfig) -> np.ndarray:
    """A transformers array in the bert-jax layout (vocabulary rows padded)."""
    value = np.asarray(value)
    if entry.layout in ("dense", "qkv", "attn_out", "geglu"):
        value = value.T
    if not _vocab_rows(entry):
        return value.reshape(entry.shape)
    padding = [(0, config.padded_vocab_size - value.shape[0])] + [(0, 0)] * (value.ndim - 1)
    return np.pad(value[: config.vocab_size], padding)


def from_bert_jax(entry: Entry, value: np.ndarray, config: ModernBertConfig) -> np.ndarray:
    """A bert-jax array in transformers' layout (vocabulary padding cut)."""
    value = np.asarray(value)
    if _vocab_rows(entry):
        return value[: config.vocab_size]
    if entry.layout in ("dense", "qkv", "attn_out", "geglu"):
        return value.reshape(entry.hf_shape[::-1]).T
    return value.reshape(entry.hf_shape)


def encoder_matches(shapes: Mapping[str, Sequence[int]], config: ModernBertConfig) -> bool:
    """Whether every encoder tensor is in `shapes` with its shape: what `--drop-heads` would
    convert (`strict.DROP_HEADS_HINT` is offered only then)."""
    return all(
        tuple(int(n) for n in shapes.get(entry.hf, ())) == entry.hf_shape
        for entry in entries(config, with_heads=False)
    )


def import_params(
    shapes: Mapping[str, Sequence[int]],
    read: Callable[[str], np.ndarray],
    config: ModernBertConfig,
    *,
    with_heads: bool,
    ignore: Callable[[str], str | None],
    report: ConversionReport | None = None,
    origin: str = "checkpoint",
) -> dict[str, Any]:
    """bert-jax params (nested dict of float32 NumPy arrays) from transformers-named tensors:
    each parameter filled from exactly one tensor of its shape, each tensor used or ignored for
    `ignore(name)`'s reason; otherwise `ConversionError` naming every problem, before reading."""
    table = entries(config, with_heads)
    problems = []
    for entry in table:
        if entry.hf not in shapes:
            problems.append(f"missing tensor {entry.hf!r} (shape {entry.hf_shape})")
        elif tuple(int(n) for n in shapes[entry.hf]) != entry.hf_shape:
            problems.append(
                f"tensor {entry.hf!r} has shape {tuple(shapes[entry.hf])} but this config needs "
                f"{entry.hf_shape}"
            )
    wanted = {entry.hf for entry in table}
    ignored = {name: ignore(name) for name in shapes if name not in wanted}
    unused = sorted(name for name, reason in ignored.items() if reason is None)
    if unused:
        shown = ", ".join(repr(n) for n in unused[:8])
        more = f" and {len(unused) - 8} more" if len(unused) > 8 else ""
        problems.append(
            f"{len(unused)} tensor(s) in the {origin} have no place in a ModernBERT model with "
            f"this config: {shown}{more}"
        )
    if problems:
        head = f"{origin} does not match the model ({len(problems)} problem(s)):\n  - "
        raise ConversionError(head + "\n  - ".join(problems))
    params: dict[str, Any] = {}
    for entry in table:
        value = np.asarray(read(entry.hf))
        if value.dtype.kind in "biuSUOc":  # bfloat16 (ml_dtypes) is not an np.floating
            raise ConversionError(f"tensor {entry.hf!r} has dtype {value.dtype}, expected floats")
        converted = to_bert_jax(entry, value, config)
        set_path(params, entry.path, np.ascontiguousarray(converted, dtype=np.float32))
    if report is not None:
        report.config = config
        report.has_heads = with_heads
        report.tensors_read = len(shapes)
        report.used = sorted(wanted)
        report.ignored = {name: reason for name, reason in sorted(ignored.items()) if reason}
        report.num_parameters = sum(int(np.prod(entry.hf_shape)) for entry in table)
    return params


def state_dict_from(params: Mapping[str, Any], config: ModernBertConfig) -> dict[str, np.ndarray]:
    """transformers' state dict (float32 NumPy, tied decoder left out) from bert-jax params;
    encoder-only params give ModernBertModel's keys (without "model.")."""
    with_heads = "head" in params
    out = {}
    for entry in entries(config, with_heads):
        value = np.asarray(get_path(params, entry.path), dtype=np.float32)
        key = entry.hf if with_heads else entry.hf[len("model.") :]
        out[key] = np.ascontiguousarray(from_bert_jax(entry, value, config))
    return out


def expected_tree(config: ModernBertConfig, has_heads: bool) -> dict[str, Any]:
    """The param tree's shapes (nested dict of tuples), as the model creates it."""
    tree: dict[str, Any] = {}
    for entry in entries(config, has_heads):
        set_path(tree, entry.path, entry.shape)
    return tree


def check_params(params: Mapping[str, Any], config: ModernBertConfig, what: str) -> bool:
    """Checks a param tree against `config`; returns whether it holds the MLM head. Raises
    `ConversionError` naming each missing, extra or mis-shaped parameter."""
    has_heads = "head" in params or "decoder_bias" in params
    want = traverse_util.flatten_dict(expected_tree(config, has_heads), sep="/")
    found = {
        path: tuple(getattr(leaf, "shape", np.shape(leaf)))
        for path, leaf in traverse_util.flatten_dict(dict(params), sep="/").items()
    }
    problems = [f"missing parameter {p} {s}" for p, s in want.items() if p not in found]
    problems += [
        f"parameter {p} has shape {found[p]} but the config needs {s}"
        for p, s in want.items()
        if p in found and found[p] != s
    ]
    problems += [f"unexpected parameter {p} {s}" for p, s in found.items() if p not in want]
    if problems:
        raise ConversionError(
            f"{what} does not match its ModernBERT config ({len(problems)} problem(s)):\n  - "
            + "\n  - ".join(problems[:20])
        )
    return has_heads


def count_parameters(config: ModernBertConfig, with_heads: bool = True) -> int:
    """Parameters as transformers counts them (the tied decoder once, no vocabulary padding)."""
    return sum(int(np.prod(entry.hf_shape)) for entry in entries(config, with_heads))
