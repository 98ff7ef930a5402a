"""bert-jax: BERT pretraining (Devlin et al., 2018) in JAX/Flax."""

__version__ = "0.1.0"
