"""Hugging Face BERT <-> bert-jax params, through the one name table in `mapping.py`.

Conversion is strict: every bert-jax parameter must be filled with the right shape and every source
tensor must be used exactly once (tied copies and buffers aside, after checking that the copies
really are copies); anything else raises `ConversionError` naming the tensor.

Reading a Hugging Face directory needs neither `transformers` nor `safetensors`: the safetensors
format is read and written with NumPy (`convert/safetensors.py`). `pytorch_model.bin` files are read
with `torch.load(weights_only=True)`, which refuses to unpickle anything but tensors and plain
containers.

Why this file is long: the strict import (every tensor used once, tied copies checked) and the
directory's files (configs, weights, tokenizer) both follow the one Hugging Face layout; apart,
each would restate what the other reads or writes.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from bert_jax.convert import hf_objectives, hf_tokenizer, mapping, strict
from bert_jax.convert.safetensors import read_safetensors, write_safetensors
from bert_jax.convert.strict import ConversionError, ConversionReport
from bert_jax.core.model import BertConfig
from bert_jax.data.tokenizers.hf_bpe import TOKENIZER_JSON
from bert_jax.data.tokenizers.interface import CONFIG_NAME, SPM_NAME, VOCAB_NAME
from bert_jax.runtime import fs
from bert_jax.runtime.outputs import OutputKind

__all__ = [
    "ConversionError",
    "config_from_hf",
    "hf_config_from",
    "params_from_hf",
    "hf_state_dict_from",
    "read_hf_dir",
    "write_hf_dir",
    "read_safetensors",
    "write_safetensors",
]

SAFETENSORS_NAME = "model.safetensors"
# Every file `write_hf_dir` may write (the tokenizer's depend on its kind): what an export holds,
# and so what `convert --overwrite` may replace (between_formats.py reads it).
HF_DIR_FILES = (
    "config.json",
    SAFETENSORS_NAME,
    VOCAB_NAME,  # WordPiece
    SPM_NAME,  # SentencePiece
    CONFIG_NAME,  # either: what load_tokenizer reads
    TOKENIZER_JSON,  # either: what transformers' tokenizers backend reads
    "tokenizer_config.json",
    "special_tokens_map.json",
)
PYTORCH_NAME = "pytorch_model.bin"
# Written into every Hugging Face export (either family's): the mark that lets `--overwrite`
# replace it later.
HF_EXPORT_MARKER = "bert_jax_export.json"
HF_EXPORT_KIND = OutputKind(
    name="Hugging Face export",
    marker=HF_EXPORT_MARKER,
    is_own=lambda path: fs.isfile(os.path.join(path, HF_EXPORT_MARKER)),
    holds=lambda name: name in (*HF_DIR_FILES, HF_EXPORT_MARKER),
    marker_file=HF_EXPORT_MARKER,
)

# Keys a Hugging Face state dict may carry that hold no weights of their own: the decoder is tied
# to the word embeddings (and its bias to cls.predictions.bias); the rest are buffers.
_TIED = {
    "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
    "cls.predictions.decoder.bias": "cls.predictions.bias",
}
_BUFFERS = ("bert.embeddings.position_ids", "bert.embeddings.token_type_ids")

# Hugging Face activation names that compute what one of ours computes.
_HF_ACTIVATION_ALIASES = {"gelu_pytorch_tanh": "gelu_new", "gelu_fast": "gelu_new"}


# ----------------------------------------------------------------------------------------------
# Configs.
# ----------------------------------------------------------------------------------------------


def config_from_hf(hf_config: Mapping[str, Any], **overrides: Any) -> BertConfig:
    """BertConfig from a Hugging Face `config.json` dict (HF's "gelu" is exact erf, as ours)."""
    if hf_config.get("model_type", "bert") != "bert":
        raise ConversionError(f"config.json has model_type={hf_config['model_type']!r}, not 'bert'")
    if hf_config.get("position_embedding_type", "absolute") != "absolute":
        raise ConversionError(
            "config.json has position_embedding_type="
            f"{hf_config['position_embedding_type']!r}; only 'absolute' (BERT's) is supported"
        )
    if hf_config.get("add_cross_attention"):
        raise ConversionError(
            "config.json describes a BERT decoder with cross-attention; not supported"
        )
    values = dict(hf_config)
    values["objective"] = hf_objectives.objective_from_hf(hf_config)  # is_decoder: causal
    act = values.get("hidden_act", "gelu")
    values["hidden_act"] = _HF_ACTIVATION_ALIASES.get(act, act)
    try:
        return BertConfig.from_dict({**values, **overrides})
    except (TypeError, ValueError) as err:
        raise ConversionError(f"config.json: {err}") from err


def hf_config_from(config: BertConfig, with_heads: bool = True) -> dict[str, Any]:
    """A Hugging Face `config.json` dict for `config` (BertForPreTraining, or BertModel)."""
    act = "gelu_new" if config.hidden_act == "gelu_tanh" else config.hidden_act
    return {
        # The objective's class (hf_objectives): BertForPreTraining, BertForMaskedLM or
        # BertLMHeadModel with is_decoder (causal attention).
        **hf_objectives.hf_config_fields(config.objective, with_heads),
        "model_type": "bert",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "intermediate_size": config.intermediate_size,
        "hidden_act": act,
        "hidden_dropout_prob": config.hidden_dropout_prob,
        "attention_probs_dropout_prob": config.attention_probs_dropout_prob,
        "max_position_embeddings": config.max_position_embeddings,
        "type_vocab_size": config.type_vocab_size,
        "initializer_range": config.initializer_range,
        "layer_norm_eps": config.layer_norm_eps,
        "pad_token_id": config.pad_token_id,
        "position_embedding_type": "absolute",
        "tie_word_embeddings": True,
    }


# ----------------------------------------------------------------------------------------------
# State dicts.
# ----------------------------------------------------------------------------------------------


def _normalize_key(key: str) -> str:
    """Old checkpoints (converted from TF before transformers 2) name LayerNorm gamma/beta."""
    if ".LayerNorm." in key:
        if key.endswith(".gamma"):
            return key[: -len("gamma")] + "weight"
        if key.endswith(".beta"):
            return key[: -len("beta")] + "bias"
    return key


def strip_prefix(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """Canonical BertForPreTraining keys: BertModel-style keys ("embeddings.…") get "bert.",
    old LayerNorm names (gamma/beta) become weight/bias."""
    names = [_normalize_key(key) for key in state_dict]
    prefixed = any(name.startswith("bert.") for name in names)
    out = {}
    for key, name in zip(state_dict, names):
        if not prefixed and not name.startswith(("cls.", "bert.")):
            name = f"bert.{name}"
        if name in out:
            raise ConversionError(f"tensor {key!r} appears twice (as {name!r})")
        out[name] = state_dict[key]
    return out


def has_pretraining_heads(state_dict: Mapping[str, Any]) -> bool:
    return any(key.startswith("cls.") for key in strip_prefix(state_dict))


def _ignore_rule(drop_heads: bool) -> Callable[[str], str | None]:
    def ignore(name: str) -> str | None:
        if name in _BUFFERS:
            return "buffer, not a weight"
        if name in _TIED:
            return f"tied copy of {_TIED[name]}"
        if drop_heads and not name.startswith("bert."):
            return "head dropped on request (encoder-only output)"
        return None

    return ignore


def _check_tied_copies(shapes: Mapping[str, Any], read: Callable[[str], np.ndarray]) -> None:
    """A decoder that is not an exact copy of what bert-jax ties it to would be lost silently."""
    for copy, original in _TIED.items():
        if copy in shapes and original in shapes:
            if tuple(shapes[copy]) != tuple(shapes[original]) or not np.array_equal(
                to_numpy(read(copy)), to_numpy(read(original))
            ):
                raise ConversionError(
                    f"tensor {copy!r} differs from {original!r}: the checkpoint has an untied "
                    "MLM decoder, but bert-jax ties it to the word embeddings (as BERT does)"
                )


def import_state(
    shapes: Mapping[str, Any],
    read: Callable[[str], np.ndarray],
    config: BertConfig,
    *,
    with_heads: bool | None = None,
    drop_heads: bool = False,
    report: ConversionReport | None = None,
    origin: str = "Hugging Face checkpoint",
) -> dict[str, Any]:
    """`params_from_hf` over lazily read tensors (canonical keys: see `strip_prefix`)."""
    present_heads = any(name.startswith("cls.") for name in shapes)
    # Heads of any kind (cls.* for pretraining, classifier.* / qa_outputs.* for fine-tuning).
    foreign = any(
        not name.startswith("bert.") and _ignore_rule(False)(name) is None for name in shapes
    )
    if with_heads is None:
        with_heads = present_heads and not drop_heads
    if with_heads and drop_heads:
        raise ValueError("with_heads=True and drop_heads=True contradict each other")
    if with_heads:
        _check_tied_copies(shapes, read)
        # BertForMaskedLM / BertLMHeadModel: no pooler, no NSP head; those start fresh.
        shapes, read, filled = hf_objectives.fill_nsp_only(
            shapes, read, config.hidden_size, config.initializer_range
        )
        if filled and report is not None:
            report.notes.append(f"no pooler/NSP head in the checkpoint: {', '.join(filled)} fresh")
    try:
        params = strict.import_params(
            shapes,
            read,
            config,
            "hf",
            with_heads=with_heads,
            ignore=_ignore_rule(drop_heads),
            report=report,
            origin=origin,
        )
    except ConversionError as err:
        if foreign and not drop_heads and strict.encoder_matches(shapes, config, "hf"):
            raise ConversionError(f"{err}\n{strict.DROP_HEADS_HINT}") from None
        raise
    if report is not None and not with_heads:
        report.notes.append(
            "the checkpoint's MLM/NSP heads were dropped"
            if present_heads
            else "encoder-only checkpoint: no MLM/NSP pretraining heads (cls.*) to convert"
        )
    return params


def params_from_hf(
    state_dict: Mapping[str, Any],
    config: BertConfig,
    with_heads: bool | None = None,
    *,
    drop_heads: bool = False,
    report: ConversionReport | None = None,
) -> dict[str, Any]:
    """bert-jax params (nested dict of NumPy arrays) from a Hugging Face state dict.

    `with_heads=None` converts the MLM/NSP heads when the checkpoint has them (encoder-only
    checkpoints such as sentence-transformers models have none); `drop_heads=True` converts the
    encoder alone from a checkpoint with heads (or task heads such as `classifier.*`).
    """
    state_dict = strip_prefix(state_dict)
    shapes = {name: tuple(value.shape) for name, value in state_dict.items()}
    return import_state(
        shapes,
        lambda name: to_numpy(state_dict[name]),
        config,
        with_heads=with_heads,
        drop_heads=drop_heads,
        report=report,
    )


def hf_state_dict_from(
    params: Mapping[str, Any], config: BertConfig, *, base_model_keys: bool = False
) -> dict[str, np.ndarray]:
    """A Hugging Face state dict (NumPy, float32) from bert-jax params.

    Keys are BertForPreTraining's ("bert.…", "cls.…"); with `base_model_keys=True` (encoder-only
    params) they are BertModel's, without the "bert." prefix.
    """
    with_heads = "predictions" in params
    if with_heads and base_model_keys:
        raise ValueError("base_model_keys=True needs encoder-only params (no heads)")
    out: dict[str, np.ndarray] = {}
    for entry in mapping.entries(config, with_heads=with_heads):
        value = np.asarray(mapping.get_path(params, entry.path), dtype=np.float32)
        key = entry.hf[len("bert.") :] if base_model_keys else entry.hf
        out[key] = np.ascontiguousarray(mapping.from_bert_jax(entry, value, config, "hf"))
    return hf_objectives.drop_nsp_only(out, config.objective) if with_heads else out


def to_numpy(value: Any) -> np.ndarray:
    """A torch tensor, NumPy array or array-like as a float32 NumPy array."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().float().numpy()
    return np.asarray(value, dtype=np.float32)


# ----------------------------------------------------------------------------------------------
# Directories.
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class HFCheckpoint:
    """A Hugging Face BERT directory, opened: its config and lazily readable tensors."""

    path: str
    config: dict[str, Any]
    weight_files: list[str]
    shapes: dict[str, tuple[int, ...]]  # canonical (BertForPreTraining) names
    read: Callable[[str], np.ndarray]


def load_torch_bin(path: str) -> dict[str, Any]:
    """A pytorch_model.bin's state dict (tensors only: `torch.load(weights_only=True)`), or a
    ConversionError naming the file."""
    try:
        import torch
    except ImportError as err:
        raise ConversionError(
            f"reading {path} needs PyTorch (pip install torch); or convert from a directory "
            "holding model.safetensors"
        ) from err
    try:
        if fs.is_remote(path):  # the bucket's object, read through a seekable file object
            with fs.open(path, "rb") as f:
                loaded = torch.load(f, map_location="cpu", weights_only=True)
        else:
            loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # UnpicklingError, RuntimeError (truncated zip), ...
        raise ConversionError(
            f"{path} could not be loaded with torch.load(weights_only=True), which only accepts "
            f"tensors and plain containers (arbitrary pickled objects are refused): {err}"
        ) from err
    if isinstance(loaded, Mapping) and "state_dict" in loaded and len(loaded) <= 3:
        loaded = loaded["state_dict"]
    if not isinstance(loaded, Mapping):
        raise ConversionError(f"{path} holds a {type(loaded).__name__}, not a state dict")
    bad = [key for key, value in loaded.items() if not hasattr(value, "detach")]
    if bad:
        raise ConversionError(f"{path}: entry {bad[0]!r} is not a tensor")
    return dict(loaded)


def weight_files(path: str) -> list[str]:
    """A transformers directory's weight files: model.safetensors, else pytorch_model.bin, each
    whole or sharded by its index.json (every family's reader starts here)."""
    for single, index in (
        (SAFETENSORS_NAME, f"{SAFETENSORS_NAME}.index.json"),
        (PYTORCH_NAME, f"{PYTORCH_NAME}.index.json"),
    ):
        if fs.exists(os.path.join(path, single)):
            return [os.path.join(path, single)]
        index_path = os.path.join(path, index)
        if fs.exists(index_path):
            with fs.open(index_path, encoding="utf-8") as f:
                weight_map = json.load(f).get("weight_map", {})
            files = sorted(set(weight_map.values()))
            if not files:
                raise ConversionError(f"{index_path} lists no weight files")
            missing = [name for name in files if not fs.exists(os.path.join(path, name))]
            if missing:
                raise ConversionError(f"{index_path} lists {missing[0]}, which is missing")
            return [os.path.join(path, name) for name in files]
    present = ", ".join(sorted(fs.listdir(path))) or "nothing"
    raise ConversionError(
        f"{path} holds no {SAFETENSORS_NAME} or {PYTORCH_NAME} (found: {present}); only PyTorch "
        "weights in those files are read"
    )


def read_hf_dir(path: str | os.PathLike) -> HFCheckpoint:
    """Opens a Hugging Face BERT directory: config.json plus model.safetensors or
    pytorch_model.bin (single or sharded with an index)."""
    path = os.fspath(path)
    if not fs.isdir(path):
        raise ConversionError(f"{path} is not a directory (expected a Hugging Face model dir)")
    config_path = os.path.join(path, "config.json")
    if not fs.exists(config_path):
        raise ConversionError(f"{path} has no config.json")
    with fs.open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    files = weight_files(path)
    shapes: dict[str, tuple[int, ...]] = {}
    readers: dict[str, Callable[[], np.ndarray]] = {}
    for file in files:
        if file.endswith(".safetensors"):
            st = read_safetensors(file)
            file_shapes = st.shapes
            read_one: Callable[[str], np.ndarray] = st.read
        else:
            state = load_torch_bin(file)
            file_shapes = {key: tuple(value.shape) for key, value in state.items()}
            read_one = lambda key, state=state: to_numpy(state[key])  # noqa: E731
        # strip_prefix keeps the order of its input, so canonical names pair up with keys.
        for canonical, key in zip(strip_prefix(file_shapes), file_shapes):
            if canonical in shapes:
                raise ConversionError(f"tensor {key!r} appears in more than one weight file")
            shapes[canonical] = file_shapes[key]
            readers[canonical] = lambda read_one=read_one, key=key: read_one(key)
    return HFCheckpoint(path, config, files, shapes, lambda name: readers[name]())


def write_hf_dir(
    path: str | os.PathLike,
    config: BertConfig,
    params: Mapping[str, Any],
    tokenizer: Any = None,
) -> list[str]:
    """Writes config.json, model.safetensors and the tokenizer files into the existing directory
    `path`. Returns the names written.

    Params with heads become the objective's class (BertForPreTraining, BertForMaskedLM or
    BertLMHeadModel, hf_objectives); encoder-only params a BertModel one
    (keys without the "bert." prefix). Tied copies are not written: transformers re-ties them.
    """
    path = os.fspath(path)
    with_heads = "predictions" in params
    state = hf_state_dict_from(params, config, base_model_keys=not with_heads)
    written = ["config.json", SAFETENSORS_NAME]
    with fs.open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
        json.dump(hf_config_from(config, with_heads=with_heads), f, indent=2, sort_keys=True)
        f.write("\n")
    write_safetensors(os.path.join(path, SAFETENSORS_NAME), state, {"format": "pt"})
    if tokenizer is not None:
        written += hf_tokenizer.write_hf_tokenizer(path, tokenizer, config.max_position_embeddings)
    return written
