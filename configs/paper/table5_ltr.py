"""`--config configs/paper/table5_ltr.py`, the same as `--config paper/table5_ltr` (the
definition ships with the package: bert_jax/configs/paper/table5_ltr.py)."""

from bert_jax.configs.paper.table5_ltr import get_config

__all__ = ["get_config"]
