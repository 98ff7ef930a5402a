"""`--config configs/paper/table6.py:ROW`, the same as `--config paper/table6:ROW` (the
definition ships with the package: bert_jax/configs/paper/table6.py)."""

from bert_jax.configs.paper.table6 import get_config

__all__ = ["get_config"]
