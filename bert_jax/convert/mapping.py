"""The one table that names every BERT weight in bert-jax, Hugging Face and Google TF1 terms.

Each `Entry` ties a bert-jax parameter path to its Hugging Face `state_dict` name and its original
TF1 variable name, with the layout change between them. Layouts:

- "vector"  : same 1-D array everywhere (biases, LayerNorm, output bias).
- "embedding": [rows, hidden] everywhere.
- "dense"   : bert-jax kernel [in, out]; HF weight [out, in]; TF1 kernel [in, out].
- "qkv"     : bert-jax kernel [hidden, heads, head_dim]; HF [hidden_out, hidden_in]; TF1 [in, out].
- "qkv_bias": bert-jax bias [heads, head_dim]; HF and TF1 [hidden].
- "attn_out": bert-jax kernel [heads, head_dim, hidden]; HF [hidden_out, hidden_in]; TF1 [in, out].
- "nsp"     : bert-jax kernel [hidden, 2]; HF weight [2, hidden]; TF1 output_weights [2, hidden].
- "task_output": a fine-tuned head's output layer, as "nsp" with one column per output: bert-jax
              classifier/output/kernel [hidden, outputs]; HF `classifier.weight` (or
              `qa_outputs.weight`) [outputs, hidden]. `task_entries` lists a fine-tuned model's
              weights with their names in transformers' BertFor<task> classes.

With `config.vocab_pad_multiple` > 1 the bert-jax word embeddings and MLM output bias hold
`padded_vocab_size` rows, the checkpoints `vocab_size`: imports append zero rows, exports drop them.

Every importer and exporter goes through `to_bert_jax` / `from_bert_jax`, so a name or a transpose
is fixed here once for all of them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from bert_jax.core.model import BertConfig

Path = tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Entry:
    path: Path  # bert-jax params path
    hf: str  # Hugging Face BertForPreTraining state_dict key
    tf1: str  # google-research/bert variable name
    layout: str
    head: bool = False  # part of the pretraining heads (absent from encoder-only checkpoints)


def _layer_norm(path: Path, hf: str, tf1: str, head: bool = False) -> Iterator[Entry]:
    yield Entry((*path, "scale"), f"{hf}.weight", f"{tf1}/gamma", "vector", head)
    yield Entry((*path, "bias"), f"{hf}.bias", f"{tf1}/beta", "vector", head)


def _dense(path: Path, hf: str, tf1: str, layout: str = "dense", head=False) -> Iterator[Entry]:
    bias_layout = "qkv_bias" if layout == "qkv" else "vector"
    yield Entry((*path, "kernel"), f"{hf}.weight", f"{tf1}/kernel", layout, head)
    yield Entry((*path, "bias"), f"{hf}.bias", f"{tf1}/bias", bias_layout, head)


def entries(config: BertConfig, with_heads: bool = True) -> list[Entry]:
    """All weights of BertForPreTraining (or of the encoder + pooler when `with_heads=False`)."""
    table: list[Entry] = []
    emb = ("bert", "embeddings")
    for name in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
        table.append(
            Entry(
                (*emb, name, "embedding"),
                f"bert.embeddings.{name}.weight",
                f"bert/embeddings/{name}",
                "embedding",
            )
        )
    table += _layer_norm(
        (*emb, "LayerNorm"), "bert.embeddings.LayerNorm", "bert/embeddings/LayerNorm"
    )
    for i in range(config.num_hidden_layers):
        layer = ("bert", "encoder", f"layer_{i}")
        hf, tf1 = f"bert.encoder.layer.{i}", f"bert/encoder/layer_{i}"
        for name in ("query", "key", "value"):
            table += _dense(
                (*layer, "attention", name),
                f"{hf}.attention.self.{name}",
                f"{tf1}/attention/self/{name}",
                "qkv",
            )
        table += _dense(
            (*layer, "attention", "output"),
            f"{hf}.attention.output.dense",
            f"{tf1}/attention/output/dense",
            "attn_out",
        )
        table += _layer_norm(
            (*layer, "attention_output_LayerNorm"),
            f"{hf}.attention.output.LayerNorm",
            f"{tf1}/attention/output/LayerNorm",
        )
        table += _dense(
            (*layer, "intermediate"), f"{hf}.intermediate.dense", f"{tf1}/intermediate/dense"
        )
        table += _dense((*layer, "output"), f"{hf}.output.dense", f"{tf1}/output/dense")
        table += _layer_norm(
            (*layer, "output_LayerNorm"), f"{hf}.output.LayerNorm", f"{tf1}/output/LayerNorm"
        )
    table += _dense(("bert", "pooler"), "bert.pooler.dense", "bert/pooler/dense")
    if with_heads:
        table += _dense(
            ("predictions", "transform"),
            "cls.predictions.transform.dense",
            "cls/predictions/transform/dense",
            head=True,
        )
        table += _layer_norm(
            ("predictions", "transform_LayerNorm"),
            "cls.predictions.transform.LayerNorm",
            "cls/predictions/transform/LayerNorm",
            head=True,
        )
        table.append(
            Entry(
                ("predictions", "output_bias"),
                "cls.predictions.bias",
                "cls/predictions/output_bias",
                "vector",
                True,
            )
        )
        table.append(
            Entry(
                ("seq_relationship", "kernel"),
                "cls.seq_relationship.weight",
                "cls/seq_relationship/output_weights",
                "nsp",
                True,
            )
        )
        table.append(
            Entry(
                ("seq_relationship", "bias"),
                "cls.seq_relationship.bias",
                "cls/seq_relationship/output_bias",
                "vector",
                True,
            )
        )
    return table


# Each fine-tuned head kind (`task_heads.HEADS`) in transformers' BertFor<task> class: the name of
# its output layer, and whether the class keeps BertModel's pooler (the heads on the pooled [CLS]
# do; BertForQuestionAnswering and BertForTokenClassification build BertModel without it).
TASK_OUTPUTS: dict[str, tuple[str, bool]] = {
    "classification": ("classifier", True),
    "regression": ("classifier", True),
    "multiple_choice": ("classifier", True),
    "span": ("qa_outputs", False),
    "tags": ("classifier", False),
}


def task_entries(config: BertConfig, head: str) -> list[Entry]:
    """Every weight of a fine-tuned model with a `head` kind (the fine-tuning state's tree: the
    encoder under "bert", the output layer under "classifier/output") that transformers' class
    holds, with its state-dict name. No TF1 names: Google's fine-tuned checkpoints are not read."""
    name, pooled = TASK_OUTPUTS[head]
    table = [e for e in entries(config, with_heads=False) if pooled or e.path[1] != "pooler"]
    table.append(Entry(("classifier", "output", "kernel"), f"{name}.weight", "", "task_output"))
    table.append(Entry(("classifier", "output", "bias"), f"{name}.bias", "", "vector"))
    return table


