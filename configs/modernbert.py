"""ModernBERT pretraining configs, one per size: `--config configs/modernbert.py:SIZE`, the same
as `--config modernbert:SIZE` (the definition ships with the package:
bert_jax/configs/modernbert.py)."""

from bert_jax.configs.modernbert import get_config

__all__ = ["get_config"]
