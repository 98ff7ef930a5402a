"""The PRNG implementations a run may draw its dropout keys with, by name; no JAX import, so
the config's declarations and bench's flags check them before JAX loads (`trainer.py` seeds
them)."""

# jax.random's names: threefry2x32 (JAX's default), rbg and unsafe_rbg (XLA's RngBitGenerator).
DROPOUT_RNG_IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")
