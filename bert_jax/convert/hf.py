"""Hugging Face BERT <-> bert-jax params, through the one name table in `mapping.py`.

Conversion is strict: every bert-jax parameter must be filled with the right shape and every source
tensor must be used exactly once (tied copies and buffers aside); anything else raises
`ConversionError` naming the tensor.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from bert_jax.convert import mapping
from bert_jax.model import BertConfig

# Keys that Hugging Face state dicts may carry that hold no weights of their own: the decoder is
# tied to the word embeddings (and its bias to cls.predictions.bias); position_ids is a buffer.
_TIED_OR_BUFFERS = (
    "cls.predictions.decoder.weight",
    "cls.predictions.decoder.bias",
    "bert.embeddings.position_ids",
)


class ConversionError(ValueError):
    """A checkpoint does not match the model it is converted to; the message names the tensor."""


def config_from_hf(hf_config: Mapping[str, Any], **overrides: Any) -> BertConfig:
    """BertConfig from a Hugging Face `config.json` dict (HF's "gelu" is exact erf, as ours)."""
    if hf_config.get("model_type", "bert") != "bert":
        raise ConversionError(f"config.json has model_type={hf_config['model_type']!r}, not 'bert'")
    if hf_config.get("position_embedding_type", "absolute") != "absolute":
        raise ConversionError(
            "config.json has position_embedding_type="
            f"{hf_config['position_embedding_type']!r}; only 'absolute' (BERT's) is supported"
        )
    return BertConfig.from_dict({**hf_config, **overrides})


def hf_config_from(config: BertConfig) -> dict[str, Any]:
    """A Hugging Face `config.json` dict for `config`."""
    return {
        "architectures": ["BertForPreTraining"],
        "model_type": "bert",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "intermediate_size": config.intermediate_size,
        "hidden_act": config.hidden_act,
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


def strip_prefix(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """Accepts BertModel-style keys ("embeddings.…") as well as BertForPreTraining ("bert.…")."""
    if any(key.startswith("bert.") for key in state_dict):
        return dict(state_dict)
    return {
        (key if key.startswith("cls.") else f"bert.{key}"): value
        for key, value in state_dict.items()
    }


def has_pretraining_heads(state_dict: Mapping[str, Any]) -> bool:
    return any(key.startswith("cls.") for key in strip_prefix(state_dict))


def params_from_hf(
    state_dict: Mapping[str, Any], config: BertConfig, with_heads: bool | None = None
) -> dict[str, Any]:
    """bert-jax params (nested dict of NumPy arrays) from a Hugging Face state dict.

    `with_heads=None` converts the MLM/NSP heads when the checkpoint has them (encoder-only
    checkpoints such as sentence-transformers models have none).
    """
    state_dict = strip_prefix(state_dict)
    if with_heads is None:
        with_heads = has_pretraining_heads(state_dict)
    params: dict[str, Any] = {}
    used: set[str] = set()
    for entry in mapping.entries(config, with_heads=with_heads):
        if entry.hf not in state_dict:
            raise ConversionError(
                f"missing tensor {entry.hf!r} (for bert-jax {'/'.join(entry.path)})"
            )
        value = to_numpy(state_dict[entry.hf])
        converted = (
            mapping.to_bert_jax(entry, value, config, "hf") if _fits(entry, value, config) else None
        )
        want = mapping.expected_shape(entry, config)
        if converted is None or converted.shape != want:
            raise ConversionError(
                f"tensor {entry.hf!r} has shape {tuple(value.shape)}, which does not fit bert-jax "
                f"{'/'.join(entry.path)} {want} for this config"
            )
        mapping.set_path(params, entry.path, converted.astype(np.float32))
        used.add(entry.hf)
    unused = sorted(set(state_dict) - used - set(_TIED_OR_BUFFERS))
    if unused:
        raise ConversionError(f"{len(unused)} tensors were not used, first: {unused[:5]}")
    return params


def hf_state_dict_from(params: Mapping[str, Any], config: BertConfig) -> dict[str, np.ndarray]:
    """A Hugging Face BertForPreTraining state dict (NumPy, float32) from bert-jax params."""
    with_heads = "predictions" in params
    out: dict[str, np.ndarray] = {}
    for entry in mapping.entries(config, with_heads=with_heads):
        value = np.asarray(mapping.get_path(params, entry.path), dtype=np.float32)
        out[entry.hf] = np.ascontiguousarray(mapping.from_bert_jax(entry, value, config, "hf"))
    return out


def to_numpy(value: Any) -> np.ndarray:
    """A torch tensor, NumPy array or array-like as a float32 NumPy array."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().float().numpy()
    return np.asarray(value, dtype=np.float32)


def _fits(entry: mapping.Entry, value: np.ndarray, config: BertConfig) -> bool:
    """Whether `value` has the element count the layout change needs (so reshape cannot fail)."""
    return value.size == int(np.prod(mapping.expected_shape(entry, config)))
