"""`--config configs/paper/table5_no_nsp.py`, the same as `--config paper/table5_no_nsp` (the
definition ships with the package: bert_jax/configs/paper/table5_no_nsp.py)."""

from bert_jax.configs.paper.table5_no_nsp import get_config

__all__ = ["get_config"]
