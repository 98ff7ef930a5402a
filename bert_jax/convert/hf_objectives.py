"""Which Hugging Face class a pretraining objective is, both ways.

- "mlm+nsp" <-> ``BertForPreTraining`` (pooler, MLM head, NSP head);
- "mlm"     <-> ``BertForMaskedLM`` (no pooler, MLM head);
- "ltr"     <-> ``BertLMHeadModel`` with ``is_decoder=True`` (no pooler, the same MLM head as a
  next-token head, causal attention).

bert-jax keeps one parameter tree for every objective (the pooler and NSP head exist, unused in
pretraining without NSP), so an export to the last two classes leaves ``bert.pooler.*`` and
``cls.seq_relationship.*`` out, and an import of them initialises those two fresh (normal with
the config's ``initializer_range``, zero bias, from a fixed seed), as transformers does when it
loads such a checkpoint into a class with a pooler.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

HF_CLASSES = {"mlm+nsp": "BertForPreTraining", "mlm": "BertForMaskedLM", "ltr": "BertLMHeadModel"}
# Tensors of BertForPreTraining that the classes without NSP do not have.
NSP_ONLY_PREFIXES = ("bert.pooler.", "cls.seq_relationship.")


def objective_from_hf(hf_config: Mapping[str, Any]) -> str:
    """The objective of a Hugging Face config.json: its is_decoder flag, else its class."""
    if hf_config.get("is_decoder"):
        return "ltr"
    architectures = hf_config.get("architectures") or []
    if "BertLMHeadModel" in architectures:
        return "ltr"
    if "BertForMaskedLM" in architectures:
        return "mlm"
    return "mlm+nsp"


def hf_config_fields(objective: str, with_heads: bool) -> dict[str, Any]:
    """The config.json fields that name the class (and the causal mask) of `objective`."""
    if not with_heads:
        return {"architectures": ["BertModel"], "is_decoder": objective == "ltr"}
    return {"architectures": [HF_CLASSES[objective]], "is_decoder": objective == "ltr"}


def drop_nsp_only(state: dict[str, np.ndarray], objective: str) -> dict[str, np.ndarray]:
    """The export's tensors for `objective`: without pooler and NSP head unless it has NSP."""
    if objective == "mlm+nsp":
        return state
    return {k: v for k, v in state.items() if not k.startswith(NSP_ONLY_PREFIXES)}


def fill_nsp_only(
    shapes: Mapping[str, Any],
    read: Callable[[str], np.ndarray],
    hidden_size: int,
    initializer_range: float,
) -> tuple[dict[str, Any], Callable[[str], np.ndarray], list[str]]:
    """(shapes, read, names filled): a checkpoint with an MLM head but no NSP head and no pooler
    (BertForMaskedLM / BertLMHeadModel) completed with fresh ones (module docstring)."""
    shapes = dict(shapes)
    if "cls.seq_relationship.weight" in shapes or "cls.predictions.bias" not in shapes:
        return shapes, read, []
    rng = np.random.default_rng(0)
    fresh = {}
    for name, shape in (
        ("bert.pooler.dense.weight", (hidden_size, hidden_size)),
        ("bert.pooler.dense.bias", (hidden_size,)),
        ("cls.seq_relationship.weight", (2, hidden_size)),
        ("cls.seq_relationship.bias", (2,)),
    ):
        if name in shapes:
            continue
        if name.endswith("weight"):
            fresh[name] = rng.normal(0.0, initializer_range, shape).astype(np.float32)
        else:
            fresh[name] = np.zeros(shape, np.float32)
        shapes[name] = shape

    def read_filled(name: str) -> np.ndarray:
        return fresh[name] if name in fresh else read(name)

    return shapes, read_filled, sorted(fresh)
