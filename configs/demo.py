"""`make demo`'s config: `--config configs/demo.py`, the same as `--config demo` (the definition
ships with the package: bert_jax/configs/demo.py)."""

from bert_jax.configs.demo import get_config

__all__ = ["get_config"]