def task_source_shape(entry: Entry, config: BertConfig, outputs: int) -> tuple[int, ...]:
    """The shape of a `task_entries` entry's tensor in transformers' class (`outputs`: the
    head's width, `task_heads.HeadKind.num_outputs`)."""
    if entry.path[0] != "classifier":
        return source_shape(entry, config, "hf")
    return (outputs, config.hidden_size) if entry.layout == "task_output" else (outputs,)


def expected_shape(entry: Entry, config: BertConfig) -> tuple[int, ...]:
    """The bert-jax shape of `entry`'s parameter."""
    d, h, k = config.hidden_size, config.num_attention_heads, config.head_dim
    name = entry.path
    if entry.layout == "embedding":
        rows = {
            "word_embeddings": config.padded_vocab_size,
            "position_embeddings": config.max_position_embeddings,
            "token_type_embeddings": config.type_vocab_size,
        }[name[-2]]
        return (rows, d)
    if entry.layout == "qkv":
        return (d, h, k)
    if entry.layout == "qkv_bias":
        return (h, k)
    if entry.layout == "attn_out":
        return (h, k, d)
    if entry.layout == "nsp":
        return (d, 2)
    if entry.layout == "dense":
        f = config.intermediate_size
        if name[-2] == "intermediate":
            return (d, f)
        if name[-2] == "output" and name[-3].startswith("layer_"):
            return (f, d)
        return (d, d)
    # vectors
    if name[-1] == "output_bias":
        return (config.padded_vocab_size,)
    if name[-2] == "intermediate":
        return (config.intermediate_size,)
    if name[-2] == "seq_relationship":
        return (2,)
    return (d,)


