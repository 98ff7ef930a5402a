"""`--config configs/paper/table8.py:ROW`, the same as `--config paper/table8:ROW` (the
definition ships with the package: bert_jax/configs/paper/table8.py)."""

from bert_jax.configs.paper.table8 import get_config

__all__ = ["get_config"]
