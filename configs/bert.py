"""BERT pretraining configs, one per size: `--config configs/bert.py:SIZE`, the same as
`--config bert:SIZE` (the definition ships with the package: bert_jax/configs/bert.py)."""

from bert_jax.configs.bert import get_config

__all__ = ["get_config"]