def source_name(entry: Entry, source: str) -> str:
    """The tensor's name in `source` ("hf" or "tf1")."""
    if source not in ("hf", "tf1"):
        raise ValueError(f"unknown checkpoint format {source!r}; expected 'hf' or 'tf1'")
    return entry.hf if source == "hf" else entry.tf1


def source_shape(entry: Entry, config: BertConfig, source: str) -> tuple[int, ...]:
    """The shape `entry`'s tensor must have in a `source` ("hf" or "tf1") checkpoint."""
    source_name(entry, source)  # validates `source`
    d = config.hidden_size
    shape = expected_shape(entry, config)
    if entry.layout in ("qkv", "attn_out"):
        return (d, d)
    if entry.layout == "qkv_bias":
        return (d,)
    if entry.layout == "nsp":
        return (2, d)
    if entry.layout == "dense" and source == "hf":
        return shape[::-1]
    if vocab_rows(entry):
        return (config.vocab_size, *shape[1:])
    return shape


def vocab_rows(entry: Entry) -> bool:
    """Whether `entry`'s first axis runs over the vocabulary (padded in bert-jax)."""
    return is_vocab_path(entry.path)


def is_vocab_path(path: Sequence[str]) -> bool:
    """Whether the bert-jax parameter at `path` has a row per vocabulary entry (padded)."""
    return tuple(path[-2:]) == ("word_embeddings", "embedding") or path[-1] == "output_bias"


def to_bert_jax(entry: Entry, value: np.ndarray, config: BertConfig, source: str) -> np.ndarray:
    """Converts a source array (`source` is "hf" or "tf1") into the bert-jax layout."""
    value = np.asarray(value)
    layout = entry.layout
    d, h, k = config.hidden_size, config.num_attention_heads, config.head_dim
    if layout in ("dense", "qkv", "attn_out") and source == "hf":
        value = value.T
    if layout == "qkv":
        value = value.reshape(d, h, k)
    elif layout == "qkv_bias":
        value = value.reshape(h, k)
    elif layout == "attn_out":
        value = value.reshape(h, k, d)
    elif layout in ("nsp", "task_output"):
        value = value.T
    if vocab_rows(entry):
        value = _with_rows(value, config)
    return value


def _with_rows(value: np.ndarray, config: BertConfig) -> np.ndarray:
    """A vocabulary-row array cut to `vocab_size`, then zero-padded to `padded_vocab_size`."""
    value = value[: config.vocab_size]
    padding = [(0, config.padded_vocab_size - value.shape[0])] + [(0, 0)] * (value.ndim - 1)
    return np.pad(value, padding)


def from_bert_jax(entry: Entry, value: np.ndarray, config: BertConfig, target: str) -> np.ndarray:
    """Converts a bert-jax array into the layout of `target` ("hf" or "tf1")."""
    value = np.asarray(value)
    layout = entry.layout
    d = config.hidden_size
    if vocab_rows(entry):
        value = value[: config.vocab_size]
    if layout in ("qkv", "attn_out"):
        value = value.reshape(d, d) if layout == "qkv" else value.reshape(-1, d)
    elif layout == "qkv_bias":
        value = value.reshape(d)
    elif layout in ("nsp", "task_output"):
        return value.T
    if layout in ("dense", "qkv", "attn_out") and target == "hf":
        value = value.T
    return value


def repad_vocab(params: dict, config: BertConfig) -> dict:
    """`params` (any vocabulary padding) with the vocabulary rows padded as `config` says.

    Rows past `config.vocab_size` are dropped, then zero rows appended up to
    `config.padded_vocab_size`; other leaves are passed through. For a model directory saved
    with another `vocab_pad_multiple` than the run loading it.
    """
    out = _copy_dicts(params)
    for entry in entries(config):
        if not vocab_rows(entry):
            continue
        try:
            value = np.asarray(get_path(out, entry.path))
        except KeyError:
            continue  # an encoder-only tree has no output bias
        set_path(out, entry.path, _with_rows(value, config))
    return out


def _copy_dicts(tree):
    """The nested dicts copied, the arrays in them shared."""
    if isinstance(tree, Mapping):
        return {key: _copy_dicts(value) for key, value in tree.items()}
    return tree


def get_path(tree: dict, path: Path):
    for key in path:
        tree = tree[key]
    return tree


def set_path(tree: dict, path: Path, value) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value
