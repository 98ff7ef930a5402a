"""Where dropout's randomness comes from, by name: the masks' implementations and the PRNGs a run
may draw its dropout keys with; no JAX import, so the config's declarations, fine-tuning's
settings and bench's flags check them before JAX loads (`dropout.py` draws the masks,
`trainer.py` seeds the keys)."""

# "hash": bert-jax's keyed counter hash, fused into the masked op; "prng": Flax's nn.Dropout
# (jax.random.bernoulli with the key's PRNG). `dropout.py` says how each is computed.
DROPOUT_IMPLEMENTATIONS = ("hash", "prng")

# jax.random's names: threefry2x32 (JAX's default), rbg and unsafe_rbg (XLA's RngBitGenerator).
DROPOUT_RNG_IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")
