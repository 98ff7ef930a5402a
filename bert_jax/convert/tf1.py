"""Google's original TF1 BERT checkpoints (google-research/bert) -> bert-jax params.

A checkpoint directory as Google released them: `bert_model.ckpt.{index,data-*}` (or the
`model.ckpt-N` files `run_pretraining.py` writes), `bert_config.json` and `vocab.txt`. Variables
keep their original names and layouts (kernels [in, out]; `cls/seq_relationship/output_weights`
[2, hidden]); `mapping.py` holds the names. Optimizer slots (`…/adam_m`, `…/adam_v`) and
`global_step` are skipped without being read.

The original code's "gelu" is the tanh approximation (`0.5x(1 + tanh(√(2/π)(x + 0.044715x³)))`),
so a `bert_config.json` saying "gelu" becomes hidden_act "gelu_new": the imported model computes
what the original graph computed, not Hugging Face's erf "gelu".

TensorFlow is imported only when a checkpoint is read.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from bert_jax.convert import strict
from bert_jax.convert.strict import ConversionError, ConversionReport
from bert_jax.core.model import BertConfig
from bert_jax.runtime import fs

CONFIG_NAME = "bert_config.json"
VOCAB_NAME = "vocab.txt"

# The original modeling.get_activation names -> ours.
_ACTIVATIONS = {"gelu": "gelu_new", "relu": "relu"}
# Fields of the original BertConfig (modeling.py); anything else in the file is reported, not used.
_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "max_position_embeddings",
    "type_vocab_size",
    "initializer_range",
)


def config_from_tf1(bert_config: Mapping[str, Any]) -> tuple[BertConfig, list[str]]:
    """BertConfig from Google's `bert_config.json` dict, plus notes on what was translated.

    LayerNorm epsilon is the original's 1e-12 (tf.contrib.layers.layer_norm's default).
    """
    missing = [name for name in _FIELDS[:5] if name not in bert_config]
    if missing:
        raise ConversionError(f"{CONFIG_NAME} lacks {', '.join(missing)}")
    act = bert_config.get("hidden_act", "gelu")
    if act not in _ACTIVATIONS:
        raise ConversionError(
            f"{CONFIG_NAME} has hidden_act={act!r}; the original code's activations that BERT "
            f"can use here are {sorted(_ACTIVATIONS)}"
        )
    values = {name: bert_config[name] for name in _FIELDS if name in bert_config}
    values["hidden_act"] = _ACTIVATIONS[act]
    values["layer_norm_eps"] = 1e-12
    notes = []
    if act == "gelu":
        notes.append(
            "bert_config.json hidden_act 'gelu' is the original code's tanh approximation: "
            "converted as 'gelu_new' (Hugging Face's 'gelu' would be the exact erf form)"
        )
    try:
        return BertConfig(**values), notes
    except (TypeError, ValueError) as err:
        raise ConversionError(f"{CONFIG_NAME}: {err}") from err


def find_checkpoint(path: str | os.PathLike) -> str:
    """The checkpoint prefix for `path`: a prefix itself, or a directory holding one.

    In a directory: the `checkpoint` state file's latest entry, else the only `*.index`, else the
    highest `-N` step among several. `path` may be a gs:// URL (TensorFlow reads the bucket).
    """
    path = os.fspath(path)
    if fs.is_remote(path):
        path = fs.abspath(path)
    if fs.exists(path + ".index"):
        return path
    if not fs.isdir(path):
        raise ConversionError(f"{path} is neither a checkpoint directory nor a checkpoint prefix")
    if fs.exists(os.path.join(path, "checkpoint")):
        tf = _tensorflow()
        latest = tf.train.latest_checkpoint(path)
        if latest and fs.exists(latest + ".index"):
            return latest
    prefixes = sorted(p[: -len(".index")] for p in fs.glob(os.path.join(path, "*.index")))
    if len(prefixes) == 1:
        return prefixes[0]
    if not prefixes:
        present = ", ".join(sorted(fs.listdir(path))) or "nothing"
        raise ConversionError(
            f"{path} holds no TF checkpoint (*.index; found: {present}); Google's release has "
            "bert_model.ckpt.index and bert_model.ckpt.data-00000-of-00001"
        )
    steps = [re.search(r"-(\d+)$", p) for p in prefixes]
    if all(steps):
        return max(zip(steps, prefixes), key=lambda sp: int(sp[0].group(1)))[1]
    names = ", ".join(os.path.basename(p) for p in prefixes)
    raise ConversionError(f"{path} holds several checkpoints ({names}); pass one prefix")


def _tensorflow():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import tensorflow as tf
    except ImportError as err:
        raise ConversionError(
            "reading a TF1 checkpoint needs TensorFlow (pip install tensorflow-cpu)"
        ) from err
    return tf


@dataclasses.dataclass
class TF1Checkpoint:
    """A Google BERT checkpoint, opened: config, tensor shapes, and a reader per tensor."""

    path: str
    prefix: str
    config: BertConfig
    notes: list[str]
    shapes: dict[str, tuple[int, ...]]
    read: Callable[[str], np.ndarray]
    vocab_file: str | None


def read_tf1_dir(path: str | os.PathLike) -> TF1Checkpoint:
    """Opens a checkpoint (directory or prefix) with bert_config.json beside it."""
    prefix = find_checkpoint(path)
    directory = os.fspath(path) if fs.isdir(path) else os.path.dirname(prefix)
    config_path = os.path.join(directory, CONFIG_NAME)
    if not fs.exists(config_path):
        raise ConversionError(f"{directory} has no {CONFIG_NAME} (Google's model config)")
    with fs.open(config_path, encoding="utf-8") as f:
        config, notes = config_from_tf1(json.load(f))
    tf = _tensorflow()
    try:
        reader = tf.train.load_checkpoint(prefix)
        shapes = {
            name: tuple(int(n) for n in shape)
            for name, shape in reader.get_variable_to_shape_map().items()
        }
    except Exception as err:  # tf.errors.* for unreadable or truncated index files
        raise ConversionError(f"cannot read the TF checkpoint {prefix}: {err}") from err

    def read(name: str) -> np.ndarray:
        try:
            return np.asarray(reader.get_tensor(name))
        except Exception as err:  # DataLossError, OutOfRangeError on truncated data files
            raise ConversionError(
                f"tensor {name!r} cannot be read from {prefix} (truncated or corrupt data "
                f"file?): {type(err).__name__}: {err}"
            ) from err

    vocab = os.path.join(directory, VOCAB_NAME)
    return TF1Checkpoint(
        os.fspath(path),
        prefix,
        config,
        notes,
        shapes,
        read,
        vocab if fs.exists(vocab) else None,
    )


def _ignore_rule(drop_heads: bool) -> Callable[[str], str | None]:
    def ignore(name: str) -> str | None:
        if name == "global_step":
            return "global_step (training step counter)"
        if name.endswith("/adam_m") or name.endswith("/adam_v"):
            return "optimizer slot (adam_m/adam_v)"
        if name.startswith("_CHECKPOINTABLE_OBJECT_GRAPH"):
            return "object-graph metadata, not a weight"
        if drop_heads and not name.startswith("bert/"):
            return "head dropped on request (encoder-only output)"
        return None

    return ignore


def params_from_tf1(
    checkpoint: TF1Checkpoint,
    *,
    drop_heads: bool = False,
    report: ConversionReport | None = None,
) -> dict[str, Any]:
    """bert-jax params from an opened TF1 checkpoint (strict; see `strict.import_params`).

    The MLM/NSP heads (`cls/…`) are converted when present, unless `drop_heads`.
    """
    kept = [name for name in checkpoint.shapes if _ignore_rule(False)(name) is None]
    present_heads = any(name.startswith("cls/") for name in kept)
    # Heads of any kind: cls/* for pretraining, output_weights/output_bias from run_classifier.
    foreign = any(not name.startswith("bert/") for name in kept)
    with_heads = present_heads and not drop_heads
    try:
        params = strict.import_params(
            checkpoint.shapes,
            checkpoint.read,
            checkpoint.config,
            "tf1",
            with_heads=with_heads,
            ignore=_ignore_rule(drop_heads),
            report=report,
            origin=f"TF1 checkpoint {checkpoint.prefix}",
        )
    except ConversionError as err:
        config, shapes = checkpoint.config, checkpoint.shapes
        if foreign and not drop_heads and strict.encoder_matches(shapes, config, "tf1"):
            raise ConversionError(f"{err}\n{strict.DROP_HEADS_HINT}") from None
        raise
    if report is not None:
        report.notes += checkpoint.notes
        if not with_heads:
            report.notes.append(
                "the checkpoint's MLM/NSP heads were dropped"
                if present_heads
                else "encoder-only checkpoint: no MLM/NSP pretraining heads (cls/*) to convert"
            )
    return params
